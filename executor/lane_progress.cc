#include "executor/lane_progress.h"

#include <algorithm>
#include <functional>
#include <limits>

namespace wsync::executor_internal {

LaneProgress::LaneProgress(const Work& work, int32_t rounds, int32_t in_flight)
    : work_(work),
      in_flight_limit_(in_flight),
      completed_(work.lanes.size(), 0),
      in_flight_(work.lanes.size()),
      receive_lanes_at_(rounds, 0),
      forwards_at_(rounds) {
  const int32_t lanes = static_cast<int32_t>(work.lanes.size());
  for (int32_t lane = 0; lane < lanes; ++lane) {
    const Lane& l = work.lanes[lane];
    unfinished_ += std::ssize(l.messages);
    if (l.direction == Direction::kReceive && !l.messages.empty()) {
      ++receive_lanes_at_[l.messages.front().round];
    }
    candidates_.push_back(lane);
  }
}

const std::vector<int32_t>& LaneProgress::Ready(absl::Span<const LaneState> lanes) {
  std::sort(candidates_.begin(), candidates_.end());
  candidates_.erase(std::unique(candidates_.begin(), candidates_.end()), candidates_.end());
  const int32_t landed = Landed();
  ready_.clear();
  for (int32_t lane : candidates_) {
    const Lane& l = work_.lanes[lane];
    const int32_t index = lanes[lane].posted;
    if (index == std::ssize(l.messages) || index - completed_[lane] >= in_flight_limit_) continue;
    const Message& next = l.messages[index];
    if (l.forwarding && l.direction == Direction::kSend && next.round > landed) {
      forwards_at_[next.round].push_back(lane);  // Above `landed`, so not released yet.
      continue;
    }
    if (!next.direct && lanes[lane].slot_busy[next.slot]) continue;
    ready_.push_back(lane);
  }
  candidates_.clear();
  return ready_;
}

void LaneProgress::Posted(int32_t lane, int32_t index, RequestId request) {
  in_flight_[lane].push_back({request, false});
  waited_.push_back(request);
  waited_at_.emplace_back(lane, index);
  candidates_.push_back(lane);
}

void LaneProgress::Finished(std::vector<size_t>& positions) {
  // From the last position down, so that moving the last request into a freed position never
  // moves one still to be handled.
  std::sort(positions.begin(), positions.end(), std::greater<>());
  for (size_t position : positions) {
    const auto [lane, index] = waited_at_[position];
    in_flight_[lane][index - completed_[lane]].done = true;
    touched_.push_back(lane);
    waited_[position] = waited_.back();
    waited_.pop_back();
    waited_at_[position] = waited_at_.back();
    waited_at_.pop_back();
  }
  std::sort(touched_.begin(), touched_.end());
  touched_.erase(std::unique(touched_.begin(), touched_.end()), touched_.end());
}

std::vector<RequestId> LaneProgress::Outstanding() const {
  std::vector<RequestId> requests;
  for (const std::deque<InFlight>& lane : in_flight_) {
    for (const InFlight& message : lane) {
      if (!message.done) requests.push_back(message.request);
    }
  }
  return requests;
}

void LaneProgress::Clear() {
  for (std::deque<InFlight>& lane : in_flight_) lane.clear();
  waited_.clear();
  waited_at_.clear();
  touched_.clear();
}

void LaneProgress::ReceiveCompleted(int32_t lane, int32_t index) {
  const std::vector<Message>& messages = work_.lanes[lane].messages;
  --receive_lanes_at_[messages[index].round];
  if (index + 1 < std::ssize(messages)) ++receive_lanes_at_[messages[index + 1].round];
}

void LaneProgress::ReleaseForwards() {
  const int32_t rounds = static_cast<int32_t>(forwards_at_.size());
  const int32_t through = std::min(Landed(), rounds - 1);
  for (; released_ <= through; ++released_) {
    std::vector<int32_t>& waiting = forwards_at_[released_];
    candidates_.insert(candidates_.end(), waiting.begin(), waiting.end());
    waiting.clear();
  }
}

int32_t LaneProgress::Landed() {
  // The cursor only moves forward: a receive lane's next round only grows.
  const int32_t rounds = static_cast<int32_t>(receive_lanes_at_.size());
  while (frontier_ < rounds && receive_lanes_at_[frontier_] == 0) ++frontier_;
  return frontier_ < rounds ? frontier_ : std::numeric_limits<int32_t>::max();
}

}  // namespace wsync::executor_internal
