#include "integration/cli/calibrate_command.h"

#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "calibration/link_model/link_model.h"
#include "common/status.h"

ABSL_FLAG(std::string, synthetic, "",
          "Link constants, e.g. 'intra_node=5us,200GB/s;inter_node=20us,25GB/s'.");
ABSL_FLAG(std::string, out, "", "Write the calibration to this file.");
ABSL_FLAG(std::string, show, "", "Print the fits of this calibration file.");

namespace wsync::cli {
namespace {

void PrintFit(std::FILE* out, const std::string& what, const LinkFit& fit) {
  absl::FPrintF(out, "  %-36s alpha %9.2f us  %9.3f GB/s  max rel. error %.3f (%d sizes)\n", what,
                fit.alpha_seconds * 1e6, fit.bytes_per_second / 1e9, fit.max_relative_error,
                fit.sizes);
}

absl::Status Show(const proto::Calibration& calibration, std::FILE* out) {
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(calibration));
  absl::FPrintF(out, "calibration: %d processes, transport %s, %d samples\n",
                calibration.processes(), calibration.transport(), calibration.samples_size());
  for (const auto& [path, fit] : fits.by_path) PrintFit(out, absl::StrCat("path ", path), fit);
  for (const auto& [pair, fit] : fits.by_pair) {
    PrintFit(out, absl::StrCat("pair ", pair.first, " -> ", pair.second), fit);
  }
  for (const auto& [pair, fit] : fits.both_ways) {
    PrintFit(out, absl::StrCat("both ways ", pair.first, " <-> ", pair.second), fit);
  }
  for (const auto& [key, fit] : fits.fan_aggregate) {
    PrintFit(out,
             absl::StrCat(std::get<0>(key), " root ", std::get<1>(key), " peers ",
                          absl::StrJoin(std::get<2>(key), ","), " (aggregate)"),
             fit);
  }
  for (const auto& [paths, fit] : fits.relay) {
    PrintFit(out, absl::StrCat("relay ", paths.first, " -> ", paths.second), fit);
  }
  return absl::OkStatus();
}

absl::Status Run(std::FILE* out) {
  const std::string synthetic = absl::GetFlag(FLAGS_synthetic);
  const std::string path = absl::GetFlag(FLAGS_out);
  const std::string show = absl::GetFlag(FLAGS_show);
  if (!show.empty()) {
    std::ifstream file(show, std::ios::binary);
    if (!file) return absl::NotFoundError(absl::StrCat("cannot read ", show));
    const std::string bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration, ParseCalibration(bytes));
    return Show(calibration, out);
  }
  if (synthetic.empty() || path.empty()) {
    return absl::InvalidArgumentError(
        "give --synthetic SPEC --out FILE, or --show FILE (measuring links over a transport is "
        "not built yet)");
  }
  WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration, SyntheticCalibration(synthetic));
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << SerializeCalibration(calibration);
  if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  absl::FPrintF(out, "wrote %s\n", path);
  return Show(calibration, out);
}

}  // namespace

std::string CalibrateUsage() {
  return "wsync calibrate --synthetic 'PATH=ALPHA,BANDWIDTH;...' --out FILE | --show FILE\n"
         "  Writes a calibration of stated link constants, or prints a saved one's fits.\n";
}

int CalibrateMain(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = Run(stdout);
  if (!status.ok()) {
    absl::FPrintF(stderr, "wsync calibrate: %s\n", status.ToString());
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace wsync::cli
