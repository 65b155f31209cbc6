// The sender's quantize steps cut in bands (executor/quant_work.h: QuantizeSends), so that a run
// moves what it posted between two bands: over random shapes, blockings, expert axes and TP cuts
// the e4m3 bytes and scales of every band size equal those of one call over each whole step, and
// the run's hook is called between every two bands and nowhere else; a sync (threads over
// loopback) calls Transport::ProgressInFlight between the bands and lands the reference's bytes.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "executor/execute.h"
#include "executor/quant_work.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/loopback_threads.h"
#include "tests/unit/quant_plan_support.h"
#include "transport/forwarding_transport.h"

namespace wsync {
namespace {

using executor_internal::QuantizeSends;
using executor_internal::SendQuantCall;
using ::testing::HasSubstr;

constexpr int64_t kWholeSteps = std::numeric_limits<int64_t>::max();

// The outputs of one process's sender-side steps, each step's e4m3 blocks and scales packed.
struct Outputs {
  std::vector<std::vector<uint8_t>> fp8;
  std::vector<std::vector<uint8_t>> scales;
  int hook_calls = 0;
};

// Runs the sender-side steps of `process` in `plan` with `band_input_bytes`.
absl::Status RunSends(const Job& job, const Plan& plan, int32_t process,
                      quant_plan_test::Memory& memory, int64_t band_input_bytes, Outputs& out) {
  LocalBuffers buffers;
  for (const BufferInfo& buffer : job.source().buffers) {
    if (job.SourceId(buffer.process) != process) continue;
    buffers[buffer.id] = memory[{process, buffer.id}].data();
  }
  std::vector<SendQuantCall> calls;
  for (const QuantTransform& step : plan.quant.transforms) {
    if (step.side != QuantSide::kSender || step.from.process != process) continue;
    out.fp8.emplace_back(Volume(step.blocks), 0xff);
    out.scales.emplace_back(Volume(step.scale_box) * sizeof(float), 0xff);
  }
  size_t i = 0;
  for (const QuantTransform& step : plan.quant.transforms) {
    if (step.side != QuantSide::kSender || step.from.process != process) continue;
    calls.push_back({&step, reinterpret_cast<char*>(out.fp8[i].data()),
                     reinterpret_cast<char*>(out.scales[i].data())});
    ++i;
  }
  return QuantizeSends(
      job, calls, buffers, [&out] { ++out.hook_calls; }, band_input_bytes);
}

// The bands QuantizeSends cuts `step` into at one band per expert or block row.
int64_t SmallestBands(const Job& job, const QuantTransform& step) {
  const Dims& extent = step.blocks.extent;
  if (extent.size() == 3) return extent[0];
  const int64_t block_rows = job.target().params[step.param].quant.block_rows;
  return block_rows >= extent[0] ? 1 : (extent[0] + block_rows - 1) / block_rows;
}

TEST(QuantBandsTest, EveryBandSizeWritesTheBytesOfWholeSteps) {
  std::mt19937_64 rng(20261205);
  int banded_steps = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const quant_plan_test::Geometry g = quant_plan_test::RandomGeometry(rng, 5, 3);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " shape " << DimsToString(g.shape) << " blocks "
                 << g.quant.block_rows << "x" << g.quant.block_cols);
    absl::StatusOr<Job> job =
        Job::Create(quant_plan_test::QuantSource(g.shape, g.source_cuts, 1, rng() % 3),
                    quant_plan_test::QuantTarget(g.shape, g.quant, g.target_cuts, 1, 0));
    ASSERT_TRUE(job.ok()) << job.status();
    absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
    ASSERT_TRUE(plan.ok()) << plan.status();
    const fp8_test::Tensor tensor = fp8_test::RandomTensor(
        rng, g.experts ? g.shape[0] : 1, g.shape[g.shape.size() - 2], g.shape.back());
    quant_plan_test::Memory memory = quant_plan_test::AllocateMemory(*job, tensor);
    for (int32_t process = 0; process < std::ssize(job->source().processes); ++process) {
      const int32_t id = job->SourceId(process);
      int64_t steps = 0, smallest_bands = 0;
      for (const QuantTransform& step : plan->quant.transforms) {
        if (step.side != QuantSide::kSender || step.from.process != id) continue;
        ++steps;
        smallest_bands += SmallestBands(*job, step);
      }
      if (steps == 0) continue;
      Outputs whole, smallest, random;
      ASSERT_TRUE(RunSends(*job, *plan, id, memory, kWholeSteps, whole).ok());
      ASSERT_TRUE(RunSends(*job, *plan, id, memory, 1, smallest).ok());
      const int64_t band_bytes = 1 + static_cast<int64_t>(rng() % 20000);
      ASSERT_TRUE(RunSends(*job, *plan, id, memory, band_bytes, random).ok());
      EXPECT_EQ(whole.hook_calls, steps - 1);
      EXPECT_EQ(smallest.hook_calls, smallest_bands - 1);
      EXPECT_GE(random.hook_calls, whole.hook_calls);
      EXPECT_LE(random.hook_calls, smallest.hook_calls);
      banded_steps += smallest_bands > steps;
      EXPECT_EQ(smallest.fp8, whole.fp8);
      EXPECT_EQ(smallest.scales, whole.scales);
      EXPECT_EQ(random.fp8, whole.fp8) << "band bytes " << band_bytes;
      EXPECT_EQ(random.scales, whole.scales) << "band bytes " << band_bytes;
    }
  }
  EXPECT_GT(banded_steps, 30);  // The cases cut steps in bands, not only whole.
}

// A NaN in a step's last block row fails it naming the parameter, after the bands before it.
TEST(QuantBandsTest, ANaNInALaterBandFailsTheStep) {
  quant_plan_test::FixedCase fixed = quant_plan_test::MakeFixedCase();
  std::mt19937_64 rng(7);
  fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, 1, 256, 300);
  tensor.bits[255 * 300 + 7] = 0x7fc0;  // A bf16 NaN in row 255 (block row 1).
  quant_plan_test::Memory memory = quant_plan_test::AllocateMemory(fixed.job, tensor);
  Outputs out;
  const absl::Status status =
      RunSends(fixed.job, fixed.plan, fixed.job.SourceId(0), memory, 1, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("parameter w:"));
  EXPECT_GE(out.hook_calls, 1);  // Block row 0 went first, then the hook, then the NaN.
}

// Counts ProgressInFlight calls.
class ProgressCountingTransport final : public ForwardingTransport {
 public:
  ProgressCountingTransport(std::unique_ptr<Transport> inner, std::atomic<int>& calls)
      : ForwardingTransport(std::move(inner)), calls_(calls) {}
  void ProgressInFlight() override {
    ++calls_;
    ForwardingTransport::ProgressInFlight();
  }

 private:
  std::atomic<int>& calls_;
};

TEST(QuantBandsTest, ASyncMovesWhatItPostedBetweenTheBands) {
  // One trainer holds w [1024, 1024] (2 MiB of bf16, 8 block rows: bands of 1 MiB), the
  // rollout cuts its rows at 1000 (inside block row 7): sender-side steps of several bands.
  const Dims shape = {1024, 1024};
  quant_plan_test::FixedCase fixed =
      quant_plan_test::MakeFixedCase(shape, {{0, 1024}, {0, 1024}}, {{0, 1000, 1024}, {0, 1024}});
  std::mt19937_64 rng(11);
  const fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, 1, shape[0], shape[1]);
  quant_plan_test::Memory memory = quant_plan_test::AllocateMemory(fixed.job, tensor);
  std::atomic<int> progress_calls{0};
  const auto results = test::RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
      fixed.job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> used, Group& group) {
        if (fixed.job.IsSource(p)) {
          used = std::make_unique<ProgressCountingTransport>(std::move(used), progress_calls);
        }
        LocalBuffers buffers;
        for (auto& [key, bytes] : memory) {
          if (key.first == p) buffers[key.second] = bytes.data();
        }
        ExecuteOptions options;
        options.sync_id = 3;
        options.plan_digest = fixed.plan.digest;
        options.deadline = absl::Now() + absl::Seconds(60);
        options.quant = &fixed.plan.quant;
        return ExecuteTransfers(fixed.job, fixed.plan.segments, test::AllProcesses(fixed.job),
                                StagingBudget{static_cast<double>(int64_t{1} << 20)}, p, buffers,
                                *used, group, options);
      });
  for (const auto& result : results) ASSERT_TRUE(result.ok()) << result.status();
  quant_plan_test::ExpectMatchesReference(fixed.job, tensor, memory);
  int64_t sender_bands = 0;
  for (const QuantTransform& step : fixed.plan.quant.transforms) {
    if (step.side == QuantSide::kSender)
      sender_bands += (Volume(step.blocks) * 2 + (1 << 20) - 1) >> 20;
  }
  ASSERT_GT(sender_bands, 2);
  EXPECT_GE(progress_calls.load(), 1);
}

}  // namespace
}  // namespace wsync
