// The cost model of FP8 targets (plugin/prediction.h): PlanTraffic carries the quantization
// steps' bytes (e4m3 + scales, gathers), PredictSync adds the quantize term and counts the rounds
// of the quantization steps' segments and of every wave of a streamed sync, and a block-FP8
// rollout's predicted transfer shrinks with its bytes.

#include <algorithm>
#include <cstdint>

#include "calibration/link_model/link_model.h"
#include "executor/schedule.h"
#include "executor/waves.h"
#include "gtest/gtest.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/policy.h"
#include "planner/quant_plan.h"
#include "planner/waves.h"
#include "plugin/prediction.h"

namespace wsync {
namespace {

constexpr char kLinks[] = "local=1us,20GB/s;intra_node=5us,4GB/s;inter_node=10us,2GB/s";

Job MakeJob(absl::string_view model_name, absl::string_view from, absl::string_view to) {
  const ModelSpec model = *GetModel(model_name);
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(model, from, to);
  EXPECT_TRUE(layouts.ok()) << layouts.status();
  absl::StatusOr<Job> job = Job::Create(layouts->source, layouts->target);
  EXPECT_TRUE(job.ok()) << job.status();
  return *std::move(job);
}

int64_t TrafficBytes(const Traffic& traffic) {
  int64_t bytes = 0;
  for (const PairTraffic& pair : traffic.pairs) bytes += pair.bytes;
  return bytes;
}

TEST(QuantPredictionTest, TrafficCarriesTheQuantizationSteps) {
  // megatron(tp=2) cuts qwen2.5-tiny's 64 x 128 blocks of k, v, gate, up, o and down:
  // receiver-side steps as well.
  const Job job = MakeJob("qwen2.5-tiny", "megatron(tp=2)", "vllm(tp=1, quant=fp8_block)");
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  int64_t segment_bytes = 0;
  for (const Segment& segment : plan.segments) {
    segment_bytes += segment.elements() * job.ElementSize(segment.param);
  }
  const QuantWireBytes quant = CountQuantWireBytes(job, plan.quant);
  EXPECT_GT(quant.gathered, 0);
  EXPECT_GT(quant.fp8, 0);
  EXPECT_EQ(TrafficBytes(PlanTraffic(job, plan)), segment_bytes + quant.total());
}

TEST(QuantPredictionTest, BlockFp8HalvesThePredictedTransferAndAddsTheQuantizeTerm) {
  const LinkFits fits = *FitLinks(*SyntheticCalibration(kLinks));
  const Job bf16 = MakeJob("qwen2.5-0.5b", "megatron", "vllm");
  const Job fp8 = MakeJob("qwen2.5-0.5b", "megatron", "vllm(quant=fp8_block)");
  const absl::StatusOr<Prediction> plain =
      PredictSync(bf16, *MakeFirstHolderPolicy(), fits, StagingBudget{});
  const absl::StatusOr<Prediction> quantized =
      PredictSync(fp8, *MakeFirstHolderPolicy(), fits, StagingBudget{});
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  EXPECT_EQ(plain->quantize_seconds, 0);
  EXPECT_GT(quantized->quantize_seconds, 0);
  EXPECT_DOUBLE_EQ(quantized->seconds, quantized->transfer_seconds + quantized->latency_seconds +
                                           quantized->quantize_seconds);
  // One link binds: the transfer scales with the bytes. The tied embedding (27% of
  // qwen2.5-0.5b's bytes) and the norms stay bf16, the rest is halved: about 0.64.
  const Plan plan = *MakePlan(fp8, *MakeFirstHolderPolicy());
  const double ratio = static_cast<double>(TrafficBytes(PlanTraffic(fp8, plan))) /
                       TrafficBytes(PlanTraffic(bf16, *MakePlan(bf16, *MakeFirstHolderPolicy())));
  EXPECT_LT(ratio, 0.66);
  EXPECT_NEAR(quantized->transfer_seconds / plain->transfer_seconds, ratio, 0.01);
  // The quantize term: the one trainer quantizes every FP8 weight's bf16 bytes.
  EXPECT_DOUBLE_EQ(quantized->quantize_seconds,
                   static_cast<double>(CountQuantWireBytes(fp8, plan.quant).unquantized) /
                       kQuantizeInputBytesPerSecond);
}

// The busiest process's rounds under `budget`: with the quantization steps' segments (as they run)
// or the plan's segments alone; `waves` (when given) run one after another (ScheduleWaves).
int64_t BusiestRounds(const Job& job, const Plan& plan, StagingBudget budget, bool with_quant,
                      const std::vector<Wave>* waves = nullptr) {
  Endpoints endpoints;
  for (int32_t p = 0; p < job.num_processes(); ++p) endpoints.processes.push_back(p);
  int64_t rounds = 0;
  for (int32_t p : endpoints.processes) {
    absl::StatusOr<ProcessSchedule> schedule =
        waves != nullptr ? ScheduleWaves(job, *waves, plan.quant, endpoints, budget, p)
        : with_quant     ? ScheduleTransfers(job, plan.segments, plan.quant, endpoints, budget, p)
                         : ScheduleTransfers(job, plan.segments, endpoints, budget, p);
    EXPECT_TRUE(schedule.ok()) << schedule.status();
    if (schedule.ok()) rounds = std::max<int64_t>(rounds, schedule->rounds);
  }
  return rounds;
}

TEST(QuantPredictionTest, TheLatencyTermCountsTheRoundsOfTheQuantizationSteps) {
  // Latency-bound links: 1 ms per message, bandwidth that makes the transfer negligible.
  constexpr double kAlpha = 1e-3;
  const LinkFits fits = *FitLinks(
      *SyntheticCalibration("local=1ms,1000GB/s;intra_node=1ms,1000GB/s;inter_node=1ms,1000GB/s"));
  // The trainers' tp=2 cuts q/k/v/o blocks: sender-side steps and gathers both.
  const Job job = MakeJob("qwen2.5-0.5b", "megatron(tp=2)", "vllm(quant=fp8_block)");
  const StagingBudget budget{4 << 20};
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const int64_t rounds = BusiestRounds(job, plan, budget, /*with_quant=*/true);
  // The FP8 weights move only in quantization steps: the plan's segments alone (the bf16
  // embedding and norms) take fewer rounds.
  ASSERT_GT(rounds, BusiestRounds(job, plan, budget, /*with_quant=*/false));
  const absl::StatusOr<Prediction> prediction =
      PredictSync(job, *MakeFirstHolderPolicy(), fits, budget);
  ASSERT_TRUE(prediction.ok()) << prediction.status();
  const double expected = std::max(kAlpha, rounds * kAlpha / kRoundsInFlight);
  EXPECT_NEAR(prediction->latency_seconds, expected, expected * 1e-6);
}

// A streamed sync (planner/waves.h) runs its waves one after another: the latency term counts
// the rounds of its waves as they run (ScheduleWaves), not those of the plan in one run, which
// differ (17 and 21 for this job: each wave packs its own messages).
TEST(QuantPredictionTest, TheLatencyTermCountsTheRoundsOfEveryWave) {
  constexpr double kAlpha = 1e-3;
  const LinkFits fits = *FitLinks(
      *SyntheticCalibration("local=1ms,1000GB/s;intra_node=1ms,1000GB/s;inter_node=1ms,1000GB/s"));
  const Job plain = MakeJob("qwen2.5-tiny", "megatron(tp=2)", "vllm(tp=2)");
  Layout target = plain.target();
  for (size_t i = 0; i < target.params.size(); ++i) {
    target.params[i].wave = static_cast<int32_t>(i % 4);
  }
  const Job waved = *Job::Create(plain.source(), target);
  const StagingBudget budget{64 << 10};
  const Plan plan = *MakePlan(waved, *MakeFirstHolderPolicy());
  const std::vector<Wave> waves = SplitIntoWaves(waved, plan.segments);
  ASSERT_EQ(waves.size(), 4u);
  const int64_t rounds = BusiestRounds(waved, plan, budget, /*with_quant=*/true, &waves);
  ASSERT_NE(rounds, BusiestRounds(waved, plan, budget, /*with_quant=*/true));
  const absl::StatusOr<Prediction> prediction =
      PredictSync(waved, *MakeFirstHolderPolicy(), fits, budget);
  ASSERT_TRUE(prediction.ok()) << prediction.status();
  const double expected = std::max(kAlpha, rounds * kAlpha / kRoundsInFlight);
  EXPECT_NEAR(prediction->latency_seconds, expected, expected * 1e-6);
}

}  // namespace
}  // namespace wsync
