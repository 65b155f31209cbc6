#include "planner/policy.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace wsync {
namespace {

// The axis-0 range [low, high) that parts of an answer must tile; [0, 1) for a scalar.
std::pair<int64_t, int64_t> AxisZeroRange(const Box& region) {
  if (region.rank() == 0) return {0, 1};
  return {region.origin[0], region.origin[0] + region.extent[0]};
}

ReplicaAnswer WholeRegion(const ReplicaRequest& request, int32_t holder) {
  auto [low, high] = AxisZeroRange(request.region);
  return ReplicaAnswer{{ReplicaPart{holder, low, high}}};
}

class FirstHolderPolicy final : public ReplicaPolicy {
 public:
  std::string name() const override { return "first_holder"; }
  absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job& job, absl::Span<const ReplicaRequest> requests,
      absl::Span<const FixedPairTraffic>) const override {
    std::vector<ReplicaAnswer> answers;
    answers.reserve(requests.size());
    for (const ReplicaRequest& request : requests) answers.push_back(WholeRegion(request, 0));
    return answers;
  }
};

class LocalFirstLeastLoadedPolicy final : public ReplicaPolicy {
 public:
  std::string name() const override { return "local_first_least_loaded"; }
  absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job& job, absl::Span<const ReplicaRequest> requests,
      absl::Span<const FixedPairTraffic>) const override {
    std::vector<int64_t> assigned(job.num_processes(), 0);
    std::vector<ReplicaAnswer> answers;
    answers.reserve(requests.size());
    for (const ReplicaRequest& request : requests) {
      int32_t best = -1;
      std::tuple<int, int64_t, int32_t> best_key;
      for (int32_t h = 0; h < static_cast<int32_t>(request.holder_pieces.size()); ++h) {
        const int32_t sender = job.SourceId(job.source().pieces[request.holder_pieces[h]].process);
        const int distance = sender == request.target_process                                 ? 0
                             : job.NodeIndex(sender) == job.NodeIndex(request.target_process) ? 1
                                                                                              : 2;
        std::tuple<int, int64_t, int32_t> key{distance, assigned[sender], sender};
        if (best < 0 || key < best_key) {
          best = h;
          best_key = key;
        }
      }
      assigned[std::get<2>(best_key)] += request.bytes;
      answers.push_back(WholeRegion(request, best));
    }
    return answers;
  }
};

}  // namespace

std::unique_ptr<ReplicaPolicy> MakeFirstHolderPolicy() {
  return std::make_unique<FirstHolderPolicy>();
}

std::unique_ptr<ReplicaPolicy> MakeLocalFirstLeastLoadedPolicy() {
  return std::make_unique<LocalFirstLeastLoadedPolicy>();
}

absl::StatusOr<std::unique_ptr<ReplicaPolicy>> MakeReplicaPolicy(absl::string_view name) {
  if (name == "first_holder") return MakeFirstHolderPolicy();
  if (name == "local_first_least_loaded") return MakeLocalFirstLeastLoadedPolicy();
  return absl::NotFoundError(absl::StrCat("unknown replica policy '", name,
                                          "' (known: first_holder, local_first_least_loaded)"));
}

absl::Status CheckAnswer(const ReplicaRequest& request, const ReplicaAnswer& answer) {
  if (answer.parts.empty()) return absl::InvalidArgumentError("the answer has no parts");
  auto [low, high] = AxisZeroRange(request.region);
  int64_t expected_begin = low;
  for (size_t i = 0; i < answer.parts.size(); ++i) {
    const ReplicaPart& part = answer.parts[i];
    if (part.holder < 0 || part.holder >= static_cast<int32_t>(request.holder_pieces.size())) {
      return absl::InvalidArgumentError(absl::StrCat("part ", i, " names holder ", part.holder,
                                                     " of ", request.holder_pieces.size()));
    }
    if (part.begin != expected_begin || part.end <= part.begin || part.end > high) {
      return absl::InvalidArgumentError(absl::StrCat("part ", i, " covers [", part.begin, ", ",
                                                     part.end, ") where [", expected_begin,
                                                     ", ...) up to ", high, " was due"));
    }
    expected_begin = part.end;
  }
  if (expected_begin != high) {
    return absl::InvalidArgumentError(
        absl::StrCat("the parts end at ", expected_begin, ", not at ", high));
  }
  return absl::OkStatus();
}

}  // namespace wsync
