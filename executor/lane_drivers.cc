#include "executor/lane_drivers.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "executor/lane_progress.h"
#include "executor/stall_report.h"

namespace wsync::executor_internal {
namespace {

class LockstepDriver final : public LaneDriver {
 public:
  LockstepDriver(const Work& work, int32_t rounds, Transport& transport, absl::Time deadline)
      : work_(work), transport_(transport), deadline_(deadline), pending_(rounds) {}

  absl::Status Drive(RunSteps& run) override {
    const int32_t lanes = static_cast<int32_t>(work_.lanes.size());
    const int32_t rounds = static_cast<int32_t>(pending_.size());
    std::vector<int32_t> completed(lanes, 0);  // Next message of each lane to complete.
    std::vector<int32_t> ready;
    for (int32_t lane = 0; lane < lanes; ++lane) {
      if (NextInRound(lane, run.lane_states()[lane].posted, 0) != nullptr) ready.push_back(lane);
    }
    WSYNC_RETURN_IF_ERROR(run.PrepareNext(ready));
    for (int32_t r = 0; r < rounds; ++r) {
      // Round r+1 goes out now wherever its memory is free, overlapping round r. A forward goes
      // out once round r has landed, as what it forwards may arrive in round r.
      ready.clear();
      std::vector<int32_t> deferred;
      for (int32_t lane = 0; lane < lanes; ++lane) {
        const LaneState& state = run.lane_states()[lane];
        const Message* next = NextInRound(lane, state.posted, r + 1);
        if (next == nullptr) continue;
        const Lane& l = work_.lanes[lane];
        if (!(l.forwarding && l.direction == Direction::kSend) &&
            (next->direct || !state.slot_busy[next->slot])) {
          ready.push_back(lane);
        } else {
          deferred.push_back(lane);
        }
      }
      WSYNC_RETURN_IF_ERROR(run.PrepareNext(ready));
      if (absl::Status waited = transport_.WaitAll(pending_[r], deadline_); !waited.ok()) {
        return WithOutstanding(waited, work_, completed);
      }
      pending_[r].clear();
      std::vector<LaneMessage> received;
      for (int32_t lane = 0; lane < lanes; ++lane) {
        if (NextInRound(lane, completed[lane], r) == nullptr) continue;
        run.Completed(lane, completed[lane]++, received);
      }
      // Device unpacks of round r read arena slots that the deferred posts below may receive into.
      WSYNC_RETURN_IF_ERROR(run.Land(received));
      WSYNC_RETURN_IF_ERROR(run.PrepareNext(deferred));
    }
    return absl::OkStatus();
  }

  void Posted(int32_t lane, int32_t index, int32_t round, RequestId request) override {
    pending_[round].push_back(request);
  }

  // A round whose wait failed already released its requests (its list is then refused at once).
  void ReleaseOutstanding(Transport& transport, absl::Time grace) override {
    for (std::vector<RequestId>& requests : pending_) {
      if (!requests.empty()) transport.WaitAll(requests, grace).IgnoreError();
    }
  }

 private:
  // Message `index` of `lane` when it is in round `r`, else nullptr.
  const Message* NextInRound(int32_t lane, int32_t index, int32_t r) const {
    const std::vector<Message>& messages = work_.lanes[lane].messages;
    return index < static_cast<int32_t>(messages.size()) && messages[index].round == r
               ? &messages[index]
               : nullptr;
  }

  const Work& work_;
  Transport& transport_;
  const absl::Time deadline_;
  std::vector<std::vector<RequestId>> pending_;  // Posted requests by round.
};

// Each pair advances on its own: a lane keeps up to kLaneMessagesInFlight messages posted, the
// next going out as soon as one completes and its slot is free, so a slow pair (a shaped link)
// does not hold back the rounds of fast ones (shared memory) as lockstep rounds do. A forwarding
// send of round r waits until every receive lane of this process completed its messages of rounds
// before r (what it forwards arrived by then). Messages complete, unpack and verify in lane order.
// The bookkeeping (lane_progress.h) costs O(log lanes) per message at most.
class IndependentLanesDriver final : public LaneDriver {
 public:
  static constexpr int32_t kLaneMessagesInFlight = 2;

  IndependentLanesDriver(const Work& work, int32_t rounds, Transport& transport,
                         absl::Time deadline)
      : work_(work),
        transport_(transport),
        deadline_(deadline),
        progress_(work, rounds, kLaneMessagesInFlight) {}

  absl::Status Drive(RunSteps& run) override {
    std::vector<size_t> finished;
    std::vector<LaneMessage> received;
    for (;;) {
      // Post until no lane may post more; PrepareNext posts one message per ready lane.
      for (;;) {
        const std::vector<int32_t>& ready = progress_.Ready(run.lane_states());
        if (ready.empty()) break;
        WSYNC_RETURN_IF_ERROR(run.PrepareNext(ready));
      }
      if (!progress_.unfinished()) return absl::OkStatus();
      if (progress_.waited().empty()) {
        return absl::InternalError(
            absl::StrCat("process ", work_.process, ": lanes unfinished with nothing in flight"));
      }
      finished.clear();
      const absl::Status waited_status =
          transport_.WaitAny(progress_.waited(), deadline_, &finished);
      progress_.Finished(finished);
      if (absl::IsDeadlineExceeded(waited_status) && finished.empty()) {
        // WaitAll past the deadline cancels them all and names the peers they wait for.
        const absl::Status named = transport_.WaitAll(progress_.Outstanding(), deadline_);
        progress_.Clear();
        return WithOutstanding(named.ok() ? waited_status : named, work_, progress_.completed());
      }
      if (!waited_status.ok()) {
        return WithOutstanding(waited_status, work_, progress_.completed());
      }

      received.clear();
      progress_.CompleteInOrder(
          [&](int32_t lane, int32_t index) { run.Completed(lane, index, received); });
      WSYNC_RETURN_IF_ERROR(run.Land(received));  // Later receives may land in the slots it reads.
    }
  }

  void Posted(int32_t lane, int32_t index, int32_t round, RequestId request) override {
    progress_.Posted(lane, index, request);
  }

  void ReleaseOutstanding(Transport& transport, absl::Time grace) override {
    const std::vector<RequestId> in_flight = progress_.Outstanding();
    if (!in_flight.empty()) transport.WaitAll(in_flight, grace).IgnoreError();
  }

 private:
  const Work& work_;
  Transport& transport_;
  const absl::Time deadline_;
  LaneProgress progress_;
};

}  // namespace

std::unique_ptr<LaneDriver> MakeLockstepDriver(const Work& work, int32_t rounds,
                                               Transport& transport, absl::Time deadline) {
  return std::make_unique<LockstepDriver>(work, rounds, transport, deadline);
}

std::unique_ptr<LaneDriver> MakeIndependentLanesDriver(const Work& work, int32_t rounds,
                                                       Transport& transport, absl::Time deadline) {
  return std::make_unique<IndependentLanesDriver>(work, rounds, transport, deadline);
}

}  // namespace wsync::executor_internal
