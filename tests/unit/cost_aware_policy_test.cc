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

TEST(CostAwarePolicyTest, PrefersTheFasterPathAndSplitsLargeRegions) {
  // One [64, 1024] fp32 parameter held whole by two trainers: trainer 0 on the receiver's node,
  // trainer 1 on another node.
  auto make = [](Role role, int processes, const std::vector<std::string>& nodes) {
    LayoutBuilder b(role);
    const int32_t w = b.AddParam("w", DType::kFloat32, {64, 1024});
    for (int p = 0; p < processes; ++p) {
      b.AddProcess(nodes[p]);
      b.AddPackedPiece(w, p, b.AddBuffer(p, 64 * 1024 * 4), WholeBox({64, 1024}), 0);
    }
    return std::move(b).Build();
  };
  const Job job = *Job::Create(make(Role::kTrainer, 2, {"a", "b"}), make(Role::kRollout, 1, {"a"}));
  CostAwareOptions no_split;
  no_split.min_split_bytes = int64_t{1} << 40;
  const Plan whole = *MakePlan(
      job, *MakeCostAwarePolicy(Links("intra_node=5us,20GB/s;inter_node=20us,5GB/s"), no_split));
  ASSERT_EQ(whole.segments.size(), 1u);
  EXPECT_EQ(whole.segments[0].from.process, 0);  // The same-node holder.

  CostAwareOptions split;
  split.min_split_bytes = 1024;
  const Plan halves = *MakePlan(
      job, *MakeCostAwarePolicy(Links("intra_node=5us,10GB/s;inter_node=5us,10GB/s"), split));
  ASSERT_EQ(halves.answers.size(), 1u);
  ASSERT_EQ(halves.answers[0].parts.size(), 2u);  // Equal links: both holders send half.
  EXPECT_EQ(halves.answers[0].parts[0].end - halves.answers[0].parts[0].begin, 32);
}

}  // namespace
}  // namespace wsync
