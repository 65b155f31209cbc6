#include "plugin/nccl_communicators.h"

#include <algorithm>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace wsync {
namespace {

struct Forming {
  absl::btree_set<int32_t> members;
  absl::flat_hash_set<std::string> gpus;

  // Whether `process` (on `gpu`) is a member or can join without a second process on its GPU.
  bool Admits(int32_t process, const std::string& gpu) const {
    return members.contains(process) || !gpus.contains(gpu);
  }
  void Add(int32_t process, const std::string& gpu) {
    if (members.insert(process).second) gpus.insert(gpu);
  }
};

}  // namespace

absl::StatusOr<NcclCommunicators> PlanNcclCommunicators(absl::Span<const NcclPair> pairs,
                                                        absl::Span<const std::string> gpu_of) {
  const int32_t processes = static_cast<int32_t>(gpu_of.size());
  absl::btree_set<int32_t> all;
  absl::flat_hash_set<std::string> distinct_gpus;
  for (const auto& [a, b] : pairs) {
    if (a < 0 || b >= processes || a >= b) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL pair (", a, ", ", b, ") is not two processes of the job in order"));
    }
    if (gpu_of[a] == gpu_of[b]) {
      return absl::UnimplementedError(absl::StrCat(
          "processes ", a, " and ", b, " exchange CUDA memory over NCCL but share one GPU (",
          gpu_of[a],
          "): NCCL cannot connect two ranks on one GPU; route their path class to cuda_ipc"));
    }
    for (int32_t p : {a, b}) {
      if (all.insert(p).second) distinct_gpus.insert(gpu_of[p]);
    }
  }
  NcclCommunicators result;
  if (all.empty()) return result;
  if (distinct_gpus.size() == all.size()) {
    result.members.emplace_back(all.begin(), all.end());
    result.of_pair.assign(pairs.size(), 0);
    return result;
  }
  std::vector<size_t> order(pairs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return pairs[x] < pairs[y]; });
  std::vector<Forming> forming;
  result.of_pair.assign(pairs.size(), -1);
  for (size_t i : order) {
    const auto [a, b] = pairs[i];
    size_t c = 0;
    while (c < forming.size() &&
           !(forming[c].Admits(a, gpu_of[a]) && forming[c].Admits(b, gpu_of[b]))) {
      ++c;
    }
    if (c == forming.size()) forming.emplace_back();
    forming[c].Add(a, gpu_of[a]);
    forming[c].Add(b, gpu_of[b]);
    result.of_pair[i] = static_cast<int32_t>(c);
  }
  for (const Forming& f : forming) result.members.emplace_back(f.members.begin(), f.members.end());
  return result;
}

}  // namespace wsync
