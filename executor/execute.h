#ifndef WSYNC_EXECUTOR_EXECUTE_H_
#define WSYNC_EXECUTOR_EXECUTE_H_

// Runs one process's part of a batch of segments over a Transport: agrees with every other
// process on the plan digest and budget, then runs the rounds of its schedule (schedule.h) with
// double-buffered arenas, and the local copies.

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/schedule.h"
#include "transport/transport.h"

namespace wsync {

// Base addresses of this process's buffers by buffer id (sizes come from the layout). Host memory.
using LocalBuffers = absl::flat_hash_map<uint64_t, void*>;

struct ExecuteOptions {
  uint64_t sync_id = 0;      // Goes into every message tag.
  uint64_t plan_digest = 0;  // Plan::digest; compared across processes before any byte moves.
  absl::Time deadline = absl::InfiniteFuture();
};

// What a run did, counted as it ran. For the same inputs every figure equals the schedule's:
// segments, chunks, rounds, sent, received, local-copy, direct and staged bytes and peak arena
// bytes.
struct TransferStats {
  int64_t segments = 0;
  int64_t chunks = 0;
  int64_t rounds = 0;
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t local_copy_bytes = 0;
  int64_t direct_bytes = 0;
  int64_t staged_bytes = 0;
  int64_t peak_arena_bytes = 0;
  double seconds = 0;         // Wall time of the run, agreement excluded.
  double pack_seconds = 0;    // Spent packing staged sends into arenas.
  double unpack_seconds = 0;  // Spent unpacking staged receives from arenas.
};

// Agrees with every process of `group` on (plan digest, budget, local status), then runs.
// A local rejection (bad budget, missing buffer, unschedulable segment) or a digest that differs
// fails every process with the reason, before any byte moves. Transport errors and the deadline
// end the run with the error; the target buffers are then partially written and must be treated
// as dirty by the caller.
absl::StatusOr<TransferStats> ExecuteTransfers(const Job& job, absl::Span<const Segment> segments,
                                               const Endpoints& endpoints,
                                               const StagingBudget& budget, int32_t process,
                                               const LocalBuffers& buffers, Transport& transport,
                                               Group& group, const ExecuteOptions& options);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_EXECUTE_H_
