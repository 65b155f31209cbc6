// Hand-derived cases of the relay pass (planner/relay.h): which relay, which stage-1 sender,
// arenas, the cost-model and bytes decisions, the digest, per-process plans, and the proof's
// refusals of broken forwards.

#include "planner/relay.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/builders.h"
#include "planner/plan.h"
#include "planner/policy.h"
#include "tests/testing/random_layouts.h"
#include "tests/testing/reference.h"

namespace wsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One trainer on node "a" holding every parameter in one packed buffer; `rollouts` rollout
// processes on node "b"; rollout r holds parameter "w<i>" ([rows, 4] fp32, packed in a buffer of
// its own) for every i in wants[r].
struct Case {
  Layout source;
  Layout target;
};

Case MakeCase(int params, int64_t rows, const std::vector<std::vector<int>>& wants) {
  LayoutBuilder trainer(Role::kTrainer);
  LayoutBuilder rollout(Role::kRollout);
  const int32_t t = trainer.AddProcess("a");
  const uint64_t all = trainer.AddBuffer(t, params * rows * 4 * 4);
  for (int i = 0; i < params; ++i) {
    const std::string name = "w" + std::to_string(i);
    const int32_t w = trainer.AddParam(name, DType::kFloat32, {rows, 4});
    rollout.AddParam(name, DType::kFloat32, {rows, 4});
    trainer.AddPackedPiece(w, t, all, WholeBox({rows, 4}), i * rows * 4);
  }
  for (const std::vector<int>& wanted : wants) {
    const int32_t p = rollout.AddProcess("b");
    for (int i : wanted) {
      const int32_t w = rollout.AddParam("w" + std::to_string(i), DType::kFloat32, {rows, 4});
      rollout.AddPackedPiece(w, p, rollout.AddBuffer(p, rows * 4 * 4), WholeBox({rows, 4}), 0);
    }
  }
  return Case{std::move(trainer).Build(), std::move(rollout).Build()};
}

Plan MustPlan(const Job& job, PlanOptions options) {
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy(), options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *std::move(plan) : Plan{};
}

PlanOptions Relaying(RelayMode mode) {
  PlanOptions options;
  options.relay.mode = mode;
  return options;
}

TEST(RelayTest, TwoReplicasOnOneNodeCrossOnceAndForwardFromTheRelaysBuffer) {
  // Rollouts 1 and 2 (global ids) both hold w0 (8 x 4 fp32 = 128 bytes).
  const Case c = MakeCase(1, 8, {{0}, {0}});
  absl::StatusOr<Job> job = Job::Create(c.source, c.target);
  ASSERT_TRUE(job.ok()) << job.status();
  const Plan direct = MustPlan(*job, Relaying(RelayMode::kNever));
  const Plan relayed = MustPlan(*job, Relaying(RelayMode::kAlways));
  EXPECT_TRUE(direct.relays.empty());
  EXPECT_EQ(direct.inter_node_bytes, 256);
  ASSERT_EQ(relayed.relays.size(), 1u);
  const Relay& relay = relayed.relays[0];
  EXPECT_EQ(relay.sender, 0);
  EXPECT_EQ(relay.relay, 1);  // Both receivers forward 128 bytes; the lower id wins.
  EXPECT_THAT(relay.receivers, ElementsAre(2));
  EXPECT_FALSE(relay.in_arena);
  EXPECT_EQ(relayed.inter_node_bytes, 128);
  EXPECT_EQ(relayed.inter_node_bytes_without_relay, 256);
  ASSERT_EQ(relayed.segments.size(), 2u);
  const Segment& stage1 = relayed.segments[0];
  const Segment& stage2 = relayed.segments[1];
  EXPECT_EQ(stage1.from.process, 0);
  EXPECT_EQ(stage1.to.process, 1);
  EXPECT_EQ(stage2.from, stage1.to);
  EXPECT_EQ(stage2.to.process, 2);
  EXPECT_EQ(stage2.box, stage1.box);
  EXPECT_NE(relayed.digest, direct.digest);
  EXPECT_TRUE(test::RunReference(*job, relayed.segments, c.source, c.target, 3).ok());

  // Rollout 2's plan carries the stage-1 segment into its relay; the trainer's only its own.
  PlanOptions mine = Relaying(RelayMode::kAlways);
  mine.process = 2;
  EXPECT_EQ(MustPlan(*job, mine).segments, relayed.segments);
  mine.process = 0;
  const Plan trainer = MustPlan(*job, mine);
  EXPECT_THAT(trainer.segments, ElementsAre(stage1));
  EXPECT_EQ(trainer.digest, relayed.digest);
}

TEST(RelayTest, LoadIsBalancedAndABusyNodeRelaysThroughAnArena) {
  // Rollout 1 holds nothing of w0..w3; rollouts 2, 3, 4 hold all four (128 bytes each). The
  // first three boxes go to relays 2, 3, 4 (256 bytes forwarded each); for the fourth, rollout 1
  // would forward 3 x 128 = 384 bytes, any other 256 + 256 = 512: it takes w3 into its arena.
  const Case c = MakeCase(4, 8, {{}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}});
  absl::StatusOr<Job> job = Job::Create(c.source, c.target);
  ASSERT_TRUE(job.ok()) << job.status();
  const Plan plan = MustPlan(*job, Relaying(RelayMode::kAlways));
  ASSERT_EQ(plan.relays.size(), 4u);
  std::vector<int32_t> relays;
  for (const Relay& relay : plan.relays) relays.push_back(relay.relay);
  EXPECT_THAT(relays, ElementsAre(2, 3, 4, 1));
  EXPECT_TRUE(plan.relays[3].in_arena);
  EXPECT_EQ(plan.relays[3].arena_offset_bytes, 0);
  EXPECT_THAT(plan.relays[3].receivers, ElementsAre(2, 3, 4));
  EXPECT_EQ(plan.inter_node_bytes, 4 * 128);
  EXPECT_EQ(plan.inter_node_bytes_without_relay, 12 * 128);
  int into_arena = 0;
  for (const Segment& s : plan.segments) {
    if (s.to.buffer == kRelayArenaBuffer) {
      ++into_arena;
      EXPECT_EQ(s.to.process, 1);
      EXPECT_EQ(s.to.strides, (Dims{4, 1}));
    }
  }
  EXPECT_EQ(into_arena, 1);
  EXPECT_TRUE(test::RunReference(*job, plan.segments, c.source, c.target, 5).ok());

  // With an arena too small for 128 bytes the fourth box goes to the lowest of the tied receivers.
  PlanOptions small = Relaying(RelayMode::kAlways);
  small.relay.arena_bytes = 100;
  const Plan no_arena = MustPlan(*job, small);
  ASSERT_EQ(no_arena.relays.size(), 4u);
  EXPECT_EQ(no_arena.relays[3].relay, 2);
  EXPECT_FALSE(no_arena.relays[3].in_arena);
  EXPECT_NE(no_arena.digest, plan.digest);
}

TEST(RelayTest, AutoAsksTheCostModelAndFallsBackToBytes) {
  // A 4096 x 4 fp32 box (64 KiB) and a 1 x 4 one (16 bytes), each wanted by both rollouts.
  const Case big = MakeCase(1, 4096, {{0}, {0}});
  const Case tiny = MakeCase(1, 1, {{0}, {0}});
  absl::StatusOr<Job> big_job = Job::Create(big.source, big.target);
  absl::StatusOr<Job> tiny_job = Job::Create(tiny.source, tiny.target);
  ASSERT_TRUE(big_job.ok() && tiny_job.ok());

  auto fits_of = [](const char* spec) {
    return std::make_shared<const LinkFits>(*FitLinks(*SyntheticCalibration(spec)));
  };
  PlanOptions fast_intra = Relaying(RelayMode::kAuto);
  fast_intra.relay.fits = fits_of("intra_node=5us,100GB/s;inter_node=20us,1GB/s");
  const Plan big_plan = MustPlan(*big_job, fast_intra);
  ASSERT_EQ(big_plan.relays.size(), 1u);
  EXPECT_LT(big_plan.relays[0].predicted_relay_seconds,
            big_plan.relays[0].predicted_direct_seconds);
  // 16 bytes: the second hop's latency outweighs sending them twice.
  EXPECT_TRUE(MustPlan(*tiny_job, fast_intra).relays.empty());
  // An intra-node path slower than the inter-node one: forwarding costs more than it saves.
  PlanOptions slow_intra = Relaying(RelayMode::kAuto);
  slow_intra.relay.fits = fits_of("intra_node=5us,0.5GB/s;inter_node=20us,1GB/s");
  EXPECT_TRUE(MustPlan(*big_job, slow_intra).relays.empty());
  // Fits without an intra-node path, and no fits at all: the bytes rule (64 KiB relays, 16 do not).
  PlanOptions inter_only = Relaying(RelayMode::kAuto);
  inter_only.relay.fits = fits_of("inter_node=20us,1GB/s");
  const Plan by_bytes = MustPlan(*big_job, inter_only);
  ASSERT_EQ(by_bytes.relays.size(), 1u);
  EXPECT_EQ(by_bytes.relays[0].predicted_relay_seconds, 0);
  EXPECT_EQ(MustPlan(*big_job, Relaying(RelayMode::kAuto)).relays.size(), 1u);
  EXPECT_TRUE(MustPlan(*tiny_job, Relaying(RelayMode::kAuto)).relays.empty());
  EXPECT_EQ(MustPlan(*tiny_job, Relaying(RelayMode::kAlways)).relays.size(), 1u);
}

TEST(RelayTest, OnlyInterNodeBoxesWantedTwiceOnOneNodeAreRelayed) {
  // Two rollouts on node "a" (the trainer's) and one on "b": nothing crosses twice into one node.
  const Job job = test::OneTrainerToWholeCopies({8, 4}, {"a", "a", "b"});
  EXPECT_TRUE(MustPlan(job, Relaying(RelayMode::kAlways)).relays.empty());
}

TEST(RelayTest, TheProofRefusesBrokenForwardsAndArenas) {
  const Case c = MakeCase(4, 8, {{}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}});
  absl::StatusOr<Job> job = Job::Create(c.source, c.target);
  ASSERT_TRUE(job.ok()) << job.status();
  const Plan plan = MustPlan(*job, Relaying(RelayMode::kAlways));
  ASSERT_TRUE(ProveExact(*job, plan.segments).ok());
  auto refusal = [&](const std::vector<Segment>& segments) {
    absl::Status status = ProveExact(*job, segments);
    EXPECT_FALSE(status.ok());
    return std::string(status.message());
  };
  size_t arena_fill = 0, forward = 0;
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    if (plan.segments[i].to.buffer == kRelayArenaBuffer) arena_fill = i;
    if (!job->IsSource(plan.segments[i].from.process)) forward = i;
  }
  // A forward chained from another forward is not what a trainer delivered.
  std::vector<Segment> chained = plan.segments;
  chained.push_back(plan.segments[forward]);
  chained.back().from = plan.segments[forward].to;
  chained.back().to = plan.segments[forward].from;
  EXPECT_THAT(refusal(chained), HasSubstr("forwards a region no segment from a trainer"));
  // An arena fill nobody forwards from.
  std::vector<Segment> unread = plan.segments;
  std::erase_if(unread, [&](const Segment& s) { return s.from == plan.segments[arena_fill].to; });
  EXPECT_THAT(refusal(unread), HasSubstr("fills a relay arena nothing forwards from"));
  // Two arena fills overlapping, and one misaligned.
  std::vector<Segment> overlapping = plan.segments;
  Segment twin = plan.segments[arena_fill];
  twin.to.offset += 16;  // 64 bytes in: aligned, but inside the first fill.
  overlapping.push_back(twin);
  for (const Segment& s : plan.segments) {
    if (s.from == plan.segments[arena_fill].to) {
      overlapping.push_back(s);
      overlapping.back().from = twin.to;
    }
  }
  EXPECT_THAT(refusal(overlapping), HasSubstr("relay arena writes of process 1 overlap"));
  std::vector<Segment> misaligned = plan.segments;
  misaligned[arena_fill].to.offset += 1;
  EXPECT_THAT(refusal(misaligned), HasSubstr("bad offset"));
}

TEST(RelayTest, ModesParseAndTheArenaBufferIdIsReserved) {
  EXPECT_EQ(*ParseRelayMode("never"), RelayMode::kNever);
  EXPECT_EQ(*ParseRelayMode("always"), RelayMode::kAlways);
  EXPECT_EQ(*ParseRelayMode("auto"), RelayMode::kAuto);
  EXPECT_FALSE(ParseRelayMode("sometimes").ok());
  Case c = MakeCase(1, 8, {{0}});
  c.target.buffers[0].id = kRelayArenaBuffer;
  c.target.pieces[0].buffer = kRelayArenaBuffer;
  absl::StatusOr<Job> job = Job::Create(c.source, c.target);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), HasSubstr("reserved for relay arenas"));
}

}  // namespace
}  // namespace wsync
