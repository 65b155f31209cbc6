#ifndef WSYNC_EXECUTOR_LANE_STATE_H_
#define WSYNC_EXECUTOR_LANE_STATE_H_

// Private to the executor: where one lane of a run stands (work.h: a lane is the ordered messages
// between this process and one peer in one direction). One per lane, owned by the run
// (run.h) and read by the lane drivers (lane_drivers.h) and LaneProgress. Not thread-safe: the
// run's thread only.

#include <array>
#include <cstdint>

namespace wsync::executor_internal {

struct LaneState {
  int32_t posted = 0;         // Messages posted: the index of the next one.
  int32_t packed_ahead = -1;  // The staged send last packed ahead of its round, or -1.
  int32_t last_staged = -1;   // The index of the lane's last staged message, or -1.
  // Per arena slot: a posted message uses it (until it completed, and for a receive until it was
  // unpacked).
  std::array<bool, 2> slot_busy = {false, false};
  char* arena = nullptr;  // The lane's staging arena (slots x slot bytes), owned by a cache.
  // Set by PrepareNext when it posts this lane's next message, valid in the call numbered
  // `due_call` only: where a look-ahead starts (after that message), the slot that message
  // fills, if any, and whether it is a staged send packed now. A lane that packs a message due
  // now looks no further: its next staged send would line up with its own rows, not with another
  // peer's.
  int64_t due_call = -1;
  int32_t due_first = 0;
  int32_t due_busy_slot = -1;
  bool due_packs = false;
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_LANE_STATE_H_
