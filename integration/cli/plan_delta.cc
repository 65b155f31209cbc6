#include "integration/cli/plan_delta.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "plugin/prediction.h"

namespace wsync::cli {
namespace {

// "2.00 % changed": how the report names a changed fraction.
std::string Percent(double fraction) { return absl::StrFormat("%.2f %%", 100 * fraction); }

// "18.85 MiB (19763067 B)".
std::string BytesText(int64_t bytes) {
  return absl::StrFormat("%s (%d B)", HumanBytes(bytes), bytes);
}

// The bytes of `traffic` per path class between two processes: what delta may shrink (a local
// copy never runs delta).
std::map<std::string, int64_t> BytesBetweenProcesses(const Traffic& traffic) {
  std::map<std::string, int64_t> bytes;
  for (const PairTraffic& pair : traffic.pairs) {
    if (pair.from == pair.to || pair.path == kPathLocal) continue;
    bytes[pair.path] += pair.bytes;
  }
  return bytes;
}

// Why there is no delta prediction without rates, and how to get them.
void PrintMissingRates(std::FILE* out, const PlanRequest& request, bool cluster_file,
                       const Traffic& traffic) {
  absl::FPrintF(
      out, "\ndelta sync at %s changed: no prediction: ", Percent(*request.delta_changed_fraction));
  constexpr absl::string_view kKeys = "delta_encode=0us,RATE;delta_apply=0us,RATE";
  if (cluster_file) {
    absl::FPrintF(out, "the cluster file states no delta rates\n  state them in its links: %s\n",
                  kKeys);
    return;
  }
  std::map<std::string, int64_t> paths;
  for (const PairTraffic& pair : traffic.pairs) paths[pair.path] += pair.bytes;
  const std::string command = CalibrateCommandFor(paths, request.calibration);
  absl::FPrintF(out, "the calibration has no delta_encode and delta_apply rates\n");
  if (command.empty()) {
    absl::FPrintF(out,
                  "  state them with: wsync calibrate --synthetic 'PATH=ALPHA,BANDWIDTH;...;%s'"
                  " --out FILE\n",
                  kKeys);
  } else {
    absl::FPrintF(out, "  measure them (on every process, with the links) with: %s\n", command);
  }
}

// One path class: its rate and bytes, delta=auto's rule and its decision at `fraction`.
void PrintClass(std::FILE* out, const LinkFits& fits, const std::map<std::string, double>& pays,
                const std::string& path, int64_t bytes, double fraction) {
  const auto fit = fits.by_path.find(path);
  const bool rated = fit != fits.by_path.end() && fit->second.bytes_per_second > 0;
  const auto below = pays.find(path);
  const bool runs = below != pays.end() && fraction < below->second;
  absl::FPrintF(out, "  %-12s %12s %12s  delta %s; delta=auto %s\n", path,
                rated ? absl::StrFormat("%.3f GB/s", fit->second.bytes_per_second / 1e9)
                      : std::string("no fit"),
                HumanBytes(bytes),
                below != pays.end()
                    ? absl::StrCat("pays below ", Percent(below->second), " changed")
                    : std::string(rated ? "never pays" : "unpriced"),
                runs ? "runs delta" : "stays dense");
}

// One setting's sync: its seconds against dense, its encoding and patching, its bytes on the wire.
void PrintSetting(std::FILE* out, absl::string_view setting, const DeltaPrediction& delta,
                  int64_t dense_bytes) {
  absl::FPrintF(out,
                "  %-11s predicted %.4f s (dense %.4f s, %.2fx): encode %.4f s + apply %.4f s\n"
                "  %-11s on the wire %s of %s dense\n",
                setting, delta.seconds, delta.dense_seconds,
                delta.dense_seconds > 0 ? delta.seconds / delta.dense_seconds : 1.0,
                delta.encode_seconds, delta.apply_seconds, "",
                BytesText(dense_bytes - delta.saved_bytes), BytesText(dense_bytes));
}

}  // namespace

absl::Status PrintDeltaPrediction(std::FILE* out, const PlanRequest& request, const Job& job,
                                  const Plan& plan, const PricingSource& source, bool cluster_file,
                                  const Prediction& dense) {
  const double fraction = *request.delta_changed_fraction;
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(source.calibration));
  const Traffic traffic = PlanTraffic(job, plan);
  if (!dense.unpriced_bytes.empty()) {
    absl::FPrintF(out,
                  "\ndelta sync at %s changed: no prediction: the dense one left traffic "
                  "unpriced (above)\n",
                  Percent(fraction));
    return absl::OkStatus();
  }
  const absl::StatusOr<DeltaPrediction> on =
      PredictDeltaSync(job, plan, dense, fits, fraction, kDeltaEncodedPerChanged,
                       /*pays_below=*/nullptr);
  if (absl::IsFailedPrecondition(on.status())) {
    PrintMissingRates(out, request, cluster_file, traffic);
    return absl::OkStatus();
  }
  WSYNC_RETURN_IF_ERROR(on.status());
  const std::map<std::string, double> pays = DeltaPaysBelow(fits);
  WSYNC_ASSIGN_OR_RETURN(
      const DeltaPrediction automatic,
      PredictDeltaSync(job, plan, dense, fits, fraction, kDeltaEncodedPerChanged, &pays));
  absl::FPrintF(out,
                "\ndelta sync at %s changed (%s):\n"
                "  rates: encode %.3f GB/s, apply %.3f GB/s (the slowest process's)\n",
                Percent(fraction), source.label, fits.delta_encode_bytes_per_second / 1e9,
                fits.delta_apply_bytes_per_second / 1e9);
  const std::map<std::string, int64_t> between = BytesBetweenProcesses(traffic);
  int64_t dense_bytes = 0;
  for (const auto& [path, bytes] : between) {
    PrintClass(out, fits, pays, path, bytes, fraction);
    dense_bytes += bytes;
  }
  PrintSetting(out, "delta=on", *on, dense_bytes);
  PrintSetting(out, "delta=auto", automatic, dense_bytes);
  absl::FPrintF(out,
                "  (a steady sync: the first to a rollout, and the first after an abort, travel "
                "dense)\n");
  return absl::OkStatus();
}

}  // namespace wsync::cli
