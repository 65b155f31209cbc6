#ifndef WSYNC_INTEGRATION_CLI_PLAN_COMMAND_H_
#define WSYNC_INTEGRATION_CLI_PLAN_COMMAND_H_

// `wsync plan`: builds two named layouts of an embedded model, validates them into a Job, plans the
// resharding (for one process or all of them) and prints what the plan moves, what it cost to make
// and how much memory that took.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "plugin/settings.h"

namespace wsync::cli {

struct PlanRequest {
  std::string model;         // A name GetModel accepts, or the path of a config.json (LoadModel).
  bool include_mtp = false;  // With a config.json: its MTP layers too.
  std::string from;          // Named layout of the source (trainer) side, e.g. "megatron(tp=2)".
  std::string to;            // Named layout of the target (rollout) side, e.g. "vllm(tp=2)".
  // Global process id to plan for (trainer ranks 0..S-1, then rollout ranks S..S+T-1); all
  // processes when unset.
  std::optional<int32_t> process;
  // A name MakeSessionPolicy accepts (cost_aware with calibration or simulate).
  std::string policy = std::string(kDefaultReplicaPolicy);
  int64_t segments_to_show = 10;  // How many segments to list (>= 0).
  // A saved calibration (wsync calibrate --out); when set, the plan's traffic is priced with it.
  std::string calibration;
  // A cluster file (integration/clusters/); when set, the plan is priced on its stated links.
  std::string simulate;
  // Relay mode (planner/relay.h): never, always or auto. Auto decides with the calibration (else
  // the cluster file's links) when one is given, else by the bytes rule.
  std::string relay = "auto";
  // Fail (FailedPrecondition, after the report) when the calibration or cluster file leaves some
  // path class of the plan unpriced.
  bool require_prediction = false;
  // With `simulate` and no process: "cost_model" (the bound only) or "simgrid" (also the
  // executor of every process simulated on SimGrid, integration/cli/plan_simgrid.h).
  std::string engine = "cost_model";
  // With engine "simgrid": "relay", "policy" or "relay,policy": one plan and simulation per
  // choice, in one table (integration/cli/plan_compare.h) instead of the single simulation.
  std::string compare;
  // With engine "simgrid" and no compare: "lockstep" (rounds as over NCCL, which GPU clusters use
  // between nodes) or "independent" (each peer direction on its own, as over UCX).
  std::string simulate_lanes = "lockstep";
  // Processes per node for layouts whose spec gives no ppn (0: the named layouts' default, 8).
  int32_t procs_per_node = 0;
  // With calibration or simulate: the changed fraction of the elements (in [0, 1]) at which to
  // predict a delta sync next to the dense one (integration/cli/plan_delta.h); unset: none.
  std::optional<double> delta_changed_fraction;
};

// Runs the request and writes the report to `out`. Returns the first error of building, validating
// or planning (its message names what broke), or InvalidArgument for a process id out of range.
absl::Status RunPlan(const PlanRequest& request, std::FILE* out);

// Text describing `wsync plan`'s flags, for `wsync help`.
std::string PlanUsage();

// Entry point of the subcommand: argv[0] is "plan", the rest are its flags. Returns the exit
// status: 0 on success, 1 when building, validating or planning fails, 2 for a usage error that
// wsync detects (missing flag, stray argument, negative --segments). Abseil's flag parser itself
// exits the process with status 1 on an unknown or malformed flag.
int PlanMain(int argc, char** argv);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_COMMAND_H_
