#ifndef WSYNC_PLANNER_COST_AWARE_POLICY_H_
#define WSYNC_PLANNER_COST_AWARE_POLICY_H_

// cost_aware: answers all replica requests of a sync at once to lower the predicted time of the
// whole sync under calibrated link costs (calibration/link_model). Requests are taken largest
// first; each goes to the holder whose egress and link to the receiver would finish earliest,
// ties to the cheaper path class and then the lowest process. A region of at least twice
// `min_split_bytes` is cut along axis 0 across several holders when that finishes earlier, never
// into parts below `min_split_bytes`. Deterministic: it sees only the job and the fits, which every
// process shares. A path without a fit is priced at `default_bytes_per_second`.

#include <cstdint>
#include <memory>

#include "calibration/link_model/link_model.h"
#include "planner/plan.h"

namespace wsync {

struct CostAwareOptions {
  int64_t min_split_bytes = int64_t{16} << 20;
  double default_bytes_per_second = 1e9;
};

std::unique_ptr<ReplicaPolicy> MakeCostAwarePolicy(LinkFits fits, CostAwareOptions options = {});

}  // namespace wsync

#endif  // WSYNC_PLANNER_COST_AWARE_POLICY_H_
