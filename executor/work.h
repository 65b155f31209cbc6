#ifndef WSYNC_EXECUTOR_WORK_H_
#define WSYNC_EXECUTOR_WORK_H_

// Private to the executor: the one computation that both ScheduleTransfers reports and
// ExecuteTransfers runs. Not part of the executor's API; include only from executor/*.cc and
// executor tests.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
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
  bool from_packed = false;
  bool to_packed = false;
};

struct Message {
  std::vector<int32_t> chunks;  // Indices into Work::chunks, in pack order.
  int64_t bytes = 0;
  int64_t elements = 0;
  bool direct = false;  // This process's side uses the weight buffer in place.
  int32_t slot = -1;    // Arena slot on this side when staged.
};

// One peer and direction of this process.
struct Lane {
  int32_t peer = 0;
  Direction direction = Direction::kSend;
  std::vector<Message> messages;  // Message i is round i.
  int32_t slots = 0;
  int64_t slot_bytes = 0;
};

struct Work {
  int32_t process = 0;
  int64_t budget_bytes = 0;
  std::vector<Chunk> chunks;
  std::vector<Lane> lanes;              // Sends by peer, then receives by peer.
  std::vector<int32_t> local_segments;  // Segments copied within this process.
  int64_t segments = 0;                 // Segments this process takes part in.
};

// The budget in bytes when it is an integer of at least one element of the job's largest dtype.
absl::StatusOr<int64_t> ValidateBudget(const Job& job, const StagingBudget& budget);

absl::StatusOr<Work> BuildWork(const Job& job, absl::Span<const Segment> segments,
                               const Endpoints& endpoints, const StagingBudget& budget,
                               int32_t process);

ProcessSchedule Summarize(const Job& job, const Work& work, absl::Span<const Segment> segments);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_WORK_H_
