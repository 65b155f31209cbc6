#ifndef WSYNC_EXECUTOR_SCHEDULE_H_
#define WSYNC_EXECUTOR_SCHEDULE_H_

// What one process runs for a batch of segments: rounds per peer and direction, the staging arena
// of each peer direction, and local copies. ScheduleTransfers reports it without buffers or
// communication; ExecuteTransfers (execute.h) runs exactly this, built by the same private
// computation (work.h), so a report cannot disagree with a run.
//
// Rules (decided from geometry alone, identically on both ends of every message):
// - Chunking: a segment of more than budget/2 bytes is cut along its outermost axis of extent > 1
//   into runs of whole rows of at most budget/2 bytes (one row per chunk when a row is larger).
//   A row larger than the whole budget that is not contiguous on a side that must stage it is
//   refused up front, with the sizes in the message.
// - Direct or staged, per side: a message of one chunk whose (shape, strides) on that side is
//   row-major packed (IsPacked: extent-1 axes ignored, zero extents packed) is sent from / received
//   into the weight buffer in place; any other message is packed into / unpacked from the arena.
// - Messages: per (sender, receiver) pair, chunks in canonical order; a chunk of more than 64 KiB
//   that is direct on either side travels alone; smaller chunks are packed together up to
//   budget/2 bytes. Message i of a pair is round i. Over a transport that needs round order
//   (Transport::NeedsRoundOrder: NCCL) the rounds run in lockstep, round r+1 posted while round
//   r completes; over any other each pair advances on its own with up to two messages posted,
//   so a slow pair (a shaped link) does not hold back the rounds of fast ones (shared memory).
//   Either way both ends post the same messages under the same rounds and tags.
// - Relays (planner/relay.h): a pair whose sender is a rollout process forwards (stage 2). Its
//   message goes in the round after every chunk it forwards has arrived at the relay (stage 1),
//   and after the pair's previous message, so forwarding round r overlaps receiving round r+1.
//   Pair by pair, a forward of round r goes out once every receive lane of the relay completed
//   its messages of rounds before r.
//   A box the relay only forwards lands in its relay arena, which must fit in the budget.
// - Arenas: a peer direction stages at most its largest staged message; it gets two slots (so the
//   pack of round r+1 and the unpack of round r-1 overlap round r) when two fit in the budget,
//   else one. Arena bytes never exceed the budget per peer direction, whatever their memory kind.
// - Memory kinds (memory_kinds.h): messages between two CUDA processes travel in CUDA memory,
//   all others in host memory; a side whose buffer is of the other kind stages (the pack or unpack
//   copies between the kinds), and an arena is of its pair's kind.
// - Quantization steps (executor/quant_work.h): a sender-side step's e4m3 bytes and scales are
//   two segments from the sender's quantization staging, a receiver-side step's gathers are
//   segments into the receiver's quantization arena; they are chunked, packed into messages and
//   given rounds by the rules above like any segment.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/plan.h"

namespace wsync {

inline constexpr int64_t kDefaultStagingBudgetBytes = int64_t{64} << 20;
// Chunks at or below this size are packed together with their neighbours even when direct.
inline constexpr int64_t kSmallChunkBytes = int64_t{64} << 10;

// Bytes a process may stage per peer and direction at one time. Held as configured (a double, as
// it may come from a config file or Python) and validated identically by ScheduleTransfers and
// ExecuteTransfers: an integer, at least one element of the job's largest dtype, and enough for the
// largest row that must be staged.
struct StagingBudget {
  double bytes = static_cast<double>(kDefaultStagingBudgetBytes);
};

// The processes taking part in a batch (global process ids). A process they do not name cannot be
// scheduled.
struct Endpoints {
  std::vector<int32_t> processes;
};

enum class Direction : uint8_t { kSend, kReceive };

struct ScheduledRound {
  int32_t round = 0;  // Global round: its index in the pair, but when forwarding.
  int64_t bytes = 0;
  int64_t elements = 0;
  int32_t chunks = 0;
  bool direct = false;  // This side uses the weight buffer in place.
};

// One peer and direction: the rounds this process exchanges with `peer`, in order.
struct PeerSchedule {
  int32_t peer = 0;
  Direction direction = Direction::kSend;
  std::vector<ScheduledRound> rounds;
  int32_t arena_slots = 0;
  int64_t arena_slot_bytes = 0;
  bool forwarding = false;  // Stage 2 of relays: the sender forwards what it received.
  // The memory its messages travel in and its arena lives in (executor/memory_kinds.h).
  MemoryKind arena_kind = MemoryKind::kHost;
  int64_t arena_bytes() const { return arena_slots * arena_slot_bytes; }
};

struct LocalCopy {
  int32_t segment = 0;  // Index into the batch's segments.
  int64_t bytes = 0;
  int64_t elements = 0;
};

struct ProcessSchedule {
  int32_t process = 0;
  std::vector<PeerSchedule> peers;  // Sends by peer, then receives by peer.
  std::vector<LocalCopy> local_copies;
  int32_t rounds = 0;    // The most rounds of any peer direction.
  int64_t segments = 0;  // Segments this process sends, receives or copies.
  int64_t chunks = 0;    // Chunks over all peer directions, plus one per local copy.
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t local_copy_bytes = 0;
  int64_t direct_bytes = 0;      // Sent or received in place.
  int64_t staged_bytes = 0;      // Sent or received through an arena.
  int64_t arena_bytes = 0;       // All arenas of this process at once: its peak staging memory.
  int64_t cuda_arena_bytes = 0;  // The part of arena_bytes in device memory (the rest is host).
  // Relays (zero without): bytes received from trainers that this process forwards (stage 1),
  // bytes it forwards and bytes forwarded to it (stage 2), its relay arena (also in arena_bytes),
  // and the inter-node bytes its forwards saved.
  int64_t relay_stage1_bytes = 0;
  int64_t forwarded_bytes = 0;
  int64_t forwarded_received_bytes = 0;
  int64_t relay_arena_bytes = 0;
  int64_t inter_node_bytes_saved = 0;
  // Quantization steps (zero without; executor/quant_work.h): the staging this process quantizes
  // its sender-side steps into, the arena its gathers land in (both also in arena_bytes), and the
  // elements it quantizes (whole blocks, sender- and receiver-side). The staging is laid out over
  // the rounds (a step's e4m3 blocks held from its first message to the one after its last) and
  // bounded as quant_work.h states; quant_staging_whole_bytes is what holding every step at
  // once would take (not allocated; for comparison).
  int64_t quant_staging_bytes = 0;
  int64_t quant_staging_whole_bytes = 0;
  int64_t quant_arena_bytes = 0;
  int64_t quantized_elements = 0;
};

// The schedule of `process` for `segments` (a plan's segments, all of them or those touching the
// process). Fails with InvalidArgument for a process the endpoints do not name, an invalid budget,
// or a segment that cannot be staged.
absl::StatusOr<ProcessSchedule> ScheduleTransfers(const Job& job,
                                                  absl::Span<const Segment> segments,
                                                  const Endpoints& endpoints,
                                                  const StagingBudget& budget, int32_t process);

// The same for a plan with quantization steps (Plan::quant, whole or this process's own): the
// schedule of what ExecuteTransfers runs with ExecuteOptions::quant = &quant. The overload
// without `quant` schedules the segments only (for a quantized job, not what runs).
absl::StatusOr<ProcessSchedule> ScheduleTransfers(const Job& job,
                                                  absl::Span<const Segment> segments,
                                                  const QuantPlan& quant,
                                                  const Endpoints& endpoints,
                                                  const StagingBudget& budget, int32_t process);

// The relay arena limit to plan with (RelayOptions::arena_bytes) under `budget`: its bytes when it
// is a non-negative integer, else 0 (no arena relays; the budget itself is refused when run).
int64_t RelayArenaLimit(const StagingBudget& budget);

// The schedule of every process the endpoints name, in endpoint order.
absl::StatusOr<std::vector<ProcessSchedule>> ScheduleTransfers(const Job& job,
                                                               absl::Span<const Segment> segments,
                                                               const Endpoints& endpoints,
                                                               const StagingBudget& budget);

}  // namespace wsync

#endif  // WSYNC_EXECUTOR_SCHEDULE_H_
