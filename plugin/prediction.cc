#include "plugin/prediction.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "control/client.h"
#include "executor/waves.h"
#include "planner/cost_aware_policy.h"
#include "planner/job.h"
#include "planner/policy.h"
#include "planner/waves.h"

namespace wsync {
namespace {

constexpr absl::string_view kCostAware = "cost_aware";

// The broadcast payload: empty for no calibration, else the file's modification time (decimal
// Unix seconds), a newline, and the file's bytes.
absl::StatusOr<std::string> ReadPayload(const std::string& file) {
  if (file.empty()) return std::string();
  std::ifstream in(file, std::ios::binary);
  struct stat info {};
  if (!in || stat(file.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read calibration_file ", file));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return absl::StrCat(static_cast<int64_t>(info.st_mtime), "\n", bytes);
}

}  // namespace

std::string CalibrationMetadata(int32_t process, const std::string& file,
                                absl::Status* read_error) {
  if (process != 0) return std::string();
  absl::StatusOr<std::string> payload = ReadPayload(file);
  *read_error = payload.status();
  return payload.ok() ? *std::move(payload) : std::string("!");
}

absl::StatusOr<SharedCalibration> CalibrationFromRoster(const Roster& roster) {
  if (roster.size() == 0) return SharedCalibration();
  const std::string& payload = roster.metadata(0);
  SharedCalibration shared;
  if (payload.empty()) return shared;
  const size_t newline = payload.find('\n');
  int64_t seconds = 0;
  if (newline == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(payload).substr(0, newline), &seconds)) {
    return absl::UnavailableError("process 0 could not read its calibration_file");
  }
  WSYNC_ASSIGN_OR_RETURN(const proto::Calibration calibration,
                         ParseCalibration(absl::string_view(payload).substr(newline + 1)));
  WSYNC_ASSIGN_OR_RETURN(shared.fits, FitLinks(calibration));
  shared.transport = calibration.transport();
  shared.measured = absl::FromUnixSeconds(seconds);
  return shared;
}

absl::Status CheckSessionPolicyName(absl::string_view name) {
  if (name == kCostAware) return absl::OkStatus();
  return MakeReplicaPolicy(name).status();
}

absl::StatusOr<std::unique_ptr<ReplicaPolicy>> MakeSessionPolicy(absl::string_view name,
                                                                 const LinkFits* fits) {
  if (name != kCostAware) return MakeReplicaPolicy(name);
  if (fits == nullptr) {
    return absl::FailedPreconditionError(
        "replica policy cost_aware needs a calibration: set calibration_file on trainer rank 0");
  }
  return MakeCostAwarePolicy(*fits);
}

Traffic PlanTraffic(const Job& job, const Plan& plan) {
  std::map<std::pair<int32_t, int32_t>, PairTraffic> pairs;
  auto add = [&](int32_t from, int32_t to, int64_t bytes) {
    PairTraffic& pair = pairs[{from, to}];
    pair.from = from;
    pair.to = to;
    pair.path = std::string(job.PathClass(from, to));
    pair.bytes += bytes;
    ++pair.messages;
  };
  for (const Segment& segment : plan.segments) {
    add(segment.from.process, segment.to.process,
        segment.elements() * job.ElementSize(segment.param));
  }
  // Quantization steps (planner/quant_plan.h): e4m3 bytes and scales from sender-side steps,
  // source-dtype gathers for receiver-side ones.
  for (const QuantTransform& step : plan.quant.transforms) {
    if (step.side != QuantSide::kSender) continue;
    add(step.from.process, step.to.process,
        Volume(step.box) * DTypeSize(DType::kFloat8E4M3) +
            Volume(step.scale_box) * DTypeSize(DType::kFloat32));
  }
  for (const Segment& gather : plan.quant.gathers) {
    add(gather.from.process, gather.to.process,
        gather.elements() * DTypeSize(job.source().params[job.SourceParamOf(gather.param)].dtype));
  }
  Traffic traffic;
  for (auto& [key, pair] : pairs) {
    traffic.rounds = std::max(traffic.rounds, pair.messages);
    traffic.pairs.push_back(std::move(pair));
  }
  return traffic;
}

absl::StatusOr<Prediction> PredictSync(const Job& job, const ReplicaPolicy& policy,
                                       const LinkFits& fits, StagingBudget budget,
                                       const RelayOptions& relay) {
  PlanOptions options;
  options.relay = relay;
  WSYNC_ASSIGN_OR_RETURN(const Plan whole, MakePlan(job, policy, options));
  Traffic traffic = PlanTraffic(job, whole);
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  // The rounds of what runs: the quantization steps' segments (e4m3, scales, gathers) included,
  // and a streamed sync's waves one after another (executor/waves.h).
  const std::vector<Wave> waves = SplitIntoWaves(job, whole.segments);
  traffic.rounds = 0;
  for (int32_t process : endpoints.processes) {
    WSYNC_ASSIGN_OR_RETURN(const ProcessSchedule schedule,
                           ScheduleWaves(job, waves, whole.quant, endpoints, budget, process));
    traffic.rounds = std::max<int64_t>(traffic.rounds, schedule.rounds);
  }
  WSYNC_ASSIGN_OR_RETURN(Prediction prediction, PredictPriced(fits, traffic));
  const QuantizeRate rate = QuantizeRateOf(fits);
  prediction.quantize_seconds = QuantizeSeconds(job, whole.quant, rate.bytes_per_second);
  prediction.seconds += prediction.quantize_seconds;
  if (prediction.quantize_seconds > 0) {
    prediction.quantize_bytes_per_second = rate.bytes_per_second;
    prediction.quantize_stand_in = rate.stand_in;
  }
  return prediction;
}

QuantizeRate QuantizeRateOf(const LinkFits& fits, double stated) {
  if (stated > 0) return QuantizeRate{stated, false};
  if (fits.quantize_bytes_per_second > 0)
    return QuantizeRate{fits.quantize_bytes_per_second, false};
  return QuantizeRate{};
}

double QuantizeSeconds(const Job& job, const QuantPlan& plan, double input_bytes_per_second) {
  std::map<int32_t, int64_t> input_bytes;  // Per quantizing process.
  for (const QuantTransform& step : plan.transforms) {
    const int32_t process = step.side == QuantSide::kSender ? step.from.process : step.to.process;
    input_bytes[process] +=
        Volume(step.blocks) * DTypeSize(job.source().params[job.SourceParamOf(step.param)].dtype);
  }
  int64_t busiest = 0;
  for (const auto& [process, bytes] : input_bytes) busiest = std::max(busiest, bytes);
  return static_cast<double>(busiest) / input_bytes_per_second;
}

std::string CalibrateCommandFor(const std::map<std::string, int64_t>& unpriced,
                                absl::string_view out) {
  bool inter_node = false;
  for (const auto& [path, bytes] : unpriced) {
    if (path == kPathInterNode) {
      inter_node = true;
    } else if (path != kPathIntraNode && path != kPathLocal && path != kPathSameDevice) {
      return std::string();
    }
  }
  // Two nodes of two processes each measure every class: local, intra_node and inter_node.
  if (inter_node) {
    return absl::StrCat("wsync calibrate --processes 4 --nodes a,a,b,b --netns --out ", out,
                        " (as root: nodes a and b in two network namespaces joined by a veth)");
  }
  return absl::StrCat("wsync calibrate --processes 4 --out ", out);
}

std::string UnpricedNote(const Prediction& prediction) {
  if (prediction.unpriced_bytes.empty()) return std::string();
  std::string note = "not priced:";
  for (const auto& [path, bytes] : prediction.unpriced_bytes) {
    absl::StrAppendFormat(&note, " %s %d B", path, bytes);
  }
  absl::StrAppend(&note, " (no fit for ",
                  prediction.unpriced_bytes.size() == 1 ? "that path class" : "those path classes",
                  " in the calibration); ");
  const std::string command = CalibrateCommandFor(prediction.unpriced_bytes);
  absl::StrAppend(&note, command.empty() ? "state its links with: wsync calibrate --synthetic "
                                           "'PATH=ALPHA,BANDWIDTH;...' --out FILE"
                                         : absl::StrCat("measure with: ", command));
  return note;
}

std::string PredictionLine(const std::optional<Prediction>& prediction,
                           const SharedCalibration& calibration) {
  if (!calibration.fits.has_value()) {
    return "predicted time: needs calibration (calibration_file on trainer rank 0)";
  }
  if (!prediction.has_value()) return "predicted time: none (the plan could not be priced)";
  const std::string note = UnpricedNote(*prediction);
  const std::string stand_in = StandInNote(*calibration.fits, *prediction);
  const std::string quantize =
      prediction->quantize_seconds > 0
          ? absl::StrFormat(" + quantize %.6f s at %.2f GB/s of input%s",
                            prediction->quantize_seconds,
                            prediction->quantize_bytes_per_second / 1e9,
                            prediction->quantize_stand_in ? " (stand-in)" : " (calibrated)")
          : std::string();
  return absl::StrFormat(
      "predicted time %.6f s%s (transfer %.6f s + latency %.6f s%s; calibration of %s), binding "
      "resource: %s%s%s",
      prediction->seconds, note.empty() ? "" : " for the priced traffic only",
      prediction->transfer_seconds, prediction->latency_seconds, quantize, calibration.transport,
      prediction->binding.empty() ? std::string("none") : prediction->binding,
      stand_in.empty() ? "" : absl::StrCat("; stand-in: ", stand_in),
      note.empty() ? "" : absl::StrCat("; ", note));
}

std::map<std::string, double> DeltaPaysBelow(const LinkFits& fits) {
  std::map<std::string, double> pays;
  const double encode = fits.delta_encode_bytes_per_second;
  const double apply = fits.delta_apply_bytes_per_second;
  if (encode <= 0 || apply <= 0) return pays;
  for (const auto& [path, fit] : fits.by_path) {
    if (path == kPathLocal || fit.bytes_per_second <= 0) continue;
    const double bandwidth = fit.bytes_per_second;
    const double below = (1 - bandwidth / encode - bandwidth / apply) / kDeltaEncodedPerChanged;
    if (below > 0) pays[path] = std::min(below, 1.0);
  }
  return pays;
}

absl::StatusOr<DeltaPrediction> PredictDeltaSync(const Job& job, const Plan& plan,
                                                 const Prediction& dense, const LinkFits& fits,
                                                 double changed_fraction,
                                                 double encoded_per_changed,
                                                 const std::map<std::string, double>* pays_below) {
  if (fits.delta_encode_bytes_per_second <= 0 || fits.delta_apply_bytes_per_second <= 0) {
    return absl::FailedPreconditionError(
        "the calibration measured no delta encode and apply rates (wsync calibrate measures them)");
  }
  if (!(encoded_per_changed > 0) || !std::isfinite(encoded_per_changed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("encoded bytes per changed byte must be above 0, got ", encoded_per_changed));
  }
  DeltaPrediction delta;
  delta.changed_fraction = std::clamp(changed_fraction, 0.0, 1.0);
  delta.encoded_per_changed = encoded_per_changed;
  delta.dense_seconds = dense.seconds;
  const double encoded = std::min(1.0, encoded_per_changed * delta.changed_fraction);
  std::map<int32_t, int64_t> sent, received;
  int64_t all_bytes = 0;
  for (const PairTraffic& pair : PlanTraffic(job, plan).pairs) {
    all_bytes += pair.bytes;
    if (pair.from == pair.to || pair.path == kPathLocal) continue;
    if (pays_below != nullptr) {
      const auto it = pays_below->find(pair.path);
      if (it == pays_below->end() || !(delta.changed_fraction < it->second)) continue;
    }
    delta.dense_bytes += pair.bytes;
    sent[pair.from] += pair.bytes;
    received[pair.to] += pair.bytes;
  }
  delta.saved_bytes = static_cast<int64_t>(static_cast<double>(delta.dense_bytes) * (1 - encoded));
  int64_t busiest_sender = 0, busiest_receiver = 0;
  for (const auto& [process, bytes] : sent) busiest_sender = std::max(busiest_sender, bytes);
  for (const auto& [process, bytes] : received) {
    busiest_receiver = std::max(busiest_receiver, bytes);
  }
  delta.encode_seconds = static_cast<double>(busiest_sender) / fits.delta_encode_bytes_per_second;
  delta.apply_seconds = static_cast<double>(busiest_receiver) / fits.delta_apply_bytes_per_second;
  const double kept =
      all_bytes > 0 ? 1 - static_cast<double>(delta.saved_bytes) / static_cast<double>(all_bytes)
                    : 1;
  delta.seconds = dense.seconds - dense.transfer_seconds * (1 - kept) +
                  (delta.dense_bytes > 0 ? delta.encode_seconds + delta.apply_seconds : 0);
  return delta;
}

std::string DeltaPredictionLine(const absl::StatusOr<DeltaPrediction>& prediction,
                                absl::string_view fraction_source) {
  if (!prediction.ok())
    return absl::StrCat("delta: no prediction: ", prediction.status().message());
  const DeltaPrediction& d = *prediction;
  return absl::StrFormat(
      "delta: predicted %.4g s (dense %.4g s) at %.2f %% changed and %.3g encoded bytes per "
      "changed byte (%s), %.1f MB of %.1f MB saved, encode %.4g s, apply %.4g s",
      d.seconds, d.dense_seconds, 100 * d.changed_fraction, d.encoded_per_changed, fraction_source,
      d.saved_bytes / 1e6, d.dense_bytes / 1e6, d.encode_seconds, d.apply_seconds);
}

}  // namespace wsync
