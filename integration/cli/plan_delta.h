#ifndef WSYNC_INTEGRATION_CLI_PLAN_DELTA_H_
#define WSYNC_INTEGRATION_CLI_PLAN_DELTA_H_

// `wsync plan --delta_changed_fraction F`: the predicted delta sync (issue 44, docs/delta.md) next
// to the dense prediction, from the same calibration or cluster file.

#include <cstdio>

#include "absl/status/status.h"
#include "cost/link_model.h"
#include "integration/cli/plan_command.h"
#include "integration/cli/plan_pricing.h"
#include "planner/job.h"
#include "planner/plan.h"

namespace wsync::cli {

// Prints, for `plan` priced by `source` as `dense` (PrintPrediction's result for the same plan and
// source; `cluster_file`: the source is --simulate's), the delta sync at
// request.delta_changed_fraction (set, in [0, 1]): per path class the plan moves bytes on,
// delta=auto's rule (plugin/prediction.h DeltaPaysBelow) and its decision at that fraction; then
// the delta=on and delta=auto syncs (PredictDeltaSync: seconds, bytes on the wire against the dense
// bytes between processes, the busiest sender's encoding and the busiest receiver's patching).
// Without the source's delta rates, says so and how to get them (the `wsync calibrate` command that
// measures them with every class the plan uses, or the keys a cluster file states them with); with
// traffic the source leaves unpriced, says that no delta prediction is made. Errors only when the
// source's fits do not fit.
absl::Status PrintDeltaPrediction(std::FILE* out, const PlanRequest& request, const Job& job,
                                  const Plan& plan, const PricingSource& source, bool cluster_file,
                                  const Prediction& dense);

}  // namespace wsync::cli

#endif  // WSYNC_INTEGRATION_CLI_PLAN_DELTA_H_
