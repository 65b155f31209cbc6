#include "integration/cli/plan_pricing.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "executor/schedule.h"
#include "integration/simulation/cluster_file.h"
#include "plugin/prediction.h"

namespace wsync::cli {

int64_t SegmentBytes(const Job& job, const Segment& segment) {
  return segment.elements() * job.ElementSize(segment.param);
}

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit + 1 < static_cast<int>(std::size(kUnits))) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%d B", bytes);
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

namespace {

absl::StatusOr<std::string> ReadFileBytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

}  // namespace

absl::StatusOr<PricingSource> ReadCluster(const std::string& path) {
  WSYNC_ASSIGN_OR_RETURN(const std::string text, ReadFileBytes(path));
  std::string name = path, links;
  int32_t procs_per_node = 0;
  double quantize_bytes_per_second = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (absl::ConsumePrefix(&line, "name:")) name = std::string(absl::StripAsciiWhitespace(line));
    if (absl::ConsumePrefix(&line, "links:")) links = std::string(absl::StripAsciiWhitespace(line));
    if (absl::ConsumePrefix(&line, "processes_per_node:") &&
        (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &procs_per_node) ||
         procs_per_node <= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": processes_per_node must be a positive integer"));
    }
    if (absl::ConsumePrefix(&line, "quantize:")) {
      absl::StatusOr<double> rate = ParseStatedBandwidth(absl::StripAsciiWhitespace(line));
      if (!rate.ok() || !(*rate > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": quantize must be a positive rate such as 2000GB/s: ",
            rate.ok() ? std::string("not positive") : std::string(rate.status().message())));
      }
      quantize_bytes_per_second = *rate;
    }
  }
  if (links.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " has no links: line"));
  WSYNC_ASSIGN_OR_RETURN(proto::Calibration calibration, SyntheticCalibration(links));
  absl::StatusOr<std::optional<simgrid_backend::ClusterTopology>> topology =
      simulation::ParseClusterTopology(text);
  if (!topology.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", topology.status().message()));
  }
  return PricingSource{absl::StrCat("cluster ", name, ", stated links"), std::move(calibration),
                       procs_per_node, *std::move(topology), quantize_bytes_per_second};
}

absl::StatusOr<PricingSource> ReadCalibrationFile(const std::string& path) {
  WSYNC_ASSIGN_OR_RETURN(const std::string bytes, ReadFileBytes(path));
  WSYNC_ASSIGN_OR_RETURN(proto::Calibration calibration, ParseCalibration(bytes));
  PricingSource source;
  source.label = absl::StrCat("calibration ", path, ", ", calibration.transport());
  source.calibration = std::move(calibration);
  return source;
}

namespace {

// Published sync times of other systems, for the projection (figures as cited in the benchmark
// issue, with their sources).
void PrintPublished(std::FILE* out, const std::string& model) {
  if (model == "kimi-k2") {
    absl::FPrintF(out,
                  "  published: Perplexity 1.3 s for Kimi-K2 on 256 -> 128 GPUs (Perplexity "
                  "engineering blog);\n             checkpoint-engine 16 s for Kimi-K2 on 256 "
                  "H20 (MoonshotAI checkpoint-engine README)\n");
  } else if (model == "deepseek-v3") {
    absl::FPrintF(out, "  published: NeMo-RL 2.4-2.8 s for DeepSeek-V3 (NVIDIA NeMo-RL docs)\n");
  }
}

// Prints the path classes priced with another class's fit (LinkFits::stand_ins).
void PrintStandIns(std::FILE* out, const PlanRequest& request, const LinkFits& fits,
                   const Prediction& prediction) {
  for (const auto& [path, bytes] : prediction.stand_in_bytes) {
    const auto source = fits.stand_ins.find(path);
    if (source == fits.stand_ins.end()) continue;
    absl::FPrintF(out,
                  "  stand-in: %s, %s (%d B), priced with %s's fit: the %s has none of its own\n",
                  path, HumanBytes(bytes), bytes, source->second,
                  request.calibration.empty() ? "cluster" : "calibration");
  }
  if (prediction.quantize_stand_in && prediction.quantize_seconds > 0) {
    absl::FPrintF(
        out,
        "  stand-in: quantize priced at %.2f GB/s of input per process, a constant: the "
        "%s measured no quantize rate (wsync calibrate --processes N measures it)\n",
        prediction.quantize_bytes_per_second / 1e9,
        request.calibration.empty() ? "cluster states no `quantize:` and" : "calibration");
  }
}

// Prints the unpriced path classes and the `wsync calibrate` command that measures them.
void PrintUnpriced(std::FILE* out, const PlanRequest& request, const Prediction& prediction) {
  if (prediction.unpriced_bytes.empty()) return;
  for (const auto& [path, bytes] : prediction.unpriced_bytes) {
    absl::FPrintF(out, "  not priced: %s, %s (%d B): the %s has no fit for this path class\n", path,
                  HumanBytes(bytes), bytes,
                  request.calibration.empty() ? "cluster" : "calibration");
  }
  const std::string command = CalibrateCommandFor(
      prediction.unpriced_bytes, request.calibration.empty() ? "FILE" : request.calibration);
  if (command.empty()) {
    absl::FPrintF(out,
                  "  no wsync calibrate command measures it on one machine; state its links with "
                  "wsync calibrate --synthetic 'PATH=ALPHA,BANDWIDTH;...' --out FILE\n");
  } else {
    absl::FPrintF(out, "  measure it with: %s\n", command);
  }
}

}  // namespace

absl::StatusOr<Prediction> PrintPrediction(std::FILE* out, const PlanRequest& request,
                                           const Job& job, const Plan& plan,
                                           const PricingSource& source) {
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(source.calibration));
  Traffic priced = PlanTraffic(job, plan);
  if (request.process.has_value()) {
    Endpoints endpoints;
    for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
    WSYNC_ASSIGN_OR_RETURN(const ProcessSchedule schedule,
                           ScheduleTransfers(job, plan.segments, plan.quant, endpoints,
                                             StagingBudget{}, *request.process));
    priced.rounds = schedule.rounds;
  }
  WSYNC_ASSIGN_OR_RETURN(Prediction prediction, PredictPriced(fits, priced));
  // FP8 targets: the quantize term at the cluster's stated rate, else the calibration's
  // measured one, else the stand-in constant (plugin/prediction.h QuantizeRateOf).
  const QuantizeRate quantize_rate = QuantizeRateOf(fits, source.quantize_bytes_per_second);
  prediction.quantize_seconds = QuantizeSeconds(job, plan.quant, quantize_rate.bytes_per_second);
  prediction.seconds += prediction.quantize_seconds;
  if (prediction.quantize_seconds > 0) {
    prediction.quantize_bytes_per_second = quantize_rate.bytes_per_second;
    prediction.quantize_stand_in = quantize_rate.stand_in;
  }
  const char* quantize_source = source.quantize_bytes_per_second > 0 ? "stated by the cluster"
                                : quantize_rate.stand_in             ? "stand-in"
                                                                     : "calibrated";
  const bool partial = !prediction.unpriced_bytes.empty();
  if (partial && prediction.binding.empty()) {
    absl::FPrintF(out, "\npredicted (%s): none of the traffic could be priced\n", source.label);
    PrintUnpriced(out, request, prediction);
    return prediction;
  }
  absl::FPrintF(out,
                "\npredicted (%s): %.4f s%s = transfer %.4f s + latency %.6f s (%d rounds)%s\n"
                "  binding resource: %s\n",
                source.label, prediction.seconds, partial ? " for the priced traffic only" : "",
                prediction.transfer_seconds, prediction.latency_seconds, priced.rounds,
                prediction.quantize_seconds > 0
                    ? absl::StrFormat(" + quantize %.4f s (%.4g GB/s of input per process, %s)",
                                      prediction.quantize_seconds,
                                      quantize_rate.bytes_per_second / 1e9, quantize_source)
                    : std::string(),
                prediction.binding.empty() ? std::string("none") : prediction.binding);
  PrintStandIns(out, request, fits, prediction);
  PrintUnpriced(out, request, prediction);
  if (!request.simulate.empty() && !request.process.has_value()) PrintPublished(out, request.model);
  return prediction;
}

absl::Status PrintIngressFloor(std::FILE* out, const Job& job, const Plan& plan,
                               const PricingSource& source) {
  WSYNC_ASSIGN_OR_RETURN(const LinkFits fits, FitLinks(source.calibration));
  const auto link = fits.by_path.find(std::string(kPathInterNode));
  if (link == fits.by_path.end() || link->second.bytes_per_second <= 0) return absl::OkStatus();
  std::map<int32_t, int64_t> bytes_in;  // By node index.
  std::map<int32_t, int32_t> rollouts;  // By node index.
  for (int32_t id = 0; id < job.num_processes(); ++id) {
    if (!job.IsSource(id)) ++rollouts[job.NodeIndex(id)];
  }
  // Every pair's bytes, quantization steps' e4m3 bytes, scales and gathers included.
  for (const PairTraffic& pair : PlanTraffic(job, plan).pairs) {
    if (job.IsSource(pair.to) || pair.path != kPathInterNode) continue;
    bytes_in[job.NodeIndex(pair.to)] += pair.bytes;
  }
  const auto busiest =
      std::max_element(bytes_in.begin(), bytes_in.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  if (busiest == bytes_in.end()) return absl::OkStatus();
  const int32_t nics = rollouts[busiest->first];
  const double rate = link->second.bytes_per_second;
  std::string node;
  for (int32_t id = 0; id < job.num_processes(); ++id) {
    if (job.NodeIndex(id) == busiest->first) node = job.processes()[id].node_id;
  }
  absl::FPrintF(out,
                "  rollout ingress floor: node %s takes in %s (%d B) from other nodes through %d "
                "NICs x %.1f GB/s = %.4f s\n",
                node, HumanBytes(busiest->second), busiest->second, nics, rate / 1e9,
                static_cast<double>(busiest->second) / (nics * rate));
  return absl::OkStatus();
}

}  // namespace wsync::cli
