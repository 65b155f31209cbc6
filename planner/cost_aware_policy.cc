#include "planner/cost_aware_policy.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "planner/policy.h"

namespace wsync {
namespace {

using PairKey = std::pair<int32_t, int32_t>;

int PathRank(absl::string_view path) {
  if (path == kPathLocal || path == kPathSameDevice) return 0;
  return path == kPathIntraNode ? 1 : 2;
}

int64_t CeilDivide(int64_t bytes, int64_t by) { return bytes <= 0 ? 0 : (bytes + by - 1) / by; }

// The extent of a request's region along axis 0 (1 for a scalar), and the bytes of one row.
int64_t Rows(const ReplicaRequest& request) {
  return request.region.rank() > 0 ? request.region.extent[0] : 1;
}
int64_t RowBytes(const ReplicaRequest& request) {
  return request.bytes / std::max<int64_t>(Rows(request), 1);
}

// Rows [begin, end) of a request's region given to one of its holders.
struct Share {
  int32_t holder = 0;  // Index into the request's holder_pieces.
  int64_t rows = 0;
};

// A way to answer one request, priced with the fixed traffic and everything answered before it.
struct Option {
  std::vector<Share> shares;
  double total = 0;   // The predicted seconds of the sync so far with this option.
  double finish = 0;  // The busiest resource this option loads, with it.
  double before = 0;  // That resource set's busiest load before it.
  int new_pairs = 0;  // Shares whose pair carries nothing yet.
  int path_rank = 0;  // Sum over the shares.
  std::vector<int32_t> senders;

  // Which option answers: the lowest prediction; on a tie fewer parts (messages), then fewer new
  // pairs (a receiver's requests consolidate on the senders it already reads from), then the
  // earliest finish of what it loads, cheaper paths, lower processes.
  std::tuple<double, size_t, int, double, int, const std::vector<int32_t>&> Order() const {
    return {total, shares.size(), new_pairs, finish, path_rank, senders};
  }
  // Which holders a split takes first: those that finish earliest alone.
  std::tuple<double, double, int, const std::vector<int32_t>&> SplitOrder() const {
    return {total, finish, path_rank, senders};
  }
};

class CostAwarePolicy final : public ReplicaPolicy {
 public:
  CostAwarePolicy(LinkFits fits, CostAwareOptions options)
      : fits_(std::move(fits)), options_(options) {
    for (absl::string_view path : {kPathLocal, kPathSameDevice, kPathIntraNode, kPathInterNode}) {
      fits_.by_path.try_emplace(std::string(path),
                                LinkFit{0, options_.default_bytes_per_second, 0, 0});
    }
    options_.message_bytes = std::max<int64_t>(options_.message_bytes, 1);
  }

  std::string name() const override { return "cost_aware"; }

  absl::StatusOr<std::vector<ReplicaAnswer>> Choose(
      const Job& job, absl::Span<const ReplicaRequest> requests,
      absl::Span<const FixedPairTraffic> fixed) const override {
    Sync sync(&fits_, &options_, job);
    WSYNC_RETURN_IF_ERROR(sync.Seed(fixed));
    std::vector<ReplicaAnswer> answers(requests.size());
    std::vector<size_t> order(requests.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return requests[a].bytes > requests[b].bytes; });
    for (size_t index : order) {
      const ReplicaRequest& request = requests[index];
      const int64_t rows = Rows(request);
      const int32_t holders = static_cast<int32_t>(request.holder_pieces.size());
      std::vector<Option> alone;
      for (int32_t h = 0; h < holders; ++h) {
        WSYNC_ASSIGN_OR_RETURN(Option option, sync.Price(request, {Share{h, rows}}));
        alone.push_back(std::move(option));
      }
      Option best =
          *std::min_element(alone.begin(), alone.end(),
                            [](const Option& a, const Option& b) { return a.Order() < b.Order(); });
      const int64_t max_parts = std::min<int64_t>(
          {holders, rows, request.bytes / std::max<int64_t>(options_.min_split_bytes, 1)});
      if (max_parts >= 2) {
        std::stable_sort(alone.begin(), alone.end(), [](const Option& a, const Option& b) {
          return a.SplitOrder() < b.SplitOrder();
        });
      }
      for (int64_t k = 2; k <= max_parts; ++k) {
        for (const std::vector<Share>& shares :
             {FinishTogether(alone, k, rows), Equal(alone, k, rows)}) {
          if (!FitsMinimum(shares, rows, request.bytes)) continue;
          WSYNC_ASSIGN_OR_RETURN(Option option, sync.Price(request, shares));
          if (option.Order() < best.Order()) best = std::move(option);
        }
      }
      // Parts in holder order along axis 0, so an answer depends only on the set of shares.
      std::sort(best.shares.begin(), best.shares.end(),
                [](const Share& a, const Share& b) { return a.holder < b.holder; });
      WSYNC_RETURN_IF_ERROR(sync.Commit(request, best.shares));
      int64_t begin = request.region.rank() > 0 ? request.region.origin[0] : 0;
      for (const Share& share : best.shares) {
        answers[index].parts.push_back(ReplicaPart{share.holder, begin, begin + share.rows});
        begin += share.rows;
      }
    }
    // The greedy answers can lose to the first holders (an early choice that later requests
    // make worse): keep whichever the cost model predicts faster for the whole sync.
    WSYNC_ASSIGN_OR_RETURN(const std::vector<ReplicaAnswer> first,
                           MakeFirstHolderPolicy()->Choose(job, requests, fixed));
    WSYNC_ASSIGN_OR_RETURN(const double greedy, PredictSync(job, requests, fixed, answers));
    WSYNC_ASSIGN_OR_RETURN(const double first_holder, PredictSync(job, requests, fixed, first));
    return first_holder < greedy ? first : answers;
  }

 private:
  // The fixed traffic and the requests answered so far: their traffic, the messages of each pair
  // and every resource's load, ordered by load. A resource's load is its bytes over its capacity
  // (TrafficLoads) plus, for a pair link, its sender's egress and its receiver's ingress,
  // alpha / kRoundsInFlight per message the pair carries (alpha of the pair's fit): each message
  // costs its latency, which the executor overlaps only with the round posted next to it.
  class Sync {
   public:
    Sync(const LinkFits* fits, const CostAwareOptions* options, const Job& job)
        : fits_(fits),
          options_(options),
          job_(job),
          traffic_(fits),
          egress_messages_(job.num_processes(), 0.0),
          ingress_messages_(job.num_processes(), 0.0) {}

    absl::Status Seed(absl::Span<const FixedPairTraffic> fixed) {
      for (const FixedPairTraffic& pair : fixed) {
        WSYNC_RETURN_IF_ERROR(
            traffic_.Add(pair.from, pair.to, job_.PathClass(pair.from, pair.to), pair.bytes));
        const int64_t messages =
            std::max(pair.regions, CeilDivide(pair.bytes, options_->message_bytes));
        const PairKey key{pair.from, pair.to};
        AddMessages(PairMessages{key, messages, static_cast<double>(messages) * MessageCost(key)});
      }
      for (const ResourceLoad& load : traffic_.All()) {
        const double seconds = load.seconds + MessageSeconds(load, {});
        loads_[load.key()] = seconds;
        by_load_.insert({seconds, load.key()});
      }
      return absl::OkStatus();
    }

    // The option's prediction: the sync so far plus `shares` (taken back afterwards).
    absl::StatusOr<Option> Price(const ReplicaRequest& request, std::vector<Share> shares) {
      const std::vector<PairMessages> added = Messages(request, shares);
      WSYNC_RETURN_IF_ERROR(Add(request, shares, 1));
      const std::map<ResourceLoad::Key, double> touched = Touched(request, shares, added);
      WSYNC_RETURN_IF_ERROR(Add(request, shares, -1));
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
        const int32_t sender = Sender(job_, request, share.holder);
        option.path_rank += PathRank(job_.PathClass(sender, request.target_process));
        option.new_pairs += pair_messages_.contains({sender, request.target_process}) ? 0 : 1;
        option.senders.push_back(sender);
      }
      option.shares = std::move(shares);
      return option;
    }

    absl::Status Commit(const ReplicaRequest& request, const std::vector<Share>& shares) {
      const std::vector<PairMessages> added = Messages(request, shares);
      WSYNC_RETURN_IF_ERROR(Add(request, shares, 1));
      for (const PairMessages& pair : added) AddMessages(pair);
      for (const auto& [key, seconds] : Touched(request, shares, {})) {
        if (auto it = loads_.find(key); it != loads_.end()) by_load_.erase({it->second, key});
        loads_[key] = seconds;
        by_load_.insert({seconds, key});
      }
      return absl::OkStatus();
    }

   private:
    struct PairMessages {
      PairKey pair;
      int64_t messages = 0;
      double seconds = 0;  // messages x MessageCost(pair).
    };

    // The messages each share adds to its pair: one per message_bytes started.
    std::vector<PairMessages> Messages(const ReplicaRequest& request,
                                       const std::vector<Share>& shares) const {
      std::vector<PairMessages> messages;
      for (const Share& share : shares) {
        const PairKey pair{Sender(job_, request, share.holder), request.target_process};
        const int64_t count = CeilDivide(share.rows * RowBytes(request), options_->message_bytes);
        messages.push_back(
            PairMessages{pair, count, static_cast<double>(count) * MessageCost(pair)});
      }
      return messages;
    }

    // alpha / kRoundsInFlight of the pair's fit (its pair fit, else its path's, as TrafficLoads
    // prices its bytes).
    double MessageCost(const PairKey& pair) const {
      if (auto it = fits_->by_pair.find(pair); it != fits_->by_pair.end()) {
        return it->second.alpha_seconds / static_cast<double>(kRoundsInFlight);
      }
      const absl::string_view path = job_.PathClass(pair.first, pair.second);
      for (const auto& [name, fit] : fits_->by_path) {
        if (name == path) return fit.alpha_seconds / static_cast<double>(kRoundsInFlight);
      }
      return 0;
    }

    // Only ever adds (committed messages are never taken back), so every process sums the same
    // doubles in the same order.
    void AddMessages(const PairMessages& added) {
      pair_messages_[added.pair] += added.messages;
      link_messages_[added.pair] += added.seconds;
      egress_messages_[added.pair.first] += added.seconds;
      ingress_messages_[added.pair.second] += added.seconds;
    }

    // The message seconds of a link, egress or ingress load, with `added` on top of what is
    // committed; 0 for the other kinds.
    double MessageSeconds(const ResourceLoad& load, const std::vector<PairMessages>& added) const {
      double seconds = 0;
      switch (load.kind) {
        case ResourceLoad::kLink: {
          auto it = link_messages_.find({load.from, load.to});
          seconds = it == link_messages_.end() ? 0.0 : it->second;
          break;
        }
        case ResourceLoad::kEgress:
          seconds = egress_messages_[load.from];
          break;
        case ResourceLoad::kIngress:
          seconds = ingress_messages_[load.to];
          break;
        default:
          return 0;
      }
      for (const PairMessages& pair : added) {
        const bool uses = load.kind == ResourceLoad::kLink
                              ? pair.pair == PairKey{load.from, load.to}
                              : (load.kind == ResourceLoad::kEgress ? pair.pair.first == load.from
                                                                    : pair.pair.second == load.to);
        if (uses) seconds += pair.seconds;
      }
      return seconds;
    }

    absl::Status Add(const ReplicaRequest& request, const std::vector<Share>& shares,
                     int64_t sign) {
      const int64_t row_bytes = RowBytes(request);
      for (const Share& share : shares) {
        const int32_t sender = Sender(job_, request, share.holder);
        WSYNC_RETURN_IF_ERROR(traffic_.Add(sender, request.target_process,
                                           job_.PathClass(sender, request.target_process),
                                           sign * share.rows * row_bytes));
      }
      return absl::OkStatus();
    }

    // The loads now of the resources the shares' pairs use, with `added` messages on top.
    std::map<ResourceLoad::Key, double> Touched(const ReplicaRequest& request,
                                                const std::vector<Share>& shares,
                                                const std::vector<PairMessages>& added) const {
      std::map<ResourceLoad::Key, double> touched;
      for (const Share& share : shares) {
        for (const ResourceLoad& load :
             traffic_.Touched(Sender(job_, request, share.holder), request.target_process)) {
          touched[load.key()] = load.seconds + MessageSeconds(load, added);
        }
      }
      return touched;
    }

    const LinkFits* fits_;
    const CostAwareOptions* options_;
    const Job& job_;
    TrafficLoads traffic_;
    absl::flat_hash_map<PairKey, int64_t> pair_messages_;
    absl::flat_hash_map<PairKey, double> link_messages_;  // Seconds.
    std::vector<double> egress_messages_;                 // Seconds, by process.
    std::vector<double> ingress_messages_;                // Seconds, by process.
    std::map<ResourceLoad::Key, double> loads_;
    std::set<std::pair<double, ResourceLoad::Key>> by_load_;
  };

  static int32_t Sender(const Job& job, const ReplicaRequest& request, int32_t holder) {
    return job.SourceId(job.source().pieces[request.holder_pieces[holder]].process);
  }

  // Predict (link_model) of the whole sync with `answers`: the fixed traffic and every part,
  // each pair's messages its regions, the rounds the most messages of a pair.
  absl::StatusOr<double> PredictSync(const Job& job, absl::Span<const ReplicaRequest> requests,
                                     absl::Span<const FixedPairTraffic> fixed,
                                     const std::vector<ReplicaAnswer>& answers) const {
    std::map<PairKey, PairTraffic> pairs;
    auto add = [&](int32_t from, int32_t to, int64_t bytes, int64_t messages) {
      PairTraffic& pair = pairs[{from, to}];
      pair.bytes += bytes;
      pair.messages += messages;
    };
    for (const FixedPairTraffic& pair : fixed) add(pair.from, pair.to, pair.bytes, pair.regions);
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReplicaRequest& request = requests[i];
      for (const ReplicaPart& part : answers[i].parts) {
        add(Sender(job, request, part.holder), request.target_process,
            (part.end - part.begin) * RowBytes(request), 1);
      }
    }
    Traffic traffic;
    for (auto& [key, pair] : pairs) {
      pair.from = key.first;
      pair.to = key.second;
      pair.path = std::string(job.PathClass(key.first, key.second));
      traffic.rounds = std::max(traffic.rounds, pair.messages);
      traffic.pairs.push_back(std::move(pair));
    }
    WSYNC_ASSIGN_OR_RETURN(const Prediction prediction, Predict(fits_, traffic));
    return prediction.seconds;
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
