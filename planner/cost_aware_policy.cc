#include "planner/cost_aware_policy.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace wsync {
namespace {

int PathRank(absl::string_view path) {
  if (path == kPathLocal) return 0;
  return path == kPathIntraNode ? 1 : 2;
}

// A holder able to send a request: when its egress is free, at what rate it reaches the receiver.
struct Candidate {
  double start = 0;
  double rate = 1;
  int rank = 0;
  int32_t sender = 0;
  int32_t holder = 0;
  double Finish(double bytes) const { return start + bytes / rate; }
};

class CostAwarePolicy final : public ReplicaPolicy {
 public:
  CostAwarePolicy(LinkFits fits, CostAwareOptions options)
      : fits_(std::move(fits)), options_(options) {}

  std::string name() const override { return "cost_aware"; }

  absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job& job, absl::Span<const ReplicaRequest> requests) const override {
    // Seconds of sending assigned to each process so far: the model is sender-bound (a
    // receiver's ingress does not depend on which holder sends).
    std::vector<double> egress(job.num_processes(), 0.0);
    std::vector<ReplicaAnswer> answers(requests.size());
    std::vector<size_t> order(requests.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return requests[a].bytes > requests[b].bytes; });
    for (size_t index : order) {
      const ReplicaRequest& request = requests[index];
      const double bytes = static_cast<double>(request.bytes);
      std::vector<Candidate> candidates;
      for (int32_t h = 0; h < static_cast<int32_t>(request.holder_pieces.size()); ++h) {
        const int32_t sender = job.SourceId(job.source().pieces[request.holder_pieces[h]].process);
        candidates.push_back(Candidate{egress[sender], Rate(job, sender, request.target_process),
                                       PathRank(job.PathClass(sender, request.target_process)),
                                       sender, h});
      }
      std::sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
        return std::make_tuple(a.Finish(bytes), a.rank, a.sender) <
               std::make_tuple(b.Finish(bytes), b.rank, b.sender);
      });
      const int64_t rows = request.region.rank() > 0 ? request.region.extent[0] : 1;
      const double row_bytes = bytes / static_cast<double>(std::max<int64_t>(rows, 1));
      std::vector<int64_t> best_rows = {rows};
      double best_finish = candidates[0].Finish(bytes);
      const int64_t max_parts =
          std::min<int64_t>({static_cast<int64_t>(candidates.size()), rows,
                             request.bytes / std::max<int64_t>(options_.min_split_bytes, 1)});
      for (int64_t k = 2; k <= max_parts; ++k) {
        std::vector<int64_t> split = SplitRows(candidates, k, rows, row_bytes);
        if (split.empty()) continue;
        double finish = 0;
        for (int64_t i = 0; i < k; ++i) {
          finish = std::max(finish, candidates[i].Finish(split[i] * row_bytes));
        }
        if (finish < best_finish) {
          best_finish = finish;
          best_rows = std::move(split);
        }
      }
      int64_t begin = request.region.rank() > 0 ? request.region.origin[0] : 0;
      for (size_t i = 0; i < best_rows.size(); ++i) {
        const Candidate& c = candidates[i];
        egress[c.sender] = c.Finish(best_rows[i] * row_bytes);
        answers[index].parts.push_back(ReplicaPart{c.holder, begin, begin + best_rows[i]});
        begin += best_rows[i];
      }
    }
    return answers;
  }

 private:
  double Rate(const Job& job, int32_t sender, int32_t receiver) const {
    if (auto it = fits_.by_pair.find({sender, receiver}); it != fits_.by_pair.end()) {
      return it->second.bytes_per_second;
    }
    if (auto it = fits_.by_path.find(std::string(job.PathClass(sender, receiver)));
        it != fits_.by_path.end()) {
      return it->second.bytes_per_second;
    }
    return options_.default_bytes_per_second;
  }

  // Rows for the first k candidates so that they finish together (water filling:
  // sum_i rate_i * (T - start_i) = bytes); empty when a part would be empty or under
  // min_split_bytes.
  std::vector<int64_t> SplitRows(const std::vector<Candidate>& candidates, int64_t k, int64_t rows,
                                 double row_bytes) const {
    double rate_sum = 0, weighted_start = 0;
    for (int64_t i = 0; i < k; ++i) {
      rate_sum += candidates[i].rate;
      weighted_start += candidates[i].rate * candidates[i].start;
    }
    const double finish = (static_cast<double>(rows) * row_bytes + weighted_start) / rate_sum;
    std::vector<int64_t> split(k);
    int64_t assigned = 0;
    for (int64_t i = 0; i < k; ++i) {
      const Candidate& c = candidates[i];
      split[i] = i + 1 == k
                     ? rows - assigned
                     : static_cast<int64_t>(std::max(0.0, c.rate * (finish - c.start)) / row_bytes);
      if (split[i] <= 0 || split[i] * row_bytes < static_cast<double>(options_.min_split_bytes)) {
        return {};
      }
      assigned += split[i];
    }
    return split;
  }

  LinkFits fits_;
  CostAwareOptions options_;
};

}  // namespace

std::unique_ptr<ReplicaPolicy> MakeCostAwarePolicy(LinkFits fits, CostAwareOptions options) {
  return std::make_unique<CostAwarePolicy>(std::move(fits), options);
}

}  // namespace wsync
