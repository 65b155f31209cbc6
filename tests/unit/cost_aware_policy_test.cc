#include "planner/cost_aware_policy.h"

#include <map>

#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/policy.h"

namespace wsync {
namespace {

LinkFits Links(const char* spec) { return *FitLinks(*SyntheticCalibration(spec)); }

// The plan's traffic priced by the cost model.
Prediction Price(const Job& job, const Plan& plan, const LinkFits& fits) {
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
  for (const auto& [key, pair] : pairs) traffic.pairs.push_back(pair);
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

// One [64, 1024] fp32 parameter (256 KiB) held whole by every trainer, on the nodes given, and
// received whole by every rollout.
Job WholeParameterJob(const std::vector<std::string>& trainer_nodes,
                      const std::vector<std::string>& rollout_nodes) {
  auto make = [](Role role, const std::vector<std::string>& nodes) {
    LayoutBuilder b(role);
    const int32_t w = b.AddParam("w", DType::kFloat32, {64, 1024});
    for (size_t p = 0; p < nodes.size(); ++p) {
      b.AddProcess(nodes[p]);
      b.AddPackedPiece(w, p, b.AddBuffer(p, 64 * 1024 * 4), WholeBox({64, 1024}), 0);
    }
    return std::move(b).Build();
  };
  return *Job::Create(make(Role::kTrainer, trainer_nodes), make(Role::kRollout, rollout_nodes));
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

TEST(CostAwarePolicyTest, PathWithoutAFitIsPricedAtTheDefaultRate) {
  // Only inter_node is calibrated; the same-node holder's intra_node path is priced at the
  // default 1 GB/s, slower than the 5 GB/s inter-node link.
  const Job job = WholeParameterJob({"a", "b"}, {"a"});
  const Plan plan = *MakePlan(job, *MakeCostAwarePolicy(Links("inter_node=5us,5GB/s")));
  EXPECT_EQ(BytesSentBy(job, plan), (std::map<int32_t, int64_t>{{1, kWholeBytes}}));
}

}  // namespace
}  // namespace wsync
