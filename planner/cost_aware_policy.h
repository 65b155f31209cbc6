#ifndef WSYNC_PLANNER_COST_AWARE_POLICY_H_
#define WSYNC_PLANNER_COST_AWARE_POLICY_H_

// cost_aware: answers all replica requests of a sync at once to lower the predicted time of the
// whole sync under the calibrated cost model (calibration/link_model TrafficLoads: pair links,
// egress, ingress, path aggregates, node links (the capacity every pair from one node to another
// shares) and the pairs inside a node). Requests are taken largest first; each goes to the option
// that gives the lowest predicted time of the requests answered so far, ties to the option whose
// busiest loaded resource finishes earliest, then to fewer parts, the cheaper path classes and the
// lowest processes. Options: each holder alone, and for a region of at least twice
// `min_split_bytes` cuts along axis 0 over the 2..k best holders (finishing together, or equal),
// never into parts below `min_split_bytes`. So a reader takes a replica on its own node when the
// node link is the slower resource, and crossing bytes spread so that no node link binds while
// another choice exists. Deterministic: it sees only the job and the fits, which every process
// shares. A path class without a fit is priced at `default_bytes_per_second`.

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
