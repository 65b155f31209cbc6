#include "planner/cost_aware_policy.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "common/status.h"

namespace wsync {
namespace {

int PathRank(absl::string_view path) {
  if (path == kPathLocal) return 0;
  return path == kPathIntraNode ? 1 : 2;
}

// Rows [begin, end) of a request's region given to one of its holders.
struct Share {
  int32_t holder = 0;  // Index into the request's holder_pieces.
  int64_t rows = 0;
};

// A way to answer one request, priced with everything answered before it.
struct Option {
  std::vector<Share> shares;
  double total = 0;   // The predicted seconds of the sync so far with this option.
  double finish = 0;  // The busiest resource this option loads, with it.
  double before = 0;  // That resource set's busiest load before it.
  int path_rank = 0;  // Sum over the shares.
  std::vector<int32_t> senders;

  std::tuple<double, double, size_t, int, const std::vector<int32_t>&> Order() const {
    return {total, finish, shares.size(), path_rank, senders};
  }
};

class CostAwarePolicy final : public ReplicaPolicy {
 public:
  CostAwarePolicy(LinkFits fits, CostAwareOptions options)
      : fits_(std::move(fits)), options_(options) {
    for (absl::string_view path : {kPathLocal, kPathIntraNode, kPathInterNode}) {
      fits_.by_path.try_emplace(std::string(path),
                                LinkFit{0, options_.default_bytes_per_second, 0, 0});
    }
  }

  std::string name() const override { return "cost_aware"; }

  absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job& job, absl::Span<const ReplicaRequest> requests) const override {
    Sync sync(&fits_);
    std::vector<ReplicaAnswer> answers(requests.size());
    std::vector<size_t> order(requests.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return requests[a].bytes > requests[b].bytes; });
    for (size_t index : order) {
      const ReplicaRequest& request = requests[index];
      const int64_t rows = request.region.rank() > 0 ? request.region.extent[0] : 1;
      const int32_t holders = static_cast<int32_t>(request.holder_pieces.size());
      std::vector<Option> alone;
      for (int32_t h = 0; h < holders; ++h) {
        WSYNC_ASSIGN_OR_RETURN(Option option, sync.Price(job, request, {Share{h, rows}}));
        alone.push_back(std::move(option));
      }
      std::stable_sort(alone.begin(), alone.end(),
                       [](const Option& a, const Option& b) { return a.Order() < b.Order(); });
      Option best = alone.front();
      const int64_t max_parts = std::min<int64_t>(
          {holders, rows, request.bytes / std::max<int64_t>(options_.min_split_bytes, 1)});
      for (int64_t k = 2; k <= max_parts; ++k) {
        for (const std::vector<Share>& shares :
             {FinishTogether(alone, k, rows), Equal(alone, k, rows)}) {
          if (!FitsMinimum(shares, rows, request.bytes)) continue;
          WSYNC_ASSIGN_OR_RETURN(Option option, sync.Price(job, request, shares));
          if (option.Order() < best.Order()) best = std::move(option);
        }
      }
      // Parts in holder order along axis 0, so an answer depends only on the set of shares.
      std::sort(best.shares.begin(), best.shares.end(),
                [](const Share& a, const Share& b) { return a.holder < b.holder; });
      WSYNC_RETURN_IF_ERROR(sync.Commit(job, request, best.shares));
      int64_t begin = request.region.rank() > 0 ? request.region.origin[0] : 0;
      for (const Share& share : best.shares) {
        answers[index].parts.push_back(ReplicaPart{share.holder, begin, begin + share.rows});
        begin += share.rows;
      }
    }
    return answers;
  }

 private:
  // The requests answered so far: their traffic and every resource's load, ordered by load.
  class Sync {
   public:
    explicit Sync(const LinkFits* fits) : traffic_(fits) {}

    // The option's prediction: the sync so far plus `shares` (taken back afterwards).
    absl::StatusOr<Option> Price(const Job& job, const ReplicaRequest& request,
                                 std::vector<Share> shares) {
      WSYNC_RETURN_IF_ERROR(Add(job, request, shares, 1));
      const std::map<ResourceLoad::Key, double> touched = Touched(job, request, shares);
      WSYNC_RETURN_IF_ERROR(Add(job, request, shares, -1));
      Option option;
      for (const auto& [key, seconds] : touched) {
        option.total = std::max(option.total, seconds);
        auto it = loads_.find(key);
        const double before = it == loads_.end() ? 0.0 : it->second;
        if (seconds != before) {
          option.finish = std::max(option.finish, seconds);
          option.before = std::max(option.before, before);
        }
      }
      // The busiest resource the option leaves alone.
      for (auto it = by_load_.rbegin(); it != by_load_.rend(); ++it) {
        if (touched.contains(it->second)) continue;
        option.total = std::max(option.total, it->first);
        break;
      }
      for (const Share& share : shares) {
        const int32_t sender = Sender(job, request, share.holder);
        option.path_rank += PathRank(job.PathClass(sender, request.target_process));
        option.senders.push_back(sender);
      }
      option.shares = std::move(shares);
      return option;
    }

    absl::Status Commit(const Job& job, const ReplicaRequest& request,
                        const std::vector<Share>& shares) {
      WSYNC_RETURN_IF_ERROR(Add(job, request, shares, 1));
      for (const auto& [key, seconds] : Touched(job, request, shares)) {
        if (auto it = loads_.find(key); it != loads_.end()) by_load_.erase({it->second, key});
        loads_[key] = seconds;
        by_load_.insert({seconds, key});
      }
      return absl::OkStatus();
    }

   private:
    absl::Status Add(const Job& job, const ReplicaRequest& request,
                     const std::vector<Share>& shares, int64_t sign) {
      const int64_t rows = request.region.rank() > 0 ? request.region.extent[0] : 1;
      const int64_t row_bytes = request.bytes / std::max<int64_t>(rows, 1);
      for (const Share& share : shares) {
        const int32_t sender = Sender(job, request, share.holder);
        WSYNC_RETURN_IF_ERROR(traffic_.Add(sender, request.target_process,
                                           job.PathClass(sender, request.target_process),
                                           sign * share.rows * row_bytes));
      }
      return absl::OkStatus();
    }

    // The loads now of the resources the shares' pairs use.
    std::map<ResourceLoad::Key, double> Touched(const Job& job, const ReplicaRequest& request,
                                                const std::vector<Share>& shares) const {
      std::map<ResourceLoad::Key, double> touched;
      for (const Share& share : shares) {
        for (const ResourceLoad& load :
             traffic_.Touched(Sender(job, request, share.holder), request.target_process)) {
          touched[load.key()] = load.seconds;
        }
      }
      return touched;
    }

    TrafficLoads traffic_;
    std::map<ResourceLoad::Key, double> loads_;
    std::set<std::pair<double, ResourceLoad::Key>> by_load_;
  };

  static int32_t Sender(const Job& job, const ReplicaRequest& request, int32_t holder) {
    return job.SourceId(job.source().pieces[request.holder_pieces[holder]].process);
  }

  // Rows for the k best holders alone so that they would finish together: holder i, taking
  // the whole region alone, would move its resources from `before` to `finish`, so it moves
  // bytes at (bytes / (finish - before)) from `before` on (water filling). Empty when a holder
  // would get nothing.
  static std::vector<Share> FinishTogether(const std::vector<Option>& alone, int64_t k,
                                           int64_t rows) {
    double rate_sum = 0, weighted_start = 0;
    std::vector<double> rates(k);
    for (int64_t i = 0; i < k; ++i) {
      const double busy = alone[i].finish - alone[i].before;
      if (busy <= 0) return {};
      rates[i] = static_cast<double>(rows) / busy;  // Rows per second.
      rate_sum += rates[i];
      weighted_start += rates[i] * alone[i].before;
    }
    const double finish = (static_cast<double>(rows) + weighted_start) / rate_sum;
    std::vector<Share> shares;
    int64_t assigned = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t part =
          i + 1 == k ? rows - assigned
                     : static_cast<int64_t>(std::max(0.0, rates[i] * (finish - alone[i].before)));
      if (part <= 0) return {};
      shares.push_back(Share{alone[i].shares.front().holder, part});
      assigned += part;
    }
    return shares;
  }

  // The k best holders alone, equal rows each (the first ones one more where rows do not divide).
  static std::vector<Share> Equal(const std::vector<Option>& alone, int64_t k, int64_t rows) {
    std::vector<Share> shares;
    for (int64_t i = 0; i < k; ++i) {
      shares.push_back(Share{alone[i].shares.front().holder, rows / k + (i < rows % k ? 1 : 0)});
    }
    return shares;
  }

  bool FitsMinimum(const std::vector<Share>& shares, int64_t rows, int64_t bytes) const {
    if (shares.size() < 2) return false;
    const double row_bytes = static_cast<double>(bytes) / static_cast<double>(rows);
    for (const Share& share : shares) {
      if (share.rows <= 0 ||
          share.rows * row_bytes < static_cast<double>(options_.min_split_bytes)) {
        return false;
      }
    }
    return true;
  }

  LinkFits fits_;
  CostAwareOptions options_;
};

}  // namespace

std::unique_ptr<ReplicaPolicy> MakeCostAwarePolicy(LinkFits fits, CostAwareOptions options) {
  return std::make_unique<CostAwarePolicy>(std::move(fits), options);
}

}  // namespace wsync
