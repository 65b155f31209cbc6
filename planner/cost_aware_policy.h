#ifndef WSYNC_PLANNER_COST_AWARE_POLICY_H_
#define WSYNC_PLANNER_COST_AWARE_POLICY_H_

// cost_aware: answers all replica requests of a sync at once to lower the predicted time of the
// whole sync under the calibrated cost model (cost/ TrafficLoads: pair links,
// egress, ingress, path aggregates, node links (the capacity every pair from one node to another
// shares) and the pairs inside a node), starting from the sync's fixed traffic (the bytes and
// regions every pair carries whatever the answers; ReplicaPolicy::Choose), so that replica bytes
// avoid the resources fixed traffic already fills. Each pair link, sender egress and receiver
// ingress is also charged alpha / kRoundsInFlight (the pair's fit) per message: a fixed pair's
// regions (at least one per `message_bytes`), one per `message_bytes` started of each part.
// Requests are taken largest first; each goes to the option with the lowest predicted time of
// the sync so far; ties to fewer parts (a split is taken only when what it saves outweighs its
// extra messages), then to pairs that already carry traffic (a receiver's requests consolidate on
// its senders), then to the option whose busiest loaded resource finishes earliest, the cheaper
// path classes and the lowest processes. Options: each holder alone, and for a region of at least
// twice `min_split_bytes` cuts along axis 0 over the 2..k holders that finish earliest alone
// (finishing together, or equal), never into parts below `min_split_bytes`. So a reader takes a
// replica on its own node when the node link is the slower resource, and crossing bytes spread so
// that no node link binds while another choice exists. Last, the answers are compared with
// first_holder's under Predict (fixed traffic plus every part, a pair's messages its regions, the
// rounds the most of any pair): first_holder's are returned when predicted faster, so the policy
// never predicts worse than first_holder. Deterministic: it sees only the job, the fixed traffic
// and the fits, which every process shares. A path class without a fit is priced at
// `default_bytes_per_second` with alpha 0.

#include <cstdint>
#include <memory>

#include "cost/link_model.h"
#include "planner/plan.h"

namespace wsync {

struct CostAwareOptions {
  int64_t min_split_bytes = int64_t{16} << 20;
  double default_bytes_per_second = 1e9;
  // The most bytes one message carries: a region of more travels in several (the executor's
  // chunk at its default staging budget, executor/schedule.h).
  int64_t message_bytes = int64_t{32} << 20;
};

std::unique_ptr<ReplicaPolicy> MakeCostAwarePolicy(LinkFits fits, CostAwareOptions options = {});

}  // namespace wsync

#endif  // WSYNC_PLANNER_COST_AWARE_POLICY_H_
