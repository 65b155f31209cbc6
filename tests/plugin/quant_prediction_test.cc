// The cost model of FP8 targets (plugin/prediction.h): PlanTraffic carries the quantization
// steps' bytes (e4m3 + scales, gathers), PredictSync adds the quantize term and counts the rounds
// of the quantization steps' segments and of every wave of a streamed sync, and a block-FP8
// rollout's predicted transfer shrinks with its bytes; the quantize term's rate is the
// calibration's, else a stand-in constant that the reports name.

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "cost/link_model.h"
#include "executor/schedule.h"
#include "executor/waves.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/policy.h"
#include "planner/quant_plan.h"
#include "planner/waves.h"
#include "plugin/prediction.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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

// The quantize term at the rate the calibration measured (issue 46: an AVX2-only CPU quantizes at
// a fraction of the AVX-512 figure of kQuantizeInputBytesPerSecond), the slowest process's; a
// calibration without one prices at the stand-in constant and every report says so.
TEST(QuantPredictionTest, TheQuantizeTermUsesTheCalibratedRateElseTheStandInConstant) {
  constexpr double kRate = 1.25e9;
  constexpr int64_t kInput = int64_t{32} << 20;
  const Job job = MakeJob("qwen2.5-0.5b", "megatron", "vllm(quant=fp8_block)");
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  proto::Calibration measured = *SyntheticCalibration(kLinks);
  for (const int32_t process : {0, 1}) {
    proto::CalibrationSample* sample = measured.add_samples();
    sample->set_pattern("quantize");
    sample->set_from(process);
    sample->set_to(process);
    sample->set_path("local");
    sample->set_bytes(kInput);
    sample->add_seconds(kInput / (process == 0 ? kRate : 2 * kRate));
  }
  const LinkFits fits = *FitLinks(measured);
  ASSERT_DOUBLE_EQ(fits.quantize_bytes_per_second, kRate);
  const absl::StatusOr<Prediction> calibrated =
      PredictSync(job, *MakeFirstHolderPolicy(), fits, StagingBudget{});
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  EXPECT_GT(calibrated->quantize_seconds, 0);
  EXPECT_DOUBLE_EQ(calibrated->quantize_seconds, QuantizeSeconds(job, plan.quant, kRate));
  EXPECT_DOUBLE_EQ(calibrated->quantize_seconds,
                   static_cast<double>(CountQuantWireBytes(job, plan.quant).unquantized) / kRate);
  EXPECT_EQ(calibrated->quantize_bytes_per_second, kRate);
  EXPECT_FALSE(calibrated->quantize_stand_in);
  EXPECT_THAT(StandInNote(fits, *calibrated), Not(HasSubstr("quantize")));
  const std::string calibrated_line = PredictionLine(*calibrated, SharedCalibration{fits, "probe"});
  EXPECT_THAT(calibrated_line,
              HasSubstr(absl::StrFormat("+ quantize %.6f s at 1.25 GB/s of input (calibrated)",
                                        calibrated->quantize_seconds)));
  EXPECT_THAT(calibrated_line, Not(HasSubstr("stand-in")));

  // No quantize samples (a synthetic calibration, or a file before schema 3): the constant.
  const LinkFits unmeasured = *FitLinks(*SyntheticCalibration(kLinks));
  const absl::StatusOr<Prediction> fallback =
      PredictSync(job, *MakeFirstHolderPolicy(), unmeasured, StagingBudget{});
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_DOUBLE_EQ(fallback->quantize_seconds,
                   QuantizeSeconds(job, plan.quant, kQuantizeInputBytesPerSecond));
  EXPECT_DOUBLE_EQ(fallback->quantize_seconds * kQuantizeInputBytesPerSecond,
                   calibrated->quantize_seconds * kRate);
  EXPECT_EQ(fallback->quantize_bytes_per_second, kQuantizeInputBytesPerSecond);
  EXPECT_TRUE(fallback->quantize_stand_in);
  EXPECT_THAT(StandInNote(unmeasured, *fallback),
              HasSubstr("quantize priced at the stand-in 5.50 GB/s of input"));
  const std::string fallback_line =
      PredictionLine(*fallback, SharedCalibration{unmeasured, "synthetic"});
  EXPECT_THAT(fallback_line, HasSubstr("GB/s of input (stand-in)"));
  EXPECT_THAT(fallback_line, HasSubstr("stand-in: quantize priced at the stand-in 5.50 GB/s"));

  // Nothing quantized: no quantize term and no stand-in to name.
  const absl::StatusOr<Prediction> bf16 = PredictSync(MakeJob("qwen2.5-0.5b", "megatron", "vllm"),
                                                      *MakeFirstHolderPolicy(), unmeasured, {});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_FALSE(bf16->quantize_stand_in);
  EXPECT_THAT(StandInNote(unmeasured, *bf16), Not(HasSubstr("quantize")));
}

}  // namespace
}  // namespace wsync
