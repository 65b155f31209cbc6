// Delta sync into FP8 targets (executor/delta_run.h, "FP8 targets"): trainers quantize as
// without delta and send, per chunk of e4m3 bytes or scales, only the elements that changed since
// the version the rollout holds. 20 consecutive small updates of a bf16 weight (2% of the
// elements moved by an ulp, and one element a version grown so that its block's scale changes)
// into block-, channel- and tensor-scaled targets, every element checked against the reference
// quantizer of the whole tensor after every version, with verify hashing the patched targets;
// fewer bytes than dense on the wire; dense for every rollout right after an aborted sync.

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "executor/delta_base.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gtest/gtest.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/loopback_threads.h"
#include "tests/unit/executor_test_support.h"
#include "tests/unit/quant_plan_support.h"

namespace wsync {
namespace {

using quant_plan_test::AxisCuts;
using quant_plan_test::Memory;

using test::executor::DeltaJobState;
using test::executor::FailingReceives;

constexpr int64_t kBudget = 4096;

// Sync `version` of every process as threads over loopback, delta on, verify unless a process
// fails; then commits (every run OK) or aborts each store and held version, as a session does.
std::vector<absl::StatusOr<TransferStats>> Sync(const Job& job, const Plan& plan, Memory& memory,
                                                DeltaJobState& state, uint64_t version,
                                                int32_t fail_process) {
  std::vector<absl::StatusOr<TransferStats>> results =
      test::RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
          job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> used, Group& group) {
            if (p == fail_process) used = std::make_unique<FailingReceives>(std::move(used), 2);
            if (version % 2 == 1) {
              used = std::make_unique<test::executor::LockstepTransport>(std::move(used));
            }
            LocalBuffers buffers;
            for (auto& [key, bytes] : memory) {
              if (key.first == p) buffers[key.second] = bytes.data();
            }
            ExecuteOptions options;
            options.sync_id = version;
            options.plan_digest = plan.digest;
            options.deadline = absl::Now() + absl::Seconds(60);
            options.verify = fail_process < 0 ? VerifyMode::kHash : VerifyMode::kOff;
            options.quant = &plan.quant;
            options.delta.on = true;
            options.delta.bases = state.bases[p].get();
            options.delta.held_version = state.held[p];
            return ExecuteTransfers(job, plan.segments, test::AllProcesses(job),
                                    StagingBudget{kBudget}, p, buffers, *used, group, options);
          });
  state.Decide(job, results, version);
  return results;
}

// A weight as a model initialises one: normal with std 0.02, as bf16.
fp8_test::Tensor WeightTensor(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  fp8_test::Tensor tensor{1, rows, cols, {}};
  std::normal_distribution<float> normal(0, 0.02f);
  for (int64_t i = 0; i < rows * cols; ++i) tensor.bits.push_back(fp8_test::Bf16Bits(normal(rng)));
  return tensor;
}

// Moves ~2% of the elements by one ulp (away from or towards zero), and with `grow` one element
// to 1.5 times the tensor's largest magnitude, which changes the scale of its block or row (per
// tensor it would change every element: not then).
void SmallUpdate(fp8_test::Tensor& tensor, bool grow, std::mt19937_64& rng) {
  std::bernoulli_distribution change(0.02);
  double largest = 0;
  for (uint16_t& bits : tensor.bits) {
    largest = std::max(largest, std::fabs(fp8_test::Bf16Value(bits)));
    if ((bits & 0x7fff) != 0 && change(rng)) bits += rng() % 2 == 0 ? 1 : -1;
  }
  if (!grow) return;
  const size_t at = rng() % tensor.bits.size();
  tensor.bits[at] =
      fp8_test::Bf16Bits(static_cast<float>(largest * 1.5) * (rng() % 2 == 0 ? 1 : -1));
}

// Writes `tensor` into the trainers' buffers of `memory` (the rollouts' stay as they are).
void WriteSources(const Job& job, const fp8_test::Tensor& tensor, Memory& memory) {
  const Memory fresh = quant_plan_test::AllocateMemory(job, tensor);
  for (const auto& [key, bytes] : fresh) {
    if (job.IsSource(key.first)) memory[key] = bytes;
  }
}

struct Case {
  const char* name;
  ParamQuant quant;
  AxisCuts source_cuts, target_cuts;
  bool grow = true;  // SmallUpdate's.
};

void RunTwentyVersions(const Case& c) {
  SCOPED_TRACE(c.name);
  const Dims shape = {256, 300};
  absl::StatusOr<Job> job =
      Job::Create(quant_plan_test::QuantSource(shape, c.source_cuts, 1, 0),
                  quant_plan_test::QuantTarget(shape, c.quant, c.target_cuts, 1, 0));
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::mt19937_64 rng(4444);
  fp8_test::Tensor tensor = WeightTensor(rng, shape[0], shape[1]);
  Memory memory = quant_plan_test::AllocateMemory(*job, tensor);
  DeltaJobState state;
  for (int32_t p = 0; p < job->num_processes(); ++p) {
    state.bases.push_back(std::make_unique<DeltaBaseStore>(int64_t{1} << 30));
  }
  state.held.assign(job->num_processes(), std::nullopt);
  int32_t first_rollout = 0;
  while (job->IsSource(first_rollout)) ++first_rollout;
  int64_t wire_bytes = 0, dense_bytes = 0;  // Of the rollouts' delta syncs.
  for (uint64_t version = 1; version <= 20; ++version) {
    SCOPED_TRACE(::testing::Message() << "version " << version);
    if (version > 1) SmallUpdate(tensor, c.grow, rng);
    WriteSources(*job, tensor, memory);
    const bool aborts = version == 6;
    const auto results = Sync(*job, *plan, memory, state, version, aborts ? first_rollout : -1);
    if (aborts) {
      EXPECT_FALSE(results[first_rollout].ok());
      continue;
    }
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      ASSERT_TRUE(results[p].ok()) << "process " << p << ": " << results[p].status();
    }
    ASSERT_NO_FATAL_FAILURE(quant_plan_test::ExpectMatchesReference(*job, tensor, memory));
    for (int32_t p = first_rollout; p < job->num_processes(); ++p) {
      SCOPED_TRACE(::testing::Message() << "rollout " << p);
      const TransferStats& stats = *results[p];
      const int64_t dense = ScheduleTransfers(*job, plan->segments, plan->quant,
                                              test::AllProcesses(*job), StagingBudget{kBudget}, p)
                                ->received_bytes;
      EXPECT_GT(stats.verified_chunks, 0);  // verify hashed the patched targets.
      if (version == 1 || version == 7) {   // Nothing held; dense after the abort.
        EXPECT_EQ(stats.received_bytes, dense);
        EXPECT_EQ(stats.delta_messages, 0);
        continue;
      }
      EXPECT_GT(stats.delta_messages, 0);
      EXPECT_LT(stats.received_bytes, dense);
      EXPECT_EQ(stats.received_bytes + stats.delta_saved_bytes, dense);
      wire_bytes += stats.received_bytes;
      dense_bytes += dense;
    }
  }
  ASSERT_GT(dense_bytes, 0);
  std::printf("%s: delta syncs received %lld bytes of %lld dense (%.4f)\n", c.name,
              static_cast<long long>(wire_bytes), static_cast<long long>(dense_bytes),
              static_cast<double>(wire_bytes) / static_cast<double>(dense_bytes));
}

TEST(DeltaQuantTest, TwentySmallUpdatesIntoABlockTargetAreTheReferenceQuantization) {
  // The trainers cut block column 1 at column 150: its blocks are quantized by the rollouts
  // (gathers, which travel as planned); the others by the trainers, sent as deltas.
  RunTwentyVersions({"fp8_block",
                     ParamQuant{128, 128, ""},
                     {{0, 256}, {0, 150, 300}},
                     {{0, 100, 256}, {0, 300}}});
}

TEST(DeltaQuantTest, TwentySmallUpdatesIntoChannelAndTensorTargets) {
  RunTwentyVersions({"fp8_channel",
                     ParamQuant{1, quant::kWholeAxis, ""},
                     {{0, 128, 256}, {0, 300}},
                     {{0, 100, 256}, {0, 300}}});
  RunTwentyVersions({"fp8_tensor",
                     ParamQuant{quant::kWholeAxis, quant::kWholeAxis, ""},
                     {{0, 256}, {0, 300}},
                     {{0, 100, 256}, {0, 300}},
                     /*grow=*/false});
}

}  // namespace
}  // namespace wsync
