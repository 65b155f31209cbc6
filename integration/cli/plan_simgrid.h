#ifndef WSYNC_INTEGRATION_CLI_PLAN_SIMGRID_H_
#define WSYNC_INTEGRATION_CLI_PLAN_SIMGRID_H_

// `wsync plan --simulate CLUSTER --engine simgrid`: runs the plan's sync with the product's
// executor on every process, simulated on SimGrid (integration/simulation), on a platform made
// from the cluster file, and prints the simulated sync time next to the cost model's bound.

#include <cstdio>

#include "absl/status/status.h"
#include "integration/cli/plan_pricing.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::cli {

// Simulates `plan` of `job` (all processes) on `cluster` and prints the simulated sync time, its
// ratio to `bound_seconds` (the cost model's price of the same plan on the same cluster), the ten
// slowest processes' finish times, the busiest links and what the simulation cost. The platform
// is a star for now: one link per process with the cluster's inter_node fit (bandwidth each way,
// alpha split over the route's two links), device copies at its local fit's bandwidth.
// FailedPrecondition when the cluster states no inter_node or local fit; a failed process's error
// after the report.
absl::Status PrintSimGridSimulation(std::FILE* out, const Job& job, const Plan& plan,
                                    const PricingSource& cluster, double bound_seconds);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_SIMGRID_H_
