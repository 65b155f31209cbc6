#include "executor/relay_work.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "planner/relay.h"
#include "transport/transport.h"

namespace wsync::executor_internal {
namespace {

// (param, box origin, box extent, process, buffer, offset, strides) of one end of a segment.
using DeliveryKey = std::tuple<int32_t, Dims, Dims, int32_t, uint64_t, int64_t, Dims>;

DeliveryKey KeyOf(const Segment& s, const Endpoint& end) {
  return {s.param, s.box.origin, s.box.extent, end.process, end.buffer, end.offset, end.strides};
}

int32_t SenderOf(const Work& work, const Lane& lane) {
  return lane.direction == Direction::kSend ? work.process : lane.peer;
}

int64_t SegmentBytes(const Job& job, const Segment& s) {
  return Volume(s.box) * job.ElementSize(s.param);
}

// Index of each segment's first chunk in `work.chunks` (a segment's chunks are consecutive).
absl::flat_hash_map<int32_t, int32_t> FirstChunks(const Work& work) {
  absl::flat_hash_map<int32_t, int32_t> first;
  for (int32_t c = 0; c < static_cast<int32_t>(work.chunks.size()); ++c) {
    first.emplace(work.chunks[c].segment, c);
  }
  return first;
}

// The round in which each chunk of each segment that `relay_work`'s process receives from a
// trainer arrives, by segment index and chunk ordinal; -1 for none.
absl::flat_hash_map<int32_t, std::vector<int32_t>> ArrivalRounds(const Job& job,
                                                                 const Work& relay_work) {
  const absl::flat_hash_map<int32_t, int32_t> first = FirstChunks(relay_work);
  absl::flat_hash_map<int32_t, std::vector<int32_t>> arrivals;
  for (const Lane& lane : relay_work.lanes) {
    if (lane.direction != Direction::kReceive || !job.IsSource(lane.peer)) continue;
    for (int32_t m = 0; m < static_cast<int32_t>(lane.messages.size()); ++m) {
      for (int32_t c : lane.messages[m].chunks) {
        const int32_t segment = relay_work.chunks[c].segment;
        std::vector<int32_t>& rounds = arrivals[segment];
        const int32_t ordinal = c - first.at(segment);
        if (static_cast<int32_t>(rounds.size()) <= ordinal) rounds.resize(ordinal + 1, -1);
        rounds[ordinal] = m;
      }
    }
  }
  return arrivals;
}

}  // namespace

absl::Status AssignRelayRounds(const Job& job, absl::Span<const Segment> segments,
                               const Endpoints& endpoints, const StagingBudget& budget,
                               Work& work) {
  bool forwards = false;
  for (Lane& lane : work.lanes) {
    lane.forwarding = !job.IsSource(SenderOf(work, lane));
    forwards = forwards || lane.forwarding;
    for (int32_t i = 0; i < static_cast<int32_t>(lane.messages.size()); ++i) {
      lane.messages[i].round = i;
    }
  }
  for (const Segment& s : segments) {
    if (s.to.process != work.process || s.to.buffer != kRelayArenaBuffer) continue;
    work.relay_arena_bytes = std::max(
        work.relay_arena_bytes, s.to.offset * job.ElementSize(s.param) + SegmentBytes(job, s));
  }
  if (work.relay_arena_bytes > work.budget_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("process ", work.process, " would hold a relay arena of ",
                     work.relay_arena_bytes, " bytes, more than the staging budget of ",
                     work.budget_bytes, " bytes; plan with a relay arena limit within the budget"));
  }
  if (!forwards) return absl::OkStatus();

  absl::flat_hash_map<DeliveryKey, int32_t> stage1;  // Where trainers' segments land.
  for (int32_t i = 0; i < static_cast<int32_t>(segments.size()); ++i) {
    if (job.IsSource(segments[i].from.process))
      stage1.emplace(KeyOf(segments[i], segments[i].to), i);
  }
  const absl::flat_hash_map<int32_t, int32_t> first = FirstChunks(work);
  std::map<int32_t, absl::flat_hash_map<int32_t, std::vector<int32_t>>> arrivals_by_relay;
  for (Lane& lane : work.lanes) {
    if (!lane.forwarding) continue;
    const int32_t relay = SenderOf(work, lane);
    auto found = arrivals_by_relay.find(relay);
    if (found == arrivals_by_relay.end()) {
      if (relay == work.process) {
        found = arrivals_by_relay.emplace(relay, ArrivalRounds(job, work)).first;
      } else {
        WSYNC_ASSIGN_OR_RETURN(const Work relay_work,
                               BuildLanes(job, segments, endpoints, budget, relay));
        found = arrivals_by_relay.emplace(relay, ArrivalRounds(job, relay_work)).first;
      }
    }
    const auto& arrivals = found->second;
    int32_t previous = -1;
    for (Message& message : lane.messages) {
      int32_t ready = 0;
      for (int32_t c : message.chunks) {
        const Segment& forward = segments[work.chunks[c].segment];
        const auto source = stage1.find(KeyOf(forward, forward.from));
        const auto rounds = source == stage1.end() ? arrivals.end() : arrivals.find(source->second);
        const int32_t ordinal = c - first.at(work.chunks[c].segment);
        if (rounds == arrivals.end() || ordinal >= static_cast<int32_t>(rounds->second.size()) ||
            rounds->second[ordinal] < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "process ", relay, " forwards parameter '", job.target().params[forward.param].name,
              "' box ", BoxToString(forward.box), " to process ", forward.to.process,
              " but the batch has no segment from a trainer delivering it there"));
        }
        ready = std::max(ready, rounds->second[ordinal] + 1);
      }
      message.round = std::max(ready, previous + 1);
      previous = message.round;
      if (message.round >= kMaxRounds) {
        return absl::InvalidArgumentError(absl::StrCat("process ", work.process,
                                                       " would need more than ", kMaxRounds,
                                                       " rounds; raise the staging budget"));
      }
    }
  }
  return absl::OkStatus();
}

void SummarizeRelays(const Job& job, const Work& work, absl::Span<const Segment> segments,
                     ProcessSchedule& schedule) {
  for (const Lane& lane : work.lanes) {
    if (!lane.forwarding) continue;
    for (const Message& message : lane.messages) {
      (lane.direction == Direction::kSend ? schedule.forwarded_bytes
                                          : schedule.forwarded_received_bytes) += message.bytes;
    }
  }
  absl::flat_hash_set<DeliveryKey> forwarded;  // What this process forwards, by where it reads.
  for (const Segment& s : segments) {
    if (s.from.process == work.process && !job.IsSource(s.from.process)) {
      forwarded.insert(KeyOf(s, s.from));
    }
  }
  int64_t arena_stage1_bytes = 0;
  for (const Segment& s : segments) {
    if (s.to.process != work.process || !job.IsSource(s.from.process) ||
        !forwarded.contains(KeyOf(s, s.to))) {
      continue;
    }
    schedule.relay_stage1_bytes += SegmentBytes(job, s);
    if (s.to.buffer == kRelayArenaBuffer) arena_stage1_bytes += SegmentBytes(job, s);
  }
  // Each forward replaced a send across the node boundary; a box held only in the arena crossed
  // for nobody's own use.
  schedule.inter_node_bytes_saved = schedule.forwarded_bytes - arena_stage1_bytes;
  schedule.relay_arena_bytes = work.relay_arena_bytes;
  schedule.arena_bytes += work.relay_arena_bytes;
}

}  // namespace wsync::executor_internal
