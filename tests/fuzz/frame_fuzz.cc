// libFuzzer target: the control-frame parser (control/framing.h DecodeFrameBody) on
// arbitrary bytes, as an unauthenticated peer could send them; what parses re-encodes within the
// cap. The same bytes as a sealed frame (the last kFrameTagBytes its tag) never open under a key
// the input does not know (frame_seal.h). Any crash, sanitizer report, leak or timeout is a bug.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "control/frame_seal.h"
#include "control/framing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.size() >= static_cast<size_t>(wsync::kFrameTagBytes)) {
    const size_t body = bytes.size() - static_cast<size_t>(wsync::kFrameTagBytes);
    wsync::FrameOpener opener(std::string(32, 'k'), "the fuzzer");
    if (opener.Open(bytes.substr(0, body), bytes.substr(body)).ok()) std::abort();  // A forgery.
  }
  absl::StatusOr<wsync::control::Frame> frame = wsync::DecodeFrameBody(bytes);
  if (!frame.ok()) return 0;
  absl::StatusOr<std::string> encoded = wsync::EncodeFrame(*frame, wsync::kDefaultMaxFrameBytes);
  (void)encoded;
  return 0;
}
