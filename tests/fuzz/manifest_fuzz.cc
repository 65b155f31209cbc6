// libFuzzer target: the manifest decoder and validator (planner/manifest_codec.h ParseLayout,
// planner/validate.h ValidateLayout) on arbitrary bytes, as a hostile peer could send them. Any
// crash, sanitizer report, leak or timeout is a bug; errors are the expected answer.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "planner/manifest_codec.h"
#include "planner/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Small limits keep each input cheap while still exercising every bound.
  wsync::ManifestLimits limits;
  limits.max_processes = 64;
  limits.max_buffers = 1024;
  limits.max_parameters = 1024;
  limits.max_pieces = 4096;
  limits.max_name_length = 256;
  for (const wsync::ManifestLimits& l : {limits, wsync::ManifestLimits{}}) {
    absl::StatusOr<wsync::Layout> layout = wsync::ParseLayout(bytes, l);
    if (!layout.ok()) continue;
    (void)wsync::ValidateLayout(*layout);
    // Round trip: what was accepted re-encodes and decodes again.
    absl::StatusOr<wsync::Layout> again = wsync::ParseLayout(wsync::SerializeLayout(*layout), l);
    if (!again.ok()) __builtin_trap();
  }
  return 0;
}
