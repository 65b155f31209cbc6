// The executor runs a plan's quantization steps (executor/quant_work.h) on host memory: every
// process as a thread over the loopback transport, random shapes, blockings and TP/EP cuts on
// both sides (blocks cut by sources, ragged last blocks, zeros, values at and past 448), budgets
// that chunk and stage, both lane drivers, with and without verification, whole and per-process
// plans, rollout replicas sharing their sender's quantization. The rollouts' e4m3 bytes and scales
// equal the reference quantizer's applied to the whole bf16 tensor, bit for bit; a plan forced to
// quantize every block at the receiver gives the same bytes; every run's stats equal its schedule;
// a NaN fails naming the parameter; a CUDA process quantizing host memory and a missing
// quantization plan are refused on every process; named layouts sync. CUDA processes quantizing
// device memory: quant_device_executor_test.cc.

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/policy.h"
#include "planner/quant_plan.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/loopback_threads.h"
#include "tests/unit/executor_test_support.h"
#include "tests/unit/quant_loopback_run.h"
#include "tests/unit/quant_plan_support.h"

namespace wsync {
namespace {

using quant_plan_test::AxisCuts;
using quant_plan_test::Memory;
using ::testing::HasSubstr;

struct SyncOptions {
  int64_t budget = int64_t{1} << 20;
  VerifyMode verify = VerifyMode::kOff;
  bool lockstep = false;
  // Per global process, its own plan (PlanOptions::process); the whole plan when empty.
  const std::vector<Plan>* own = nullptr;
};

// One sync of every process as a thread over a fresh loopback fabric, with `quant` as the
// quantization steps of every process (or its own plan's); buffers in `memory`.
std::vector<absl::StatusOr<TransferStats>> RunSync(const Job& job, const Plan& plan,
                                                   const QuantPlan& quant, const SyncOptions& sync,
                                                   Memory& memory) {
  return test::RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
      job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> used, Group& group) {
        if (sync.lockstep)
          used = std::make_unique<test::executor::LockstepTransport>(std::move(used));
        LocalBuffers buffers;
        for (auto& [key, bytes] : memory) {
          if (key.first == p) buffers[key.second] = bytes.data();
        }
        const Plan& mine = sync.own != nullptr ? (*sync.own)[p] : plan;
        ExecuteOptions options;
        options.sync_id = 5;
        options.plan_digest = plan.digest;
        options.deadline = absl::Now() + absl::Seconds(60);
        options.verify = sync.verify;
        options.quant = sync.own != nullptr ? &mine.quant : &quant;
        return ExecuteTransfers(job, mine.segments, test::AllProcesses(job),
                                StagingBudget{static_cast<double>(sync.budget)}, p, buffers, *used,
                                group, options);
      });
}

// Every run succeeded and counted what its schedule says.
void ExpectRunsAsScheduled(const Job& job, const Plan& plan, const QuantPlan& quant,
                           const SyncOptions& sync,
                           const std::vector<absl::StatusOr<TransferStats>>& results) {
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    ASSERT_TRUE(results[p].ok()) << "process " << p << ": " << results[p].status();
    const Plan& mine = sync.own != nullptr ? (*sync.own)[p] : plan;
    absl::StatusOr<ProcessSchedule> schedule = ScheduleTransfers(
        job, mine.segments, sync.own != nullptr ? mine.quant : quant, test::AllProcesses(job),
        StagingBudget{static_cast<double>(sync.budget)}, p);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    SCOPED_TRACE(::testing::Message() << "process " << p);
    test::ExpectStatsMatchSchedule(*schedule, *results[p]);
    if (sync.verify != VerifyMode::kOff && schedule->received_bytes > 0) {
      EXPECT_GT(results[p]->verified_chunks, 0);
    }
  }
}

// The plan with every sender-side step made receiver-side: the receiver gathers the step's blocks
// from the same source piece into a new region of its arena and quantizes there.
QuantPlan ForceReceiverSide(const Job& job, const QuantPlan& plan) {
  QuantPlan forced;
  forced.gathers = plan.gathers;
  std::map<int32_t, int64_t> arena_end;  // Bytes per receiver.
  auto element_size = [&](int32_t param) {
    return DTypeSize(job.source().params[job.SourceParamOf(param)].dtype);
  };
  for (const QuantTransform& step : plan.transforms) {
    if (step.side != QuantSide::kReceiver) continue;
    int64_t& end = arena_end[step.to.process];
    end = std::max(end, (step.from.offset + Volume(step.blocks)) * element_size(step.param));
  }
  for (QuantTransform step : plan.transforms) {
    if (step.side == QuantSide::kSender) {
      int64_t& end = arena_end[step.to.process];
      end = (end + kQuantArenaAlignment - 1) / kQuantArenaAlignment * kQuantArenaAlignment;
      Segment gather;
      gather.param = step.param;
      gather.box = step.blocks;
      gather.from = step.from;
      gather.to = Endpoint{step.to.process, kQuantArenaBuffer, end / element_size(step.param),
                           RowMajorStrides(step.blocks.extent)};
      end += Volume(step.blocks) * element_size(step.param);
      step.side = QuantSide::kReceiver;
      step.from = gather.to;
      forced.gathers.push_back(std::move(gather));
    }
    forced.transforms.push_back(std::move(step));
  }
  return forced;
}

// The rollout buffers of `memory`.
std::map<std::pair<int32_t, uint64_t>, std::vector<uint8_t>> Rollouts(const Job& job,
                                                                      const Memory& memory) {
  std::map<std::pair<int32_t, uint64_t>, std::vector<uint8_t>> rollouts;
  for (const auto& [key, bytes] : memory) {
    if (!job.IsSource(key.first)) rollouts[key] = bytes;
  }
  return rollouts;
}

struct Counts {
  int sender = 0;
  int receiver = 0;
  int staged_budgets = 0;
};

// One random case: syncs with the plan, then with the plan forced to the receiver side.
void RunRandomCase(std::mt19937_64& rng, Counts& counts) {
  const quant_plan_test::Geometry g = quant_plan_test::RandomGeometry(rng, 4, 2);
  const ParamQuant& quant = g.quant;
  const bool experts = g.experts;
  const Dims& shape = g.shape;
  int64_t source_parts = 1, target_parts = 1;
  for (size_t a = 0; a < shape.size(); ++a) {
    source_parts *= static_cast<int64_t>(g.source_cuts[a].size()) - 1;
    target_parts *= static_cast<int64_t>(g.target_cuts[a].size()) - 1;
  }
  const int source_replicas = source_parts <= 8 ? 1 + static_cast<int>(rng() % 2) : 1;
  const int target_replicas = target_parts <= 8 ? 1 + static_cast<int>(rng() % 2) : 1;
  const int64_t pad = static_cast<int64_t>(rng() % 3);
  SyncOptions sync;
  const int64_t budgets[] = {int64_t{1} << 20, 8192, 2048};
  // A staged row of a 3-D piece is a whole expert matrix: small budgets for 2-D only.
  sync.budget = experts ? budgets[0] : budgets[rng() % 3];
  counts.staged_budgets += sync.budget < budgets[0];
  sync.verify = static_cast<VerifyMode>(rng() % 2);
  sync.lockstep = rng() % 2 == 0;
  SCOPED_TRACE(::testing::Message()
               << "shape " << DimsToString(shape) << " blocks " << quant.block_rows << "x"
               << quant.block_cols << " budget " << sync.budget << " lockstep " << sync.lockstep);
  absl::StatusOr<Job> job =
      Job::Create(quant_plan_test::QuantSource(shape, g.source_cuts, source_replicas, pad),
                  quant_plan_test::QuantTarget(shape, quant, g.target_cuts, target_replicas, pad));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const QuantTransform& step : plan->quant.transforms) {
    ++(step.side == QuantSide::kSender ? counts.sender : counts.receiver);
  }
  fp8_test::Tensor tensor =
      fp8_test::RandomTensor(rng, experts ? shape[0] : 1, shape[shape.size() - 2], shape.back());
  if (rng() % 10 == 0) std::fill(tensor.bits.begin(), tensor.bits.end(), 0);  // All blocks zero.

  std::vector<Plan> own;
  if (rng() % 3 == 0) {  // Every process with its own plan.
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      PlanOptions options;
      options.process = p;
      absl::StatusOr<Plan> mine = MakePlan(*job, *MakeFirstHolderPolicy(), options);
      ASSERT_TRUE(mine.ok()) << mine.status();
      own.push_back(*std::move(mine));
    }
    sync.own = &own;
  }
  Memory memory = quant_plan_test::AllocateMemory(*job, tensor);
  const auto results = RunSync(*job, *plan, plan->quant, sync, memory);
  ExpectRunsAsScheduled(*job, *plan, plan->quant, sync, results);
  if (::testing::Test::HasFatalFailure()) return;
  quant_plan_test::ExpectMatchesReference(*job, tensor, memory);

  sync.own = nullptr;
  const QuantPlan forced = ForceReceiverSide(*job, plan->quant);
  ASSERT_TRUE(ProveQuantExact(*job, forced).ok()) << ProveQuantExact(*job, forced);
  Memory forced_memory = quant_plan_test::AllocateMemory(*job, tensor);
  const auto forced_results = RunSync(*job, *plan, forced, sync, forced_memory);
  ExpectRunsAsScheduled(*job, *plan, forced, sync, forced_results);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_TRUE(Rollouts(*job, memory) == Rollouts(*job, forced_memory))
      << "sender- and receiver-side quantization differ";
}

TEST(QuantExecutorTest, RandomSyncsWriteTheReferenceQuantization) {
  std::mt19937_64 rng(2222);
  Counts counts;
  for (int i = 0; i < 60; ++i) {
    SCOPED_TRACE(i);
    RunRandomCase(rng, counts);
    if (HasFatalFailure()) return;
  }
  // Both sides and small budgets were exercised.
  EXPECT_GT(counts.sender, 30);
  EXPECT_GT(counts.receiver, 30);
  EXPECT_GT(counts.staged_budgets, 10);
}

// The fixed case (quant_plan_support.h): block column 0 is quantized by trainer 0, block column 2
// by trainer 1 (sender side), block column 1, cut by the trainers at 150, by each rollout.
using quant_plan_test::FixedCase;
using quant_plan_test::MakeFixedCase;

TEST(QuantExecutorTest, FixedCaseMovesAndQuantizesWhatThePlanCounts) {
  const FixedCase c = MakeFixedCase();
  std::mt19937_64 rng(3);
  const fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, 1, 256, 300);
  Memory memory = quant_plan_test::AllocateMemory(c.job, tensor);
  const auto results = RunSync(c.job, c.plan, c.plan.quant, SyncOptions{}, memory);
  ExpectRunsAsScheduled(c.job, c.plan, c.plan.quant, SyncOptions{}, results);
  if (HasFatalFailure()) return;
  quant_plan_test::ExpectMatchesReference(c.job, tensor, memory);
  // Block columns 0 ([0, 128), trainer 0) and 2 ([256, 300), trainer 1) go out as e4m3 with one
  // scale per block row of each rollout's whole-block box (rollout 2: block row 0; rollout 3:
  // both); block column 1, cut by the trainers at 150, goes out in bf16 over each rollout's
  // whole blocks.
  const QuantWireBytes wire = CountQuantWireBytes(c.job, c.plan.quant);
  EXPECT_EQ(wire.fp8, 256 * (128 + 44));
  EXPECT_EQ(wire.scales, 2 * 3 * 4);
  EXPECT_EQ(wire.gathered, (128 + 256) * 128 * 2);
  EXPECT_EQ(results[0]->sent_bytes + results[1]->sent_bytes, wire.total());
  EXPECT_EQ(results[2]->received_bytes + results[3]->received_bytes, wire.total());
  EXPECT_EQ(results[0]->quantized_elements, (128 + 256) * 128);
  EXPECT_EQ(results[1]->quantized_elements, (128 + 256) * 44);
  EXPECT_EQ(results[2]->quantized_elements, 128 * 128);
  EXPECT_EQ(results[3]->quantized_elements, 256 * 128);
}

// A NaN in a block its sender quantizes fails that sender naming the parameter; one in a block
// the receivers quantize fails those receivers naming it.
TEST(QuantExecutorTest, NaNIsRefusedNamingTheParameter) {
  const FixedCase c = MakeFixedCase();
  for (const int64_t col : {5, 140}) {
    SCOPED_TRACE(col);
    std::mt19937_64 rng(4);
    fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, 1, 256, 300);
    tensor.at(0, 7, col) = 0x7fc0;  // A bf16 NaN.
    Memory memory = quant_plan_test::AllocateMemory(c.job, tensor);
    const auto results = RunSync(c.job, c.plan, c.plan.quant, SyncOptions{}, memory);
    // Sender-side: trainer 0 (columns [0, 150)); receiver-side: both rollouts (2, 3).
    // Element (0, 7, col) of block column 0 (trainer 0) or 1 (the rollouts: columns [128, 256)).
    test::ExpectNaNRefused(results,
                           col < 128 ? std::vector<int32_t>{0} : std::vector<int32_t>{2, 3},
                           absl::StrCat("(0, 7, ", col % 128, ")"));
    if (col < 128) {  // The rollouts never got their e4m3 bytes: they fail too.
      EXPECT_FALSE(results[2].ok());
      EXPECT_FALSE(results[3].ok());
    }
  }
}

// A rollout with its e4m3 buffer in CUDA memory but its scales in host memory would quantize on
// its device into host memory: every process refuses before any byte moves (a run without the
// steps is refused in executor_refusals_test.cc).
TEST(QuantExecutorTest, CudaProcessQuantizingHostMemoryIsRefusedOnEveryProcess) {
  const FixedCase c = MakeFixedCase();
  Layout target = c.job.target();
  target.buffers[0].kind = MemoryKind::kCuda;
  const Job cuda = *Job::Create(c.job.source(), target);
  const Plan cuda_plan = *MakePlan(cuda, *MakeFirstHolderPolicy());
  const fp8_test::Tensor tensor{1, 256, 300, std::vector<uint16_t>(256 * 300, 0x3f80)};
  Memory memory = quant_plan_test::AllocateMemory(cuda, tensor);
  const auto results = RunSync(cuda, cuda_plan, cuda_plan.quant, SyncOptions{}, memory);
  for (int32_t p = 0; p < cuda.num_processes(); ++p) {
    ASSERT_FALSE(results[p].ok()) << p;
    EXPECT_EQ(results[p].status().code(), absl::StatusCode::kUnimplemented) << results[p].status();
    EXPECT_THAT(std::string(results[p].status().message()),
                HasSubstr("would quantize into host memory"));
  }
  for (const auto& [key, bytes] : memory) {
    if (!cuda.IsSource(key.first)) {
      EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0xff; }));
    }
  }
}

// The job of `model` from `source` to `target`, named layouts.
absl::StatusOr<Job> NamedJob(absl::string_view model_name, absl::string_view source,
                             absl::string_view target) {
  absl::StatusOr<ModelSpec> model = GetModel(model_name);
  if (!model.ok()) return model.status();
  absl::StatusOr<NamedJobLayouts> layouts = BuildNamedJobLayouts(*model, source, target);
  if (!layouts.ok()) return layouts.status();
  return Job::Create(layouts->source, layouts->target);
}

// A random logical tensor per source parameter of `job`.
std::vector<fp8_test::Tensor> RandomTensors(const Job& job, std::mt19937_64& rng) {
  std::vector<fp8_test::Tensor> tensors;
  for (const ParamInfo& param : job.source().params) {
    const Dims& shape = param.shape;
    const int64_t cols = shape.back();
    const int64_t rows = shape.size() >= 2 ? shape[shape.size() - 2] : 1;
    tensors.push_back(
        fp8_test::RandomTensor(rng, Volume(WholeBox(shape)) / (rows * cols), rows, cols));
  }
  return tensors;
}

// Two rollout replicas (dp=2) of one trainer's blocks: the trainer quantizes and stages each block
// once and both replicas land the reference's bytes.
TEST(QuantExecutorTest, RolloutReplicasShareTheSendersQuantization) {
  absl::StatusOr<Job> single = NamedJob("qwen2.5-tiny", "megatron", "vllm(quant=fp8_block)");
  absl::StatusOr<Job> replicated =
      NamedJob("qwen2.5-tiny", "megatron", "vllm(dp=2, quant=fp8_block)");
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  ASSERT_EQ(replicated->num_processes(), 3);
  const Plan single_plan = *MakePlan(*single, *MakeFirstHolderPolicy());
  const Plan plan = *MakePlan(*replicated, *MakeFirstHolderPolicy());
  const SyncOptions sync;
  const StagingBudget budget{static_cast<double>(sync.budget)};
  absl::StatusOr<ProcessSchedule> alone = ScheduleTransfers(
      *single, single_plan.segments, single_plan.quant, test::AllProcesses(*single), budget, 0);
  absl::StatusOr<ProcessSchedule> shared = ScheduleTransfers(
      *replicated, plan.segments, plan.quant, test::AllProcesses(*replicated), budget, 0);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE(shared.ok()) << shared.status();
  ASSERT_GT(alone->quantized_elements, 0);
  EXPECT_EQ(shared->quantized_elements, alone->quantized_elements);
  EXPECT_EQ(shared->quant_staging_bytes, alone->quant_staging_bytes);

  std::mt19937_64 rng(6);
  const std::vector<fp8_test::Tensor> tensors = RandomTensors(*replicated, rng);
  Memory memory = quant_plan_test::AllocateMemory(*replicated, tensors);
  const auto results = RunSync(*replicated, plan, plan.quant, sync, memory);
  ExpectRunsAsScheduled(*replicated, plan, plan.quant, sync, results);
  if (HasFatalFailure()) return;
  quant_plan_test::ExpectMatchesReference(*replicated, tensors, memory);
  EXPECT_EQ(results[0]->quantized_elements, alone->quantized_elements);
}

// Named layouts: every parameter of a small model, the FP8 ones quantized as the reference does
// and the others copied.
TEST(QuantExecutorTest, NamedModelsSyncIntoFp8Rollouts) {
  struct Case {
    const char* model;
    const char* source;
    const char* target;
  };
  const Case cases[] = {
      {"qwen2.5-tiny", "megatron(tp=2)", "vllm(tp=1, quant=fp8_block)"},
      {"qwen2.5-tiny", "megatron(tp=2, pp=2)", "vllm(tp=2, quant=fp8_channel)"},
      {"deepseek-v3-tiny", "megatron(tp=2, ep=2)", "vllm(tp=2, ep=2, quant=fp8_block)"},
      {"deepseek-v3-tiny", "megatron(tp=2)", "vllm(quant=fp8_tensor)"},
  };
  std::mt19937_64 rng(5);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.model << " " << c.source << " -> " << c.target);
    absl::StatusOr<Job> job = NamedJob(c.model, c.source, c.target);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(job->HasQuantizedParams());
    absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<fp8_test::Tensor> tensors = RandomTensors(*job, rng);
    Memory memory = quant_plan_test::AllocateMemory(*job, tensors);
    SyncOptions sync;
    sync.verify = VerifyMode::kHash;
    const auto results = RunSync(*job, *plan, plan->quant, sync, memory);
    ExpectRunsAsScheduled(*job, *plan, plan->quant, sync, results);
    if (HasFatalFailure()) return;
    quant_plan_test::ExpectMatchesReference(*job, tensors, memory);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace wsync
