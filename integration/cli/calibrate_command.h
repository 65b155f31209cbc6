#ifndef WSYNC_INTEGRATION_CLI_CALIBRATE_COMMAND_H_
#define WSYNC_INTEGRATION_CLI_CALIBRATE_COMMAND_H_

// `wsync calibrate`: writes or shows a calibration file. Today: `--synthetic SPEC --out FILE`
// states link constants (cost/link_model.h, SyntheticCalibration), and
// `--show FILE` prints the fits of a saved calibration. Measuring a job's links over a transport
// (`--out` without `--synthetic`) arrives with the calibration issue's probing.

#include <string>

namespace wsync::cli {

std::string CalibrateUsage();
// argv[0] is "calibrate". Returns 0 on success, 1 on failure, 2 for a usage error.
int CalibrateMain(int argc, char** argv);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_CALIBRATE_COMMAND_H_
