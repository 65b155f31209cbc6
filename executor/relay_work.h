#ifndef WSYNC_EXECUTOR_RELAY_WORK_H_
#define WSYNC_EXECUTOR_RELAY_WORK_H_

// Private to the executor: what relayed plans (planner/relay.h) add to a process's work.
//
// A forwarding lane is one whose sender is a rollout process: it carries stage-2 segments, each
// reading exactly what one stage-1 segment (from a trainer) delivered to the relay. A stage-2
// segment has the stage-1 segment's box, so both are cut into the same chunks. Chunk i of a
// forward may go out once chunk i of its stage-1 segment has landed at the relay: a forwarding
// message gets the round after the latest round any of its chunks' stage-1 chunks arrived in (and
// after its lane's previous message), so forwarding round r overlaps receiving round r + 1. Every
// other message's round is its index in its lane. Both ends of a forwarding lane compute the same
// rounds: the receiver rebuilds the relay's receive lanes from the segments the relay receives from
// trainers, which a relayed plan of one process lists (PlanOptions::process).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "executor/work.h"

namespace wsync::executor_internal {

// Marks forwarding lanes, numbers every message's round and sizes the relay arena (the furthest
// byte a stage-1 segment writes into this process's relay arena). InvalidArgument for a forward
// whose stage-1 segment is not in the batch, or a relay arena larger than the staging budget.
absl::Status AssignRelayRounds(const Job& job, absl::Span<const Segment> segments,
                               const Endpoints& endpoints, const StagingBudget& budget, Work& work);

// Adds the relay figures of `work` to `schedule`: forwarded bytes, stage-1 bytes, relay arena
// (also in arena_bytes) and inter-node bytes saved.
void SummarizeRelays(const Job& job, const Work& work, absl::Span<const Segment> segments,
                     ProcessSchedule& schedule);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_RELAY_WORK_H_
