#ifndef WSYNC_EXECUTOR_WORK_H_
#define WSYNC_EXECUTOR_WORK_H_

// Private to the executor: the one computation that both ScheduleTransfers reports and
// ExecuteTransfers runs. Not part of the executor's API; include only from executor/*.cc and
// executor tests.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/memory_kind.h"
#include "executor/schedule.h"

namespace wsync::executor_internal {

// A segment, or a run of whole rows of it along its outermost axis of extent > 1.
struct Chunk {
  int32_t segment = 0;
  Dims shape;
  int64_t from_offset = 0;  // Elements, in the sender's buffer.
  int64_t to_offset = 0;    // Elements, in the receiver's buffer.
  int64_t element_size = 0;
  int64_t bytes = 0;
  // The chunk can be sent from / received into its buffer in place on that side: row-major packed
  // there (IsPacked) and its buffer of the memory kind its pair's messages travel in
  // (memory_kinds.h). Otherwise that side stages it.
  bool from_packed = false;
  bool to_packed = false;
  MemoryKind from_kind = MemoryKind::kHost;  // Of the buffers on each side.
  MemoryKind to_kind = MemoryKind::kHost;
};

struct Message {
  std::vector<int32_t> chunks;  // Indices into Work::chunks, in pack order.
  int64_t bytes = 0;
  int64_t elements = 0;
  bool direct = false;  // This process's side uses the weight buffer in place.
  int32_t slot = -1;    // Arena slot on this side when staged.
  int32_t round = 0;    // Its index in its lane, but in forwarding lanes (relay_work.h).
};

// One peer and direction of this process.
struct Lane {
  int32_t peer = 0;
  Direction direction = Direction::kSend;
  std::vector<Message> messages;  // Rounds strictly increasing.
  int32_t slots = 0;
  int64_t slot_bytes = 0;
  bool forwarding = false;              // Stage 2 of relays: the sender is a rollout process.
  MemoryKind kind = MemoryKind::kHost;  // Of its messages and so of its arena (memory_kinds.h).
};

struct Work {
  int32_t process = 0;
  int64_t budget_bytes = 0;
  std::vector<Chunk> chunks;
  std::vector<Lane> lanes;              // Sends by peer, then receives by peer.
  std::vector<int32_t> local_segments;  // Segments copied within this process.
  int64_t segments = 0;                 // Segments this process takes part in.
  int64_t relay_arena_bytes = 0;        // Where stage 1 lands for boxes this process only relays.
  MemoryKind relay_arena_kind = MemoryKind::kHost;
  bool any_cuda = false;  // Some buffer of the job is CUDA memory.
  // Quantization steps (quant_work.h): this process's staging of sender-side output (as laid out,
  // and every step at once), its arena of gathers, and the elements it quantizes.
  int64_t quant_staging_bytes = 0;
  int64_t quant_staging_whole_bytes = 0;
  int64_t quant_arena_bytes = 0;
  int64_t quantized_elements = 0;
};

// The budget in bytes when it is a non-negative integer (at most 2^62).
std::optional<int64_t> IntegerBudgetBytes(const StagingBudget& budget);

// The budget in bytes when it is an integer of at least one element of the job's largest dtype.
absl::StatusOr<int64_t> ValidateBudget(const Job& job, const StagingBudget& budget);

// Chunks, lanes, messages and arena slots of `process`, every message's round its index.
absl::StatusOr<Work> BuildLanes(const Job& job, absl::Span<const Segment> segments,
                                const Endpoints& endpoints, const StagingBudget& budget,
                                int32_t process);

// BuildLanes, then the rounds and relay arena of relayed plans (relay_work.h).
absl::StatusOr<Work> BuildWork(const Job& job, absl::Span<const Segment> segments,
                               const Endpoints& endpoints, const StagingBudget& budget,
                               int32_t process);

ProcessSchedule Summarize(const Job& job, const Work& work, absl::Span<const Segment> segments);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_WORK_H_
