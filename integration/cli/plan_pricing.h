#ifndef WSYNC_INTEGRATION_CLI_PLAN_PRICING_H_
#define WSYNC_INTEGRATION_CLI_PLAN_PRICING_H_

// Pricing for `wsync plan`: the calibration file (--calibration) or cluster file (--simulate) a
// plan is priced with, the prediction with what it could not price, and the rollout ingress floor.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cost/calibration.pb.h"
#include "cost/link_model.h"
#include "integration/cli/plan_command.h"
#include "integration/simulation/simgrid/cluster_platform.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::cli {

// A calibration and a name for it in the report: a saved file (--calibration) or the stated link
// constants of a cluster file (--simulate).
struct PricingSource {
  std::string label;
  proto::Calibration calibration;
  int32_t procs_per_node = 0;  // A cluster file's processes_per_node (0: not stated).
  // A cluster file's topology lines (integration/simulation/cluster_file.h), if it has them.
  std::optional<simgrid_backend::ClusterTopology> topology;
  // A cluster file's `quantize:` rate (bytes of input per second per process); 0: not stated,
  // the calibration's measured rate, else the stand-in kQuantizeInputBytesPerSecond
  // (plugin/prediction.h QuantizeRateOf).
  double quantize_bytes_per_second = 0;
};

// A cluster file: "#" comments, "name: N", "processes_per_node: K", "links: SPEC" (the syntax of
// SyntheticCalibration), "quantize: RATE" (e.g. 2000GB/s: how fast one process quantizes, in
// bytes of bf16 input), and the topology keys of ParseClusterTopology. NotFound when unreadable,
// InvalidArgument without a links: line, for a rate that is not a positive bandwidth, or for a
// topology ParseClusterTopology refuses.
absl::StatusOr<PricingSource> ReadCluster(const std::string& path);
// A saved calibration (wsync calibrate --out).
absl::StatusOr<PricingSource> ReadCalibrationFile(const std::string& path);

// Prices the planned traffic (PredictPriced: the busiest resource over its capacity plus latency)
// and prints it. With request.process the traffic is that process's pairs and the rounds its
// schedule (quantization steps included); otherwise every pair, each pair's segment count standing
// in for its messages. FP8 targets add the quantize term at QuantizeRateOf(the source's fits, its
// stated rate), printed with where the rate came from; a stand-in rate is named. Pairs on a path
// class the source has no fit for are left out, named with their bytes and, where one exists, the
// `wsync calibrate` command that measures them; the prediction says what it left out.
absl::StatusOr<Prediction> PrintPrediction(std::FILE* out, const PlanRequest& request,
                                           const Job& job, const Plan& plan,
                                           const PricingSource& source);

// The bound no schedule beats on a cluster file: the rollout node that takes in the most bytes
// from other nodes (PlanTraffic's: FP8 targets' e4m3 bytes, scales and gathers, not their bf16),
// over the summed inter_node rate of its rollout processes (one NIC per process, as the cluster
// files state). Prints nothing without an inter_node fit or inter-node bytes.
absl::Status PrintIngressFloor(std::FILE* out, const Job& job, const Plan& plan,
                               const PricingSource& source);

// "942.38 MiB": binary units, two decimals; plain bytes below 1 KiB.
std::string HumanBytes(int64_t bytes);
// The bytes one segment moves.
int64_t SegmentBytes(const Job& job, const Segment& segment);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_PRICING_H_
