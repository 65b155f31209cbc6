#ifndef WSYNC_PLANNER_RELAY_PASS_H_
#define WSYNC_PLANNER_RELAY_PASS_H_

// Private to the planner: the relay pass MakePlan runs (rules in relay.h).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "planner/plan.h"

namespace wsync::planner_internal {

// Rewrites `segments` (every process's, coalesced, in canonical order) into direct, stage-1 and
// stage-2 segments as `options` decides, appending stage-1 segments into relay arenas, and returns
// the relays. Leaves the segments untouched for RelayMode::kNever.
std::vector<Relay> ApplyRelays(const Job& job, const RelayOptions& options,
                               std::vector<Segment>& segments);

// Bytes of the segments that cross a node boundary.
int64_t InterNodeBytes(const Job& job, const std::vector<Segment>& segments);

// The segments `process` takes part in, plus every segment that a process forwarding to it receives
// from a trainer (PlanOptions::process), in their order.
std::vector<Segment> SegmentsForProcess(const std::vector<Segment>& segments, const Job& job,
                                        int32_t process);

}  // namespace wsync::planner_internal

#endif  // WSYNC_PLANNER_RELAY_PASS_H_
