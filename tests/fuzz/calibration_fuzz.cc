// libFuzzer target: the calibration loader (cost/link_model.h ParseCalibration,
// then FitLinks over whatever it accepted) on arbitrary bytes, as a corrupt or hostile
// calibration file could hold them. Any crash, sanitizer report, leak or timeout is a bug.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "cost/link_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<wsync::proto::Calibration> calibration = wsync::ParseCalibration(bytes);
  if (!calibration.ok()) return 0;
  (void)wsync::FitLinks(*calibration);
  return 0;
}
