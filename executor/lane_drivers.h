#ifndef WSYNC_EXECUTOR_LANE_DRIVERS_H_
#define WSYNC_EXECUTOR_LANE_DRIVERS_H_

// Private to the executor: the two orders in which a run (run.h) posts and completes its lanes'
// messages, behind one interface.
// - Lockstep (MakeLockstepDriver), for transports that need round order
//   (Transport::NeedsRoundOrder, e.g. NCCL): round r+1 is posted wherever its memory is free while
//   round r is in flight; every request of round r is waited for before the round lands.
// - Independent lanes (MakeIndependentLanesDriver): each pair advances on its own, up to a few
//   messages in flight per lane (LaneProgress), so that a slow pair does not hold back fast ones.
// Not thread-safe: the run's thread only.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/lane_state.h"
#include "executor/work.h"
#include "transport/transport.h"

namespace wsync::executor_internal {

// A completed message: (lane, message index).
using LaneMessage = std::pair<int32_t, int32_t>;

// What a driver asks of the run it drives.
class RunSteps {
 public:
  virtual ~RunSteps() = default;
  // Packs (where staged) and posts the next message of each of `lanes`; each post is reported to
  // the driver (LaneDriver::Posted). Stops at the first failure.
  virtual absl::Status PrepareNext(absl::Span<const int32_t> lanes) = 0;
  // Message `index` of `lane` completed: frees its slot (a send's) and adds a receive to
  // `received`.
  virtual void Completed(int32_t lane, int32_t index, std::vector<LaneMessage>& received) = 0;
  // Unpacks and verifies completed receives; their slots are free afterwards.
  virtual absl::Status Land(absl::Span<const LaneMessage> received) = 0;
  virtual absl::Span<const LaneState> lane_states() const = 0;
};

class LaneDriver {
 public:
  virtual ~LaneDriver() = default;
  // Posts and completes every message of every lane through `run`. The first error ends it.
  virtual absl::Status Drive(RunSteps& run) = 0;
  // Message `index` of `lane` (in round `round`) was posted as `request`.
  virtual void Posted(int32_t lane, int32_t index, int32_t round, RequestId request) = 0;
  // After a failure: waits until `grace` for what is still posted (a peer's large send to this
  // process, this process's sends); the rest is cancelled and every request released.
  virtual void ReleaseOutstanding(Transport& transport, absl::Time grace) = 0;
};

// `work` and `transport` must outlive the driver; `deadline` bounds every wait.
std::unique_ptr<LaneDriver> MakeLockstepDriver(const Work& work, int32_t rounds,
                                               Transport& transport, absl::Time deadline);
std::unique_ptr<LaneDriver> MakeIndependentLanesDriver(const Work& work, int32_t rounds,
                                                       Transport& transport, absl::Time deadline);

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_LANE_DRIVERS_H_
