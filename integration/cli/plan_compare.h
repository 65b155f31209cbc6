#ifndef WSYNC_INTEGRATION_CLI_PLAN_COMPARE_H_
#define WSYNC_INTEGRATION_CLI_PLAN_COMPARE_H_

// `wsync plan --simulate CLUSTER --engine simgrid --compare relay,policy`: the same job planned
// with each relay mode and/or replica policy, each plan priced by the cost model and simulated on
// SimGrid (integration/cli/plan_simgrid.h), one table row per choice.

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "integration/cli/plan_command.h"
#include "integration/cli/plan_pricing.h"
#include "planner/job.h"

namespace wsync::cli {

// OK for a comma-separated list of "relay" and "policy" (each at most once); InvalidArgument,
// naming the entry, otherwise.
absl::Status CheckCompareList(absl::string_view compare);

// Plans `job` once per choice (relay: never, always, auto; policy: first_holder,
// local_first_least_loaded, cost_aware; a dimension not compared keeps the request's choice),
// prices and simulates each plan on `cluster`, and prints a markdown table: relay, policy,
// inter-node bytes, simulated sync time, bound, ratio, simulation wall time. A choice that cannot
// be planned or whose simulated processes fail gets a row saying so; the first such error is
// returned after the table. Errors of the cluster (no topology) return at once.
absl::Status PrintComparison(std::FILE* out, const PlanRequest& request, const Job& job,
                             const PricingSource& cluster);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_COMPARE_H_
