#ifndef WSYNC_INTEGRATION_CLI_PLAN_SIMGRID_H_
#define WSYNC_INTEGRATION_CLI_PLAN_SIMGRID_H_

// `wsync plan --simulate CLUSTER --engine simgrid`: runs the plan's sync with the product's
// executor on every process, simulated on SimGrid (integration/simulation), on the platform the
// cluster file's topology describes, and prints the simulated sync time next to the cost model's
// bound.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "integration/cli/plan_pricing.h"
#include "integration/simulation/simulate_sync.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::cli {

// One direction of one link of the platform and the bytes the sync moved over it.
struct LinkLoad {
  std::string name;  // simgrid_backend::LinkHop::Name(): "nic3.1 up".
  int64_t bytes = 0;
  double bytes_per_second = 0;
};

struct ClusterSimulation {
  simulation::SimulationResult result;
  std::string platform;  // ClusterPlatform::Describe().
  double copy_bytes_per_second = 0;
  std::vector<LinkLoad> busiest_links;  // The five with the most bytes over bandwidth, first first.
};

// OK when `cluster` states a topology and a local link (what SimulateOnCluster needs);
// FailedPrecondition naming what is missing otherwise.
absl::Status CheckSimulationCluster(const PricingSource& cluster);

// Simulates `plan` of `job` (all processes, every buffer taken as device memory) on `cluster`'s
// topology: processes placed by simulation::PlaceOnCluster, device copies at the cluster's local
// fit, lockstep rounds as over NCCL (`lockstep`) or each peer direction on its own as over UCX.
// FailedPrecondition when the cluster file states no topology
// or no local link; the placement's and the simulation's errors. A failed process is in the
// result (SimulationResult::FirstFailure), not an error.
absl::StatusOr<ClusterSimulation> SimulateOnCluster(const Job& job, const Plan& plan,
                                                    const PricingSource& cluster,
                                                    bool lockstep = true);

// SimulateOnCluster, then prints the simulated sync time, its ratio to `bound_seconds` (the cost
// model's price of the same plan on the same cluster), the ten slowest processes' finish times,
// the busiest links and what the simulation cost. Returns a failed process's error after the
// report.
absl::Status PrintSimGridSimulation(std::FILE* out, const Job& job, const Plan& plan,
                                    const PricingSource& cluster, double bound_seconds,
                                    bool lockstep = true);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_SIMGRID_H_
