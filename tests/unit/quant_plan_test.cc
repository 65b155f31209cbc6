// Quantization steps of FP8 targets (planner/quant_plan.h): random shapes, blockings and TP/EP
// cuts on both sides planned, proven, simulated on the host and compared bit for bit with the
// reference quantizer of the whole tensor; broken plans refused by the proof.

#include "planner/quant_plan.h"

#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/policy.h"
#include "tests/testing/property_scale.h"
#include "tests/unit/quant_plan_support.h"

namespace wsync {
namespace {

using quant_plan_test::AxisCuts;
using ::testing::HasSubstr;

struct Counts {
  int sender = 0;
  int receiver = 0;
};

// One random case: plans, proves and simulates; returns how many steps of each side it had.
void RunRandomCase(std::mt19937_64& rng, Counts& counts) {
  const quant_plan_test::Geometry g = quant_plan_test::RandomGeometry(rng, 5, 3);
  const ParamQuant& quant = g.quant;
  const bool experts = g.experts;
  const Dims& shape = g.shape;
  const AxisCuts& source_cuts = g.source_cuts;
  const AxisCuts& target_cuts = g.target_cuts;
  const int source_replicas = 1 + static_cast<int>(rng() % 2);
  const int target_replicas = 1 + static_cast<int>(rng() % 2);
  const int64_t pad = static_cast<int64_t>(rng() % 3);
  SCOPED_TRACE(::testing::Message() << "shape " << DimsToString(shape) << " blocks "
                                    << quant.block_rows << "x" << quant.block_cols);
  absl::StatusOr<Job> job =
      Job::Create(quant_plan_test::QuantSource(shape, source_cuts, source_replicas, pad),
                  quant_plan_test::QuantTarget(shape, quant, target_cuts, target_replicas, pad));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->segments.empty());
  for (const QuantTransform& step : plan->quant.transforms) {
    ++(step.side == QuantSide::kSender ? counts.sender : counts.receiver);
  }
  fp8_test::Tensor tensor =
      fp8_test::RandomTensor(rng, experts ? shape[0] : 1, shape[shape.size() - 2], shape.back());
  quant_plan_test::Memory memory = quant_plan_test::AllocateMemory(*job, tensor);
  quant_plan_test::RunQuantSteps(*job, plan->quant, memory);
  quant_plan_test::ExpectMatchesReference(*job, tensor, memory);

  // Every process's own plan lists exactly its steps of the full plan, and proves.
  for (int32_t p = 0; p < job->num_processes(); p += 1 + job->num_processes() / 4) {
    PlanOptions options;
    options.process = p;
    absl::StatusOr<Plan> mine = MakePlan(*job, *MakeFirstHolderPolicy(), options);
    ASSERT_TRUE(mine.ok()) << mine.status();
    const QuantPlan expected = planner_internal::QuantForProcess(plan->quant, p);
    EXPECT_EQ(mine->quant.transforms, expected.transforms);
    EXPECT_EQ(mine->quant.gathers, expected.gathers);
    EXPECT_EQ(mine->digest, plan->digest);
  }
}

TEST(QuantPlanTest, RandomCutsQuantizeExactlyAsTheReference) {
  std::mt19937_64 rng(22);
  Counts counts;
  const int64_t cases = test::ScaledCases(150, 30);
  for (int64_t i = 0; i < cases; ++i) {
    SCOPED_TRACE(i);
    RunRandomCase(rng, counts);
    if (HasFatalFailure()) return;
  }
  // Both sides were exercised (about half the cases each).
  EXPECT_GT(counts.sender, cases / 3);
  EXPECT_GT(counts.receiver, cases / 3);
}

using quant_plan_test::FixedCase;
using quant_plan_test::MakeFixedCase;

TEST(QuantPlanTest, SplitsBlocksBySide) {
  const FixedCase c = MakeFixedCase();
  int sender = 0, receiver = 0;
  for (const QuantTransform& step : c.plan.quant.transforms) {
    ++(step.side == QuantSide::kSender ? sender : receiver);
    // Block columns 0 ([0, 128)) and 2 ([256, 300), ragged) lie inside one trainer piece each;
    // column 150 cuts block column 1 ([128, 256)), which is gathered.
    if (step.side == QuantSide::kSender) {
      EXPECT_TRUE(step.blocks.origin[1] == 0 || step.blocks.origin[1] == 256)
          << BoxToString(step.blocks);
    } else {
      EXPECT_EQ(step.blocks.origin[1], 128);
      EXPECT_EQ(step.blocks.extent[1], 128);
    }
  }
  // Receiver 0 (rows [0, 100)) needs block row 0; receiver 1 (rows [100, 256)) block rows 0-1.
  EXPECT_EQ(sender, 4);
  EXPECT_EQ(receiver, 2);
  const QuantWireBytes bytes = CountQuantWireBytes(c.job, c.plan.quant);
  EXPECT_EQ(bytes.fp8, 256 * (128 + 44));
  EXPECT_EQ(bytes.scales, (2 + 4) * 4);
  EXPECT_EQ(bytes.gathered, (128 + 256) * 128 * 2);
  EXPECT_EQ(bytes.unquantized, 256 * 300 * 2);
  EXPECT_EQ(bytes.without_sender_quant, (128 + 256) * 300 * 2);
}

// Each mutation breaks one rule of the proof; the proof refuses each.
TEST(QuantPlanTest, ProofRefusesBrokenPlans) {
  const FixedCase c = MakeFixedCase();
  ASSERT_TRUE(ProveQuantExact(c.job, c.plan.quant).ok());
  // The refusal's message, owned (the status it came from is gone when this returns).
  auto refused = [&](const QuantPlan& broken, absl::string_view reason) -> std::string {
    const absl::Status status = ProveQuantExact(c.job, broken);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << reason << ": " << status;
    return std::string(status.message());
  };
  auto first_of = [&](QuantPlan& plan, QuantSide side) -> QuantTransform& {
    for (QuantTransform& step : plan.transforms) {
      if (step.side == side) return step;
    }
    return plan.transforms.front();
  };
  QuantPlan broken = c.plan.quant;
  broken.transforms.erase(broken.transforms.begin());
  EXPECT_THAT(refused(broken, "a step dropped"), HasSubstr("not written exactly once"));

  broken = c.plan.quant;
  broken.transforms.push_back(first_of(broken, QuantSide::kSender));
  EXPECT_THAT(refused(broken, "a step twice"), HasSubstr("not written exactly once"));

  broken = c.plan.quant;
  first_of(broken, QuantSide::kSender).blocks.origin[0] += 1;
  EXPECT_THAT(refused(broken, "blocks off the grid"), HasSubstr("whole blocks"));

  broken = c.plan.quant;
  first_of(broken, QuantSide::kSender).scale_box.extent[1] += 1;
  EXPECT_THAT(refused(broken, "a wrong scale box"), HasSubstr("other blocks"));

  broken = c.plan.quant;
  first_of(broken, QuantSide::kSender).from.offset += 1;
  EXPECT_THAT(refused(broken, "a wrong source address"), HasSubstr("no source piece"));

  broken = c.plan.quant;
  first_of(broken, QuantSide::kReceiver).to.offset += 1;
  refused(broken, "a wrong target address");

  broken = c.plan.quant;
  broken.gathers.pop_back();
  EXPECT_THAT(refused(broken, "a gather dropped"), HasSubstr("gathered exactly once"));

  broken = c.plan.quant;
  broken.gathers.push_back(broken.gathers.front());
  EXPECT_THAT(refused(broken, "a gather twice"), HasSubstr("gathered exactly once"));

  broken = c.plan.quant;
  first_of(broken, QuantSide::kReceiver).from.offset += 1;
  EXPECT_THAT(refused(broken, "a misaligned arena region"), HasSubstr("aligned row-major"));

  broken = c.plan.quant;
  first_of(broken, QuantSide::kReceiver).side = QuantSide::kSender;
  refused(broken, "a receiver-side step called sender-side");
}

// Column cuts at 150 and 420 of [256, 700] leave block columns 1 and 3 cut: one receiver with
// two receiver-side steps, whose arena regions must not overlap.
TEST(QuantPlanTest, ProofRefusesOverlappingArenaRegions) {
  const FixedCase c =
      MakeFixedCase({256, 700}, {{0, 256}, {0, 150, 420, 700}}, {{0, 256}, {0, 700}});
  std::vector<int> receiver_side;
  for (size_t k = 0; k < c.plan.quant.transforms.size(); ++k) {
    if (c.plan.quant.transforms[k].side == QuantSide::kReceiver) receiver_side.push_back(k);
  }
  ASSERT_EQ(receiver_side.size(), 2u);
  ASSERT_TRUE(ProveQuantExact(c.job, c.plan.quant).ok());
  QuantPlan broken = c.plan.quant;
  broken.transforms[receiver_side[1]].from.offset = broken.transforms[receiver_side[0]].from.offset;
  const absl::Status status = ProveQuantExact(c.job, broken);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(), HasSubstr("arena bytes another step"));
}

TEST(QuantPlanTest, OrdinarySegmentsIntoQuantizedParametersAreRefused) {
  const FixedCase c = MakeFixedCase();
  Segment copy;
  copy.param = c.plan.quant.gathers.front().param;
  copy.box = c.plan.quant.transforms.front().box;
  copy.from = c.plan.quant.transforms.front().from;
  copy.to = c.plan.quant.transforms.front().to;
  const absl::Status status = ProveExact(c.job, {copy});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("quantized parameter"));
}

}  // namespace
}  // namespace wsync
