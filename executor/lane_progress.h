#ifndef WSYNC_EXECUTOR_LANE_PROGRESS_H_
#define WSYNC_EXECUTOR_LANE_PROGRESS_H_

// Private to the executor (execute.cc): the bookkeeping of a run whose lanes advance on their own
// (Transport::NeedsRoundOrder false): which lanes may post their next message, the requests in
// flight and the lane message each one is, and which messages completed in lane order. Each post
// and completion costs constant amortized time plus sorting the few lanes one wait touched; no
// call passes over every lane or every message in flight (a pass per completion made one process
// sending 256 lanes of 60 messages cost 9.2e8 instructions per sync in tests/bench/executor_bench,
// 24 times what it costs now). Not thread-safe: one run's thread.

#include <array>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "executor/lane_state.h"
#include "executor/work.h"
#include "transport/transport.h"

namespace wsync::executor_internal {

class LaneProgress {
 public:
  // The lanes of `work` (which must outlive this), each keeping at most `in_flight` messages
  // posted and not completed; every message's round is below `rounds`.
  LaneProgress(const Work& work, int32_t rounds, int32_t in_flight);

  // The lanes that may post their next message now, ascending: a lane with fewer than `in_flight`
  // messages posted and not completed, whose next message (index `lanes[lane].posted`) is direct
  // or has its arena slot free (`lanes[lane].slot_busy`), and, for a forwarding send, whose round
  // is at most the round every receive lane of this process is at (the lowest round among their
  // next messages to complete; what it forwards arrived by then). Only lanes whose state may have
  // changed since the last call are looked at: every lane on the first call, then those that
  // posted or completed since, and forwards whose round the receive lanes reached.
  const std::vector<int32_t>& Ready(absl::Span<const LaneState> lanes);

  // Message `index` of `lane` (its next one) was posted as `request`.
  void Posted(int32_t lane, int32_t index, RequestId request);

  // The requests posted and not finished, in no particular order: what to wait on.
  absl::Span<const RequestId> waited() const { return waited_; }

  // The requests at `positions` of waited() finished (the transport released them); they leave
  // waited(). Reorders `positions`.
  void Finished(std::vector<size_t>& positions);

  // Completes every message whose lane's earlier messages all completed and that finished:
  // calls `completed(lane, index)` for each, lanes ascending, each lane's messages in order.
  template <typename Completed>
  void CompleteInOrder(Completed&& completed) {
    for (int32_t lane : touched_) {
      std::deque<InFlight>& in_flight = in_flight_[lane];
      while (!in_flight.empty() && in_flight.front().done) {
        in_flight.pop_front();
        const int32_t index = completed_[lane]++;
        --unfinished_;
        if (work_.lanes[lane].direction == Direction::kReceive) ReceiveCompleted(lane, index);
        completed(lane, index);
      }
      candidates_.push_back(lane);
    }
    touched_.clear();
    ReleaseForwards();
  }

  // Whether a lane has messages left to complete.
  bool unfinished() const { return unfinished_ > 0; }

  // The requests posted and not finished, lane by lane, oldest first.
  std::vector<RequestId> Outstanding() const;

  // Per lane: the messages completed so far (the index of the next one to complete).
  absl::Span<const int32_t> completed() const { return completed_; }

  // Forgets every request in flight (cancelled and released by the caller).
  void Clear();

 private:
  struct InFlight {
    RequestId request = 0;
    bool done = false;  // Finished (and released) while an earlier message of its lane was not.
  };

  // Receive lane `lane` completed message `index`: the frontier moves on.
  void ReceiveCompleted(int32_t lane, int32_t index);
  // Makes candidates of the forwards waiting for a round the receive lanes reached.
  void ReleaseForwards();
  // The round every receive lane reached: the lowest among their next messages to complete, or
  // the largest int32 when none has a message left.
  int32_t Landed();

  const Work& work_;
  const int32_t in_flight_limit_;
  std::vector<int32_t> completed_;  // Per lane: messages completed, the next one to complete.
  int64_t unfinished_ = 0;          // Messages not completed, over all lanes.
  std::vector<std::deque<InFlight>> in_flight_;  // Per lane: posted, not completed, oldest first.
  std::vector<RequestId> waited_;                // Posted and not finished.
  std::vector<std::pair<int32_t, int32_t>> waited_at_;  // (lane, message index) of each.
  std::vector<int32_t> candidates_;  // Lanes to look at in the next Ready, unsorted, repeats.
  std::vector<int32_t> ready_;       // What Ready returned.
  std::vector<int32_t> touched_;     // Lanes with a message finished since CompleteInOrder.
  // Per round: receive lanes whose next message to complete is of that round. The frontier
  // (Landed) is the first round with a lane, found by a cursor that only moves forward.
  std::vector<int32_t> receive_lanes_at_;
  int32_t frontier_ = 0;
  // Per round: forwarding sends whose next message is of that round, waiting for the frontier;
  // rounds below `released_` are emptied.
  std::vector<std::vector<int32_t>> forwards_at_;
  int32_t released_ = 0;
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_LANE_PROGRESS_H_
