// The cost_aware replica policy: examples of its choices (paths, node links, fixed traffic,
// splits against their message cost, consolidation), and properties over random replicated
// layouts (generic pairs and named layouts of small MoE models) with random link fits: the whole
// sync it plans (fixed and replica traffic, priced by link_model Predict on the final plan's
// traffic, rounds included, planned without relays or coalescing) is never predicted slower than
// first_holder's, and every process computes the same answers, fixed traffic and digest whether
// it plans alone or the whole job.
//
// Environment overrides for reproducing a property failure: WSYNC_PROPERTY_SEED (first seed) and
// WSYNC_PROPERTY_PAIRS (number of consecutive seeds).

#include "planner/cost_aware_policy.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/policy.h"
#include "planner/relay.h"
#include "tests/testing/random_layouts.h"
#include "tests/testing/random_named_layouts.h"

namespace wsync {
namespace {

LinkFits Links(const char* spec) { return *FitLinks(*SyntheticCalibration(spec)); }

// The plan's traffic priced by the cost model: each pair's messages its segments; with `rounds`
// the rounds are the most segments of a pair (as `wsync plan` prices a whole plan), else 0 (one
// alpha of latency).
Prediction Price(const Job& job, const Plan& plan, const LinkFits& fits, bool rounds = false) {
  std::map<std::pair<int32_t, int32_t>, PairTraffic> pairs;
  for (const Segment& s : plan.segments) {
    PairTraffic& pair = pairs[{s.from.process, s.to.process}];
    pair.from = s.from.process;
    pair.to = s.to.process;
    pair.path = std::string(job.PathClass(s.from.process, s.to.process));
    pair.bytes += Volume(s.box) * job.ElementSize(s.param);
    ++pair.messages;
  }
  Traffic traffic;
  for (const auto& [key, pair] : pairs) {
    traffic.pairs.push_back(pair);
    if (rounds) traffic.rounds = std::max(traffic.rounds, pair.messages);
  }
  return *Predict(fits, traffic);
}

TEST(CostAwarePolicyTest, UsesTheReplicasFirstHolderLeavesIdle) {
  // megatron(tp=2, dp=2): two replicas of every TP shard; vllm(tp=2) needs each shard once.
  const ModelSpec model = *GetModel("qwen2.5-tiny");
  const Job job = *Job::Create(*BuildNamedLayout(model, "megatron(tp=2,dp=2)"),
                               *BuildNamedLayout(model, "vllm(tp=2)"));
  // Each link carries 5 GB/s but a rollout can take in 20 GB/s from several senders at once (as
  // a fan-in calibration would show): sending from one replica only leaves that ingress idle.
  LinkFits fits = Links("inter_node=20us,5GB/s");
  for (int32_t receiver : {4, 5}) {
    fits.fan_aggregate[FanKey{"fan_in", receiver, {0, 1, 2, 3}}] = LinkFit{20e-6, 20e9, 0, 2};
  }
  const Plan first = *MakePlan(job, *MakeFirstHolderPolicy());
  const Plan cost = *MakePlan(job, *MakeCostAwarePolicy(fits));
  const Prediction first_prediction = Price(job, first, fits);
  const Prediction cost_prediction = Price(job, cost, fits);
  EXPECT_LT(cost_prediction.seconds, 0.75 * first_prediction.seconds)
      << first_prediction.binding << " vs " << cost_prediction.binding;
  std::map<int32_t, int64_t> sent;
  for (const Segment& s : cost.segments) sent[s.from.process] += Volume(s.box);
  EXPECT_EQ(sent.size(), 4u);  // Every trainer sends.
}

// One [rows, 1024] fp32 parameter (256 KiB for 64 rows) held whole by every trainer, on the
// nodes given, and received whole by every rollout.
Job WholeParameterJob(const std::vector<std::string>& trainer_nodes,
                      const std::vector<std::string>& rollout_nodes, int64_t rows = 64) {
  auto make = [rows](Role role, const std::vector<std::string>& nodes) {
    LayoutBuilder b(role);
    const int32_t w = b.AddParam("w", DType::kFloat32, {rows, 1024});
    for (size_t p = 0; p < nodes.size(); ++p) {
      b.AddProcess(nodes[p]);
      b.AddPackedPiece(w, p, b.AddBuffer(p, rows * 1024 * 4), WholeBox({rows, 1024}), 0);
    }
    return std::move(b).Build();
  };
  return *Job::Create(make(Role::kTrainer, trainer_nodes), make(Role::kRollout, rollout_nodes));
}

// Parameters [rows, 1024] fp32, each held whole by the trainers listed (ranks) and received whole
// by the rollouts listed (ranks); every process on node "a", one buffer per piece.
struct ParamSpec {
  std::string name;
  int64_t rows = 64;
  std::vector<int32_t> holders;
  std::vector<int32_t> readers;
};

Job HeldByJob(int32_t trainers, int32_t rollouts, const std::vector<ParamSpec>& params) {
  auto make = [&](Role role, int32_t processes) {
    LayoutBuilder b(role);
    for (int32_t p = 0; p < processes; ++p) b.AddProcess("a");
    for (const ParamSpec& spec : params) {
      const int32_t w = b.AddParam(spec.name, DType::kFloat32, {spec.rows, 1024});
      for (int32_t p : role == Role::kTrainer ? spec.holders : spec.readers) {
        b.AddPackedPiece(w, p, b.AddBuffer(p, spec.rows * 1024 * 4), WholeBox({spec.rows, 1024}),
                         0);
      }
    }
    return std::move(b).Build();
  };
  return *Job::Create(make(Role::kTrainer, trainers), make(Role::kRollout, rollouts));
}

std::map<int32_t, int64_t> BytesSentBy(const Job& job, const Plan& plan) {
  std::map<int32_t, int64_t> sent;
  for (const Segment& s : plan.segments) {
    sent[s.from.process] += Volume(s.box) * job.ElementSize(s.param);
  }
  return sent;
}

constexpr int64_t kWholeBytes = 64 * 1024 * 4;

TEST(CostAwarePolicyTest, PrefersTheFasterPath) {
  // Trainer 0 on the receiver's node, trainer 1 on another node.
  const Job job = WholeParameterJob({"a", "b"}, {"a"});
  const Plan whole =
      *MakePlan(job, *MakeCostAwarePolicy(Links("intra_node=5us,20GB/s;inter_node=20us,5GB/s")));
  ASSERT_EQ(whole.segments.size(), 1u);
  EXPECT_EQ(whole.segments[0].from.process, 0);  // The same-node holder.
}

TEST(CostAwarePolicyTest, ReaderTakesItsOwnNodesReplicaWhenTheNodeLinkIsSlow) {
  // Trainer 0 on node a, trainer 1 and the rollout (process 2) on node b. Each pair link alone
  // is faster across nodes (10 GB/s) than inside b (5 GB/s), but everything a sends b shares a
  // 1 GB/s node link: from trainer 0 the sync takes 256 KiB / 1 GB/s = 262 us (the node link
  // binds), from trainer 1 256 KiB / 5 GB/s = 52 us.
  const Job job = WholeParameterJob({"a", "b"}, {"b"});
  LinkFits fits = Links("intra_node=5us,5GB/s;inter_node=5us,10GB/s");
  const Plan without_node_links = *MakePlan(job, *MakeCostAwarePolicy(fits));
  EXPECT_EQ(BytesSentBy(job, without_node_links), (std::map<int32_t, int64_t>{{0, kWholeBytes}}));

  fits.nodes = {"a", "b", "b"};
  fits.node_link[{"a", "b"}] = LinkFit{5e-6, 1e9, 0, 2};
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(fits));
  EXPECT_EQ(BytesSentBy(job, plan), (std::map<int32_t, int64_t>{{1, kWholeBytes}}));
  const Prediction cost = Price(job, plan, fits);
  EXPECT_NEAR(cost.transfer_seconds, kWholeBytes / 5e9, 1e-9) << cost.binding;
  const Prediction first = Price(job, *MakePlan(job, *MakeFirstHolderPolicy()), fits);
  EXPECT_NEAR(first.transfer_seconds, kWholeBytes / 1e9, 1e-9);
  EXPECT_EQ(first.binding, "node link a->b (all its pairs at once)");
}

TEST(CostAwarePolicyTest, SpreadsCrossingBytesOverNodeLinks) {
  // Trainers 0 (node a) and 1 (node c) hold the parameter; rollouts 2 and 3 (node b) each need
  // it whole. Links are fast (10 GB/s) but each node link carries 1 GB/s: both copies from one
  // trainer take 2 x 256 KiB over one node link (524 us, first_holder), one from each take
  // 256 KiB over each (262 us).
  const Job job = WholeParameterJob({"a", "c"}, {"b", "b"});
  LinkFits fits = Links("intra_node=5us,10GB/s;inter_node=5us,10GB/s");
  fits.nodes = {"a", "c", "b", "b"};
  fits.node_link[{"a", "b"}] = LinkFit{5e-6, 1e9, 0, 2};
  fits.node_link[{"c", "b"}] = LinkFit{5e-6, 1e9, 0, 2};
  PlanOptions direct;  // Without relaying (which would cross once and forward inside b).
  direct.relay.mode = RelayMode::kNever;
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(fits), direct);
  EXPECT_EQ(BytesSentBy(job, plan),
            (std::map<int32_t, int64_t>{{0, kWholeBytes}, {1, kWholeBytes}}));
  EXPECT_NEAR(Price(job, plan, fits).transfer_seconds, kWholeBytes / 1e9, 1e-9);
  const Plan first = *MakePlan(job, *MakeFirstHolderPolicy(), direct);
  EXPECT_NEAR(Price(job, first, fits).transfer_seconds, 2 * kWholeBytes / 1e9, 1e-9);
}

TEST(CostAwarePolicyTest, SplitsOnlyWhenThePartsReachMinSplitBytes) {
  // Two trainers and the rollout on one node; each link carries 10 GB/s, the rollout takes in
  // 20 GB/s from two senders (a fan-in fit). Whole from one trainer: 256 KiB / 10 GB/s = 26 us;
  // halves from both: 128 KiB / 10 GB/s = 13 us on each link and 256 KiB / 20 GB/s at the
  // ingress. A 256 KiB region splits only when min_split_bytes <= 128 KiB.
  const Job job = WholeParameterJob({"a", "a"}, {"a"});
  LinkFits fits = Links("intra_node=5us,10GB/s");
  fits.fan_aggregate[FanKey{"fan_in", 2, {0, 1}}] = LinkFit{5e-6, 20e9, 0, 2};
  for (const auto& [min_split, parts] : std::vector<std::pair<int64_t, size_t>>{
           {64 << 10, 2}, {128 << 10, 2}, {(128 << 10) + 1, 1}}) {
    CostAwareOptions options;
    options.min_split_bytes = min_split;
    const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(fits, options));
    ASSERT_EQ(plan.answers.size(), 1u);
    ASSERT_EQ(plan.answers[0].parts.size(), parts) << "min_split_bytes " << min_split;
    if (parts == 2) {
      EXPECT_EQ(plan.answers[0].parts[0], (ReplicaPart{0, 0, 32}));
      EXPECT_EQ(plan.answers[0].parts[1], (ReplicaPart{1, 32, 64}));
      EXPECT_NEAR(Price(job, plan, fits).transfer_seconds, kWholeBytes / 20e9, 1e-9);
    }
  }
  // Without the fan-in fit the ingress takes 10 GB/s whatever sends: a split lowers nothing.
  CostAwareOptions options;
  options.min_split_bytes = 1024;
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(Links("intra_node=5us,10GB/s"), options));
  EXPECT_EQ(plan.answers[0].parts.size(), 1u);
}

TEST(CostAwarePolicyTest, KeepsReplicaBytesOffAnEgressFixedTrafficFills) {
  // Trainer 0 alone holds "big" (1 MiB), which rollout 1 (process 3) needs: fixed traffic that
  // fills trainer 0's egress. "w" (256 KiB) is held by trainers 0 and 1; rollout 0 (process 2)
  // reads it. Without the fixed traffic both holders price alike and the lower one (0) wins;
  // with it, trainer 0 would send 1.25 MiB, so trainer 1 must.
  const Job job = HeldByJob(2, 2, {{"big", 256, {0}, {1}}, {"w", 64, {0, 1}, {0}}});
  const LinkFits fits = Links("intra_node=5us,10GB/s");
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(fits));
  EXPECT_EQ(plan.fixed_traffic, (std::vector<FixedPairTraffic>{{0, 3, 256 * 1024 * 4, 1}}));
  ASSERT_EQ(plan.answers.size(), 1u);
  EXPECT_EQ(plan.answers[0].parts, (std::vector<ReplicaPart>{{1, 0, 64}}));
  const Plan first = *MakePlan(job, *MakeFirstHolderPolicy());
  EXPECT_NEAR(Price(job, plan, fits).transfer_seconds, 256 * 1024 * 4 / 10e9, 1e-12);
  EXPECT_NEAR(Price(job, first, fits).transfer_seconds, 320 * 1024 * 4 / 10e9, 1e-12);
}

TEST(CostAwarePolicyTest, ConsolidatesAReceiversRequestsOnASenderItReadsFrom) {
  // Rollout process 2 reads "a" from trainer 1 (its only holder) and "b" from trainer 0 or 1.
  // The rollout's ingress binds either way (both 512 KiB): on that tie "b" joins "a" on the pair
  // 1 -> 2 that already carries traffic rather than opening 0 -> 2.
  const Job job = HeldByJob(2, 1, {{"a", 64, {1}, {0}}, {"b", 64, {0, 1}, {0}}});
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(Links("intra_node=5us,10GB/s")));
  ASSERT_EQ(plan.answers.size(), 1u);
  EXPECT_EQ(plan.answers[0].parts, (std::vector<ReplicaPart>{{1, 0, 64}}));
  EXPECT_EQ(BytesSentBy(job, plan), (std::map<int32_t, int64_t>{{1, 2 * kWholeBytes}}));
}

// Two trainers and the rollout on one node; each link carries 10 GB/s, the rollout takes in
// 20 GB/s from two senders (a fan-in fit); alpha `alpha_us` per message everywhere.
LinkFits FanInFits(int alpha_us) {
  LinkFits fits = Links(absl::StrCat("intra_node=", alpha_us, "us,10GB/s").c_str());
  fits.fan_aggregate[FanKey{"fan_in", 2, {0, 1}}] = LinkFit{alpha_us * 1e-6, 20e9, 0, 2};
  return fits;
}

TEST(CostAwarePolicyTest, RefusesASplitWhoseExtraMessageCostsMoreThanItSaves) {
  // 256 KiB: halves save 13 us at the links (26 us -> 13 us) but the rollout takes a second
  // message, 100 us / 2 more at its ingress: one holder sends it whole. With 5 us per message
  // the split pays (SplitsOnlyWhenThePartsReachMinSplitBytes).
  const Job job = WholeParameterJob({"a", "a"}, {"a"});
  CostAwareOptions options;
  options.min_split_bytes = 64 << 10;
  const Plan slow = *MakePlan(job, *MakeCostAwarePolicy(FanInFits(100), options));
  ASSERT_EQ(slow.answers.size(), 1u);
  EXPECT_EQ(slow.answers[0].parts.size(), 1u);
  const Plan fast = *MakePlan(job, *MakeCostAwarePolicy(FanInFits(5), options));
  EXPECT_EQ(fast.answers[0].parts.size(), 2u);
}

TEST(CostAwarePolicyTest, StillSplitsALargeRegionWhenItsBytesOutweighTheMessages) {
  // 64 MiB with 100 us per message: whole from one holder 6.7 ms at its link; halves 3.4 ms at
  // each link and 3.4 ms + 2 x 50 us at the ingress.
  const Job job = WholeParameterJob({"a", "a"}, {"a"}, 16384);
  const LinkFits fits = FanInFits(100);
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(fits));
  ASSERT_EQ(plan.answers.size(), 1u);
  ASSERT_EQ(plan.answers[0].parts.size(), 2u);
  const int64_t bytes = int64_t{64} << 20;
  EXPECT_NEAR(Price(job, plan, fits).transfer_seconds, bytes / 20e9, 1e-6);
  const Prediction first = Price(job, *MakePlan(job, *MakeFirstHolderPolicy()), fits);
  EXPECT_NEAR(first.transfer_seconds, bytes / 10e9, 1e-9);
}

TEST(CostAwarePolicyTest, PathWithoutAFitIsPricedAtTheDefaultRate) {
  // Only inter_node is calibrated; the same-node holder's intra_node path is priced at the
  // default 1 GB/s, slower than the 5 GB/s inter-node link.
  const Job job = WholeParameterJob({"a", "b"}, {"a"});
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(Links("inter_node=5us,5GB/s")));
  EXPECT_EQ(BytesSentBy(job, plan), (std::map<int32_t, int64_t>{{1, kWholeBytes}}));
}

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::strtoll(value, nullptr, 10);
}

// Random fits for a job: per path class alpha 1-100 us and 1-100 GB/s; some ordered pairs with
// their own fit; some fan-in and fan-out aggregates; node ids and node links in some.
LinkFits RandomFits(std::mt19937_64& rng, const Job& job) {
  auto alpha = [&] { return static_cast<double>(test::UniformInt(rng, 1, 100)) * 1e-6; };
  auto rate = [&] { return static_cast<double>(test::UniformInt(rng, 1, 100)) * 1e9; };
  LinkFits fits;
  for (absl::string_view path : {kPathLocal, kPathIntraNode, kPathInterNode}) {
    fits.by_path[std::string(path)] = LinkFit{alpha(), rate(), 0, 2};
  }
  const int32_t processes = job.num_processes();
  for (int32_t from = 0; from < processes; ++from) {
    for (int32_t to = 0; to < processes; ++to) {
      if (from != to && test::Chance(rng, 0.2)) fits.by_pair[{from, to}] = {alpha(), rate(), 0, 2};
    }
    for (const char* pattern : {"fan_in", "fan_out"}) {
      if (!test::Chance(rng, 0.3)) continue;
      std::vector<int32_t> peers;
      for (int32_t peer = 0; peer < processes; ++peer) {
        if (peer != from && test::Chance(rng, 0.5)) peers.push_back(peer);
      }
      if (!peers.empty())
        fits.fan_aggregate[FanKey{pattern, from, peers}] = {alpha(), rate(), 0, 2};
    }
  }
  if (test::Chance(rng, 0.5)) {
    for (int32_t p = 0; p < processes; ++p) {
      fits.nodes.push_back(absl::StrCat("n", job.NodeIndex(p)));
    }
    for (const std::string& from : fits.nodes) {
      for (const std::string& to : fits.nodes) {
        if (!fits.node_link.contains({from, to}) && test::Chance(rng, 0.7)) {
          fits.node_link[{from, to}] = LinkFit{alpha(), rate(), 0, 2};
        }
      }
    }
  }
  return fits;
}

struct Tally {
  int64_t jobs = 0;
  int64_t with_requests = 0;
  int64_t with_fixed_traffic = 0;  // Some pair also carries single-holder regions.
  int64_t faster = 0;              // cost_aware predicted strictly faster than first_holder.
};

// cost_aware, with small splits allowed, is never predicted slower than first_holder on `job`.
absl::Status CheckNeverSlower(const Job& job, uint64_t seed, Tally* tally) {
  std::mt19937_64 rng(seed * 7919 + 3);
  const LinkFits fits = RandomFits(rng, job);
  CostAwareOptions options;
  options.min_split_bytes = 8 << test::UniformInt(rng, 0, 8);
  // The relay pass reshapes traffic after the policy, and coalescing merges segments the policy
  // cannot see (it counts a pair's regions as its messages): leave both out.
  PlanOptions direct;
  direct.relay.mode = RelayMode::kNever;
  direct.coalesce = false;
  WSYNC_ASSIGN_OR_RETURN(const Plan cost,
                         MakePlan(job, *MakeCostAwarePolicy(fits, options), direct));
  WSYNC_ASSIGN_OR_RETURN(const Plan first, MakePlan(job, *MakeFirstHolderPolicy(), direct));
  const Prediction cost_seconds = Price(job, cost, fits, /*rounds=*/true);
  const Prediction first_seconds = Price(job, first, fits, /*rounds=*/true);
  ++tally->jobs;
  if (cost.requests.empty()) return absl::OkStatus();
  ++tally->with_requests;
  if (!cost.fixed_traffic.empty()) ++tally->with_fixed_traffic;
  if (cost_seconds.seconds < first_seconds.seconds) ++tally->faster;
  if (cost_seconds.seconds > first_seconds.seconds * (1 + 1e-12)) {
    return absl::InternalError(absl::StrCat(
        "cost_aware predicted ", cost_seconds.seconds, " s (", cost_seconds.binding,
        ") but first_holder ", first_seconds.seconds, " s (", first_seconds.binding, ")"));
  }
  return absl::OkStatus();
}

template <typename Check>
void ForEachSeed(int64_t default_count, Check check) {
  const uint64_t first = EnvInt("WSYNC_PROPERTY_SEED", 5000);
  const int64_t count = EnvInt("WSYNC_PROPERTY_PAIRS", default_count);
  int64_t failures = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t seed = first + static_cast<uint64_t>(i);
    const absl::Status status = check(seed);
    if (status.ok()) continue;
    if (++failures <= 5) {
      ADD_FAILURE() << "seed " << seed << " (rerun with WSYNC_PROPERTY_SEED=" << seed
                    << " WSYNC_PROPERTY_PAIRS=1): " << status;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << count << " seeds starting at " << first;
}

TEST(CostAwarePropertyTest, WholeSyncNeverPredictedSlowerThanFirstHolder) {
  Tally tally;
  ForEachSeed(400, [&](uint64_t seed) -> absl::Status {
    std::mt19937_64 rng(seed);
    const test::LayoutPair pair = test::RandomLayoutPair(rng);
    WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(pair.source, pair.target));
    return CheckNeverSlower(job, seed, &tally);
  });
  std::cout << "jobs " << tally.jobs << ", with requests " << tally.with_requests
            << ", with fixed traffic too " << tally.with_fixed_traffic
            << ", cost_aware strictly faster " << tally.faster << "\n";
  if (tally.jobs >= 100) {
    EXPECT_GT(tally.with_requests, tally.jobs / 5);
    EXPECT_GT(tally.with_fixed_traffic, tally.with_requests / 4);
    EXPECT_GT(tally.faster, tally.with_requests / 10);
  }
}

TEST(CostAwarePropertyTest, NamedMoeLayoutsNeverPredictedSlowerThanFirstHolder) {
  Tally tally;
  ForEachSeed(60, [&](uint64_t seed) -> absl::Status {
    std::mt19937_64 rng(seed);
    WSYNC_ASSIGN_OR_RETURN(const test::NamedLayoutPair named, test::RandomNamedLayoutPair(rng));
    WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(named.pair.source, named.pair.target));
    const absl::Status status = CheckNeverSlower(job, seed, &tally);
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat(named.Describe(), ": ", status.message()));
  });
  std::cout << "jobs " << tally.jobs << ", with requests " << tally.with_requests
            << ", with fixed traffic too " << tally.with_fixed_traffic
            << ", cost_aware strictly faster " << tally.faster << "\n";
  if (tally.jobs >= 50) {
    EXPECT_GT(tally.with_requests, tally.jobs / 5);
  }
}

// Planned alone (PlanOptions::process), every process gets the whole job's fixed traffic, answers
// and digest, with relays off and on.
absl::Status CheckSameAnswersOnEveryProcess(const Job& job, uint64_t seed) {
  std::mt19937_64 rng(seed * 31 + 7);
  auto fits = std::make_shared<const LinkFits>(RandomFits(rng, job));
  CostAwareOptions options;
  options.min_split_bytes = 8;
  const std::unique_ptr<ReplicaPolicy> policy = MakeCostAwarePolicy(*fits, options);
  for (const RelayMode mode : {RelayMode::kNever, RelayMode::kAuto}) {
    PlanOptions whole_options;
    whole_options.relay.mode = mode;
    whole_options.relay.fits = fits;
    WSYNC_ASSIGN_OR_RETURN(const Plan whole, MakePlan(job, *policy, whole_options));
    for (int32_t process = 0; process < job.num_processes(); ++process) {
      PlanOptions mine_options = whole_options;
      mine_options.process = process;
      WSYNC_ASSIGN_OR_RETURN(const Plan mine, MakePlan(job, *policy, mine_options));
      if (!(mine.fixed_traffic == whole.fixed_traffic) || !(mine.answers == whole.answers) ||
          mine.digest != whole.digest) {
        return absl::InternalError(
            absl::StrCat("process ", process, " (relay ", RelayModeName(mode),
                         ") planned other fixed traffic, answers or digest"));
      }
    }
  }
  return absl::OkStatus();
}

TEST(CostAwarePropertyTest, EveryProcessComputesTheWholeJobsAnswers) {
  ForEachSeed(150, [](uint64_t seed) -> absl::Status {
    std::mt19937_64 rng(seed);
    const test::LayoutPair pair = test::RandomLayoutPair(rng);
    WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(pair.source, pair.target));
    return CheckSameAnswersOnEveryProcess(job, seed);
  });
}

TEST(CostAwarePropertyTest, FixedTrafficSumsEverySingleHolderRegion) {
  // Fixed traffic lists each pair once, in (from, to) order, never empty; with the replica
  // requests it accounts for every byte the full plan moves.
  ForEachSeed(150, [](uint64_t seed) -> absl::Status {
    std::mt19937_64 rng(seed);
    const test::LayoutPair pair = test::RandomLayoutPair(rng);
    WSYNC_ASSIGN_OR_RETURN(const Job job, Job::Create(pair.source, pair.target));
    PlanOptions direct;
    direct.relay.mode = RelayMode::kNever;
    WSYNC_ASSIGN_OR_RETURN(const Plan plan, MakePlan(job, *MakeFirstHolderPolicy(), direct));
    int64_t fixed = 0, requested = 0, moved = 0;
    for (size_t i = 0; i < plan.fixed_traffic.size(); ++i) {
      const FixedPairTraffic& pair = plan.fixed_traffic[i];
      if (pair.bytes <= 0 || pair.regions <= 0 ||
          (i > 0 && std::pair(plan.fixed_traffic[i - 1].from, plan.fixed_traffic[i - 1].to) >=
                        std::pair(pair.from, pair.to))) {
        return absl::InternalError(absl::StrCat("fixed traffic entry ", i,
                                                " is empty or out of "
                                                "order"));
      }
      fixed += pair.bytes;
    }
    for (const ReplicaRequest& request : plan.requests) requested += request.bytes;
    for (const Segment& s : plan.segments) moved += s.elements() * job.ElementSize(s.param);
    if (fixed + requested != moved) {
      return absl::InternalError(
          absl::StrCat("fixed ", fixed, " + requested ", requested, " bytes != moved ", moved));
    }
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace wsync
