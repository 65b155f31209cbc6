#ifndef WSYNC_COMMON_MEMORY_KIND_H_
#define WSYNC_COMMON_MEMORY_KIND_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace wsync {

// Where a buffer lives. The numeric values are written into manifests and digests.
enum class MemoryKind : uint8_t { kHost = 1, kCuda = 2 };

// "host", "cuda", or "invalid" for a value outside the enum.
inline absl::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
  }
  return "invalid";
}

}  // namespace wsync

#endif  // WSYNC_COMMON_MEMORY_KIND_H_
