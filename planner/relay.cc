#include "planner/relay.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "planner/relay_pass.h"

namespace wsync {

absl::string_view RelayModeName(RelayMode mode) {
  switch (mode) {
    case RelayMode::kNever:
      return "never";
    case RelayMode::kAlways:
      return "always";
    case RelayMode::kAuto:
      return "auto";
  }
  return "?";
}

absl::StatusOr<RelayMode> ParseRelayMode(absl::string_view name) {
  for (RelayMode mode : {RelayMode::kNever, RelayMode::kAlways, RelayMode::kAuto}) {
    if (name == RelayModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("relay mode '", name, "' is not one of never, always, auto"));
}

namespace planner_internal {
namespace {

// (target node, parameter, box origin, box extent).
using GroupKey = std::tuple<int32_t, int32_t, Dims, Dims>;

// A relay candidate: the first segment of each distinct receiver of one group.
struct Group {
  GroupKey key;
  std::vector<int32_t> needs;  // Segment indices, one per receiver, ascending by receiver.
  int64_t bytes = 0;
};

bool IsInterNodeFromTrainer(const Job& job, const Segment& s) {
  return job.IsSource(s.from.process) && !job.IsSource(s.to.process) &&
         job.PathClass(s.from.process, s.to.process) == kPathInterNode;
}

int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

std::vector<Group> FindGroups(const Job& job, const std::vector<Segment>& segments) {
  std::map<GroupKey, std::vector<int32_t>> by_key;
  for (int32_t i = 0; i < static_cast<int32_t>(segments.size()); ++i) {
    const Segment& s = segments[i];
    if (!IsInterNodeFromTrainer(job, s)) continue;
    by_key[{job.NodeIndex(s.to.process), s.param, s.box.origin, s.box.extent}].push_back(i);
  }
  std::vector<Group> groups;
  for (auto& [key, indices] : by_key) {
    Group group{key, {}, 0};
    std::map<int32_t, int32_t> first_by_receiver;
    for (int32_t index : indices) first_by_receiver.emplace(segments[index].to.process, index);
    if (first_by_receiver.size() < 2) continue;
    for (const auto& [receiver, index] : first_by_receiver) group.needs.push_back(index);
    const Segment& any = segments[indices[0]];
    group.bytes = Volume(any.box) * job.ElementSize(any.param);
    groups.push_back(std::move(group));
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.bytes > b.bytes; });
  return groups;
}

// The cost model's seconds for one group alone, direct and relayed; nullopt when the fits cannot
// price a path the group uses. A relayed group's second hop leaves only once its first has
// landed (executor: a forward goes out in the round after its stage-1 chunks), so the two hops
// are priced one after the other, each with its own latency.
std::optional<std::pair<double, double>> PredictGroup(const Job& job, const LinkFits& fits,
                                                      const std::vector<Segment>& segments,
                                                      const Group& group, int32_t sender,
                                                      int32_t relay) {
  Traffic direct;
  direct.rounds = 1;
  for (int32_t index : group.needs) {
    const Segment& s = segments[index];
    direct.pairs.push_back(PairTraffic{s.from.process, s.to.process,
                                       std::string(job.PathClass(s.from.process, s.to.process)),
                                       group.bytes, 1});
  }
  Traffic first_hop;
  first_hop.rounds = 1;
  first_hop.pairs.push_back(
      PairTraffic{sender, relay, std::string(job.PathClass(sender, relay)), group.bytes, 1});
  Traffic second_hop;
  second_hop.rounds = 1;
  for (int32_t index : group.needs) {
    const int32_t receiver = segments[index].to.process;
    if (receiver == relay) continue;
    second_hop.pairs.push_back(
        PairTraffic{relay, receiver, std::string(job.PathClass(relay, receiver)), group.bytes, 1});
  }
  absl::StatusOr<Prediction> direct_seconds = Predict(fits, direct);
  absl::StatusOr<Prediction> first_seconds = Predict(fits, first_hop);
  absl::StatusOr<Prediction> second_seconds = Predict(fits, second_hop);
  if (!direct_seconds.ok() || !first_seconds.ok() || !second_seconds.ok()) return std::nullopt;
  return std::make_pair(direct_seconds->seconds, first_seconds->seconds + second_seconds->seconds);
}

}  // namespace

int64_t InterNodeBytes(const Job& job, const std::vector<Segment>& segments) {
  int64_t bytes = 0;
  for (const Segment& s : segments) {
    if (job.PathClass(s.from.process, s.to.process) == kPathInterNode) {
      bytes += Volume(s.box) * job.ElementSize(s.param);
    }
  }
  return bytes;
}

std::vector<Relay> ApplyRelays(const Job& job, const RelayOptions& options,
                               std::vector<Segment>& segments) {
  std::vector<Relay> relays;
  if (options.mode == RelayMode::kNever) return relays;
  const int32_t processes = job.num_processes();
  std::vector<int64_t> egress(processes, 0);  // Inter-node bytes each sender has left to send.
  for (const Segment& s : segments) {
    if (IsInterNodeFromTrainer(job, s)) {
      egress[s.from.process] += Volume(s.box) * job.ElementSize(s.param);
    }
  }
  std::map<int32_t, std::vector<int32_t>> node_targets;  // Target processes by node, ascending.
  for (int32_t p = 0; p < processes; ++p) {
    if (!job.IsSource(p)) node_targets[job.NodeIndex(p)].push_back(p);
  }
  std::vector<int64_t> forwarded(processes, 0);
  std::vector<int64_t> arena_used(processes, 0);
  std::vector<Segment> arena_segments;

  for (const Group& group : FindGroups(job, segments)) {
    absl::flat_hash_set<int32_t> receivers;
    int32_t sender = -1;
    for (int32_t index : group.needs) {
      const Segment& s = segments[index];
      receivers.insert(s.to.process);
      const int32_t from = s.from.process;
      if (sender < 0 || std::tie(egress[from], from) < std::tie(egress[sender], sender)) {
        sender = from;
      }
    }
    Endpoint stage1_from;
    for (int32_t index : group.needs) {
      if (segments[index].from.process == sender) {
        stage1_from = segments[index].from;
        break;
      }
    }
    const int64_t k = static_cast<int64_t>(group.needs.size());
    int32_t relay = -1;
    std::tuple<int64_t, bool, int32_t> best;
    for (int32_t candidate : node_targets[std::get<0>(group.key)]) {
      const bool receives = receivers.contains(candidate);
      if (!receives && AlignUp(arena_used[candidate], kRelayArenaAlignment) + group.bytes >
                           options.arena_bytes) {
        continue;
      }
      const std::tuple<int64_t, bool, int32_t> score{
          forwarded[candidate] + (receives ? k - 1 : k) * group.bytes, !receives, candidate};
      if (relay < 0 || score < best) {
        relay = candidate;
        best = score;
      }
    }
    if (relay < 0) continue;  // Unreachable: every receiver is a candidate.

    Relay record;
    record.param = std::get<1>(group.key);
    record.box = Box{std::get<2>(group.key), std::get<3>(group.key)};
    record.node = std::get<0>(group.key);
    record.sender = sender;
    record.relay = relay;
    record.bytes = group.bytes;
    bool take = options.mode == RelayMode::kAlways;
    if (options.mode == RelayMode::kAuto) {
      std::optional<std::pair<double, double>> seconds;
      if (options.fits != nullptr) {
        seconds = PredictGroup(job, *options.fits, segments, group, sender, relay);
      }
      if (seconds) {
        record.predicted_direct_seconds = seconds->first;
        record.predicted_relay_seconds = seconds->second;
        take = seconds->second < seconds->first;
      } else {
        take = group.bytes >= options.min_relay_bytes;
      }
    }
    if (!take) continue;

    // Stage 1, then stage 2 from where stage 1 lands.
    Endpoint stage2_from;
    record.in_arena = !receivers.contains(relay);
    if (record.in_arena) {
      record.arena_offset_bytes = AlignUp(arena_used[relay], kRelayArenaAlignment);
      arena_used[relay] = record.arena_offset_bytes + group.bytes;
      stage2_from = Endpoint{relay, kRelayArenaBuffer,
                             record.arena_offset_bytes / job.ElementSize(record.param),
                             RowMajorStrides(record.box.extent)};
      arena_segments.push_back(Segment{record.param, record.box, stage1_from, stage2_from});
    }
    for (int32_t index : group.needs) {
      Segment& s = segments[index];
      egress[s.from.process] -= group.bytes;
      if (s.to.process == relay) {
        s.from = stage1_from;
        stage2_from = s.to;
      }
    }
    egress[sender] += group.bytes;
    for (int32_t index : group.needs) {
      Segment& s = segments[index];
      if (s.to.process == relay) continue;
      s.from = stage2_from;
      record.receivers.push_back(s.to.process);
    }
    forwarded[relay] += static_cast<int64_t>(record.receivers.size()) * group.bytes;
    relays.push_back(std::move(record));
  }
  for (Segment& s : arena_segments) segments.push_back(std::move(s));
  return relays;
}

std::vector<Segment> SegmentsForProcess(const std::vector<Segment>& segments, const Job& job,
                                        int32_t process) {
  absl::flat_hash_set<int32_t> feeders;  // Processes that forward to `process`.
  for (const Segment& s : segments) {
    if (s.to.process == process && !job.IsSource(s.from.process)) feeders.insert(s.from.process);
  }
  std::vector<Segment> mine;
  for (const Segment& s : segments) {
    if (s.from.process == process || s.to.process == process ||
        (feeders.contains(s.to.process) && job.IsSource(s.from.process))) {
      mine.push_back(s);
    }
  }
  return mine;
}

}  // namespace planner_internal
}  // namespace wsync
