// Placement keys of the named layouts (ppn, colocated) and BuildNamedJobLayouts.

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/job.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "tests/unit/named_layouts_testing.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::wsync::test::named::Model;

std::vector<std::string> Nodes(const Layout& layout) {
  std::vector<std::string> nodes;
  for (const ProcessInfo& process : layout.processes) nodes.push_back(process.node_id);
  return nodes;
}

Job MakeJob(const std::string& from, const std::string& to) {
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(Model("qwen2.5-0.5b"), from, to);
  EXPECT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> job = Job::Create(std::move(layouts->source), std::move(layouts->target));
  EXPECT_TRUE(job.ok()) << job.status();
  return *std::move(job);
}

TEST(NamedPlacementTest, PpnPlacesProcessesPerNode) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  absl::StatusOr<Layout> rollout = BuildNamedLayout(model, "vllm(tp=2,dp=3,ppn=4)");
  ASSERT_TRUE(rollout.ok()) << rollout.status();
  EXPECT_EQ(Nodes(*rollout),
            (std::vector<std::string>{"rollout-node0", "rollout-node0", "rollout-node0",
                                      "rollout-node0", "rollout-node1", "rollout-node1"}));
  absl::StatusOr<Layout> fsdp = BuildNamedLayout(model, "fsdp(3, ppn=1)");
  ASSERT_TRUE(fsdp.ok()) << fsdp.status();
  EXPECT_EQ(Nodes(*fsdp),
            (std::vector<std::string>{"trainer-node0", "trainer-node1", "trainer-node2"}));
  // The key wins over the option; the pieces do not depend on placement.
  NamedLayoutOptions options;
  options.procs_per_node = 1;
  absl::StatusOr<Layout> keyed = BuildNamedLayout(model, "megatron(tp=2,ppn=2)", options);
  absl::StatusOr<Layout> plain = BuildNamedLayout(model, "megatron(tp=2)", options);
  ASSERT_TRUE(keyed.ok() && plain.ok());
  EXPECT_EQ(Nodes(*keyed), (std::vector<std::string>{"trainer-node0", "trainer-node0"}));
  EXPECT_EQ(Nodes(*plain), (std::vector<std::string>{"trainer-node0", "trainer-node1"}));
  EXPECT_EQ(keyed->pieces.size(), plain->pieces.size());
  EXPECT_EQ(keyed->PieceBytes(), plain->PieceBytes());
}

TEST(NamedPlacementTest, SeparateNodesByDefault) {
  const Job job = MakeJob("megatron(tp=2,dp=2)", "vllm(tp=2)");
  for (int32_t trainer = 0; trainer < 4; ++trainer) {
    for (int32_t rollout = 0; rollout < 2; ++rollout) {
      EXPECT_EQ(job.PathClass(trainer, job.TargetId(rollout)), kPathInterNode);
    }
  }
  EXPECT_EQ(job.PathClass(0, 1), kPathIntraNode);
}

TEST(NamedPlacementTest, ColocatedPutsRolloutRankOnItsTrainerRanksNode) {
  // colocated on one side places both; ppn=1: one GPU, one node per rank.
  const Job job = MakeJob("megatron(tp=2,dp=2,colocated=1,ppn=1)", "vllm(tp=2)");
  EXPECT_EQ(job.processes()[0].node_id, "node0");
  EXPECT_EQ(job.processes()[job.TargetId(1)].node_id, "node1");
  for (int32_t trainer = 0; trainer < 4; ++trainer) {
    for (int32_t rollout = 0; rollout < 2; ++rollout) {
      // ppn=1: rank r alone on node r, GPU 0, so the pair of one rank shares that GPU.
      EXPECT_EQ(job.PathClass(trainer, job.TargetId(rollout)),
                trainer == rollout ? kPathSameDevice : kPathInterNode)
          << trainer << " -> rollout " << rollout;
    }
  }
  // The default ppn (8): the whole job on node0, every path intra_node.
  const Job one_node = MakeJob("megatron(tp=2)", "vllm(tp=2,colocated=1)");
  for (int32_t id = 0; id < one_node.num_processes(); ++id) {
    EXPECT_EQ(one_node.processes()[id].node_id, "node0");
  }
  EXPECT_EQ(one_node.PathClass(0, one_node.TargetId(1)), kPathIntraNode);
  // A ppn given on the other side of a colocated pair applies to both.
  const Job spread = MakeJob("megatron(tp=2,dp=2,colocated=1)", "vllm(tp=2,dp=2,ppn=2)");
  for (int32_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(spread.processes()[rank].node_id, spread.processes()[spread.TargetId(rank)].node_id);
  }
  EXPECT_EQ(spread.processes()[2].node_id, "node1");
}

void ExpectRefused(const std::string& from, const std::string& to, const std::string& message) {
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(Model("qwen2.5-0.5b"), from, to);
  ASSERT_FALSE(layouts.ok()) << from << " " << to;
  EXPECT_EQ(layouts.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(layouts.status().message()), HasSubstr(message));
}

TEST(NamedPlacementTest, BadPlacementsAreRefused) {
  ExpectRefused("megatron(colocated=2)", "vllm()", "colocated must be 0 or 1, got \"2\"");
  ExpectRefused("megatron(colocated=yes)", "vllm()", "colocated must be 0 or 1");
  ExpectRefused("megatron()", "vllm(ppn=0)", "ppn must be a positive integer, got \"0\"");
  ExpectRefused("megatron(ppn=2,ppn=2)", "vllm()", "key \"ppn\" given twice");
  ExpectRefused("megatron(colocated=1)", "vllm(colocated=0)", "disagree on colocated");
  ExpectRefused("megatron(colocated=1,ppn=4)", "vllm(ppn=2)", "need the same ppn, got 4 and 2");
  ExpectRefused("megatron(tq=1)", "vllm()", "expected tp, pp, ep, dp, ppn or colocated");
  // Separate nodes may differ in ppn.
  EXPECT_TRUE(
      BuildNamedJobLayouts(Model("qwen2.5-0.5b"), "megatron(ppn=4)", "vllm(ppn=2,colocated=0)")
          .ok());
}

}  // namespace
}  // namespace wsync
