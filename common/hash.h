#ifndef WSYNC_COMMON_HASH_H_
#define WSYNC_COMMON_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace wsync {

// xxh3-64 of a byte range. Stable across processes, runs and machines (xxHash's canonical output).
uint64_t Xxh3(const void* data, size_t bytes, uint64_t seed = 0);

// Lower-case, zero-padded 16-digit hex of a 64-bit digest.
std::string DigestHex(uint64_t digest);

// Streaming xxh3-64 over a canonical encoding: integers are fed as little-endian 8-byte values and
// strings as (length, bytes), so two different sequences of calls cannot produce the same byte
// stream. Not thread-safe; copyable is not needed, so it is move-only.
class CanonicalHasher {
 public:
  explicit CanonicalHasher(uint64_t seed = 0);
  ~CanonicalHasher();
  CanonicalHasher(const CanonicalHasher&) = delete;
  CanonicalHasher& operator=(const CanonicalHasher&) = delete;

  void AddInt(int64_t value);
  void AddString(absl::string_view value);
  void AddBytes(const void* data, size_t bytes);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t*, owned.
};

}  // namespace wsync

#endif  // WSYNC_COMMON_HASH_H_
