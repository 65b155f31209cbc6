#ifndef WSYNC_PLANNER_POLICY_H_
#define WSYNC_PLANNER_POLICY_H_

// Built-in replica policies (both ignore the sync's fixed traffic).
//   first_holder              every request goes to its first holder (lowest process id).
//   local_first_least_loaded  a holder in the receiver's own process, else on its node, else any;
//                             among those, the fewest replica bytes assigned so far in this sync;
//                             ties to the lowest process id. Requests are answered in canonical
//                             order.

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/plan.h"

namespace wsync {

std::unique_ptr<ReplicaPolicy> MakeFirstHolderPolicy();
std::unique_ptr<ReplicaPolicy> MakeLocalFirstLeastLoadedPolicy();

// By name (see above); NotFound for anything else.
absl::StatusOr<std::unique_ptr<ReplicaPolicy>> MakeReplicaPolicy(absl::string_view name);

// Checks that `answer` tiles `request`'s region along axis 0 with valid holder indices. Used by the
// planner on every answer and available to policies and tests.
absl::Status CheckAnswer(const ReplicaRequest& request, const ReplicaAnswer& answer);

}  // namespace wsync

#endif  // WSYNC_PLANNER_POLICY_H_
