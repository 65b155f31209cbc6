// libFuzzer target: the control-frame parser (transport/control/framing.h DecodeFrameBody) on
// arbitrary bytes, as an unauthenticated peer could send them; what parses re-encodes within the
// cap. Any crash, sanitizer report, leak or timeout is a bug.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "transport/control/framing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<wsync::control::Frame> frame = wsync::DecodeFrameBody(body);
  if (!frame.ok()) return 0;
  absl::StatusOr<std::string> encoded = wsync::EncodeFrame(*frame, wsync::kDefaultMaxFrameBytes);
  (void)encoded;
  return 0;
}
