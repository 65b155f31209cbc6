// The executor runs a plan's quantization steps (executor/quant_work.h) on host memory: every
// process as a thread over the loopback transport, random shapes, blockings and TP/EP cuts on
// both sides (blocks cut by sources, ragged last blocks, zeros, values at and past 448), budgets
// that chunk and stage, both lane drivers, with and without verification, whole and per-process
// plans. The rollouts' e4m3 bytes and scales equal the reference quantizer's applied to the
// whole bf16 tensor, bit for bit; a plan forced to quantize every block at the receiver gives the
// same bytes; every run's stats equal its schedule; a NaN fails naming the parameter; a CUDA
// process quantizing host memory and a missing quantization plan are refused on every process;
// named layouts sync; the quantization staging stays within the bound executor/quant_work.h
// states at every budget (far below every step at once for many steps), and a NaN in a step
// reached mid-run fails every process. CUDA processes quantizing device memory:
// quant_device_executor_test.cc.

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/policy.h"
#include "planner/quant_plan.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/loopback_threads.h"
#include "tests/testing/property_scale.h"
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
  bool scales_first = false;  // Scale parameters precede their weights (ScalesFirst).
  // When set, the rollouts post their first receive from this process only once its run
  // returned and its transport was destroyed.
  std::optional<int32_t> gone_before_receives;
  absl::Duration deadline = absl::Seconds(60);
};

// One sync of every process as a thread over a fresh loopback fabric, with `quant` as the
// quantization steps of every process (or its own plan's); buffers in `memory`.
std::vector<absl::StatusOr<TransferStats>> RunSync(const Job& job, const Plan& plan,
                                                   const QuantPlan& quant, const SyncOptions& sync,
                                                   Memory& memory) {
  absl::Notification gone;
  return test::RunOnLoopbackThreads<absl::StatusOr<TransferStats>>(
      job.num_processes(), [&](int32_t p, std::unique_ptr<Transport> used, Group& group) {
        if (sync.lockstep)
          used = std::make_unique<test::executor::LockstepTransport>(std::move(used));
        if (sync.gone_before_receives.has_value() && !job.IsSource(p)) {
          used = std::make_unique<test::executor::ReceiveAfterPeerGoneTransport>(
              std::move(used), *sync.gone_before_receives, gone);
        }
        LocalBuffers buffers;
        for (auto& [key, bytes] : memory) {
          if (key.first == p) buffers[key.second] = bytes.data();
        }
        const Plan& mine = sync.own != nullptr ? (*sync.own)[p] : plan;
        ExecuteOptions options;
        options.sync_id = 5;
        options.plan_digest = plan.digest;
        options.deadline = absl::Now() + sync.deadline;
        options.verify = sync.verify;
        options.quant = sync.own != nullptr ? &mine.quant : &quant;
        absl::StatusOr<TransferStats> result = ExecuteTransfers(
            job, mine.segments, test::AllProcesses(job),
            StagingBudget{static_cast<double>(sync.budget)}, p, buffers, *used, group, options);
        if (sync.gone_before_receives == p) {
          used.reset();
          gone.Notify();
        }
        return result;
      });
}

// The bound executor/quant_work.h states on the quantization staging of sender `p` running
// `quant` under `budget`, computed from the plan alone: the resident scales, the transient of the
// steps it sends itself, and per receiver min(all its steps, 3 x the largest + W x the e4m3 bytes
// of two messages), each region 64-byte aligned; with `scales_first` (scales may go out before
// their e4m3 bytes: a scale parameter named before its weight) also the transient and the
// scratch of scales computed twice.
int64_t StagingBound(const QuantPlan& quant, int64_t budget, int32_t p, bool scales_first) {
  auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  struct Receiver {
    int64_t all = 0, largest = 0, row = 0, steps = 0;
    double widen = 1;  // The most a step's blocks exceed its box.
  };
  std::map<int32_t, Receiver> receivers;
  int64_t bound = 0, transient = 0;
  for (const QuantTransform& step : quant.transforms) {
    if (step.side != QuantSide::kSender || step.from.process != p) continue;
    bound += aligned(Volume(step.scale_box) * 4);
    const int64_t blocks = aligned(Volume(step.blocks));
    if (scales_first) {
      transient = std::max(transient, blocks);
      bound += aligned(Volume(step.scale_box) * 4);  // At most the scratch.
    }
    if (step.to.process == p) {
      transient = std::max(transient, blocks);
      continue;
    }
    Receiver& r = receivers[step.to.process];
    r.all += blocks;
    r.largest = std::max(r.largest, blocks);
    ++r.steps;
    r.widen = std::max(r.widen, static_cast<double>(Volume(step.blocks)) / Volume(step.box));
    size_t axis = 0;  // Chunks are rows along the outermost axis of extent > 1.
    while (axis + 1 < step.box.extent.size() && step.box.extent[axis] == 1) ++axis;
    r.row = std::max(r.row, Volume(step.box) / step.box.extent[axis]);
  }
  for (const auto& [q, r] : receivers) {
    const int64_t message = std::max(budget / 2, r.row);  // The e4m3 bytes of one message.
    bound += std::min<int64_t>(
        r.all, 3 * r.largest + static_cast<int64_t>(r.widen * 2 * message) + 64 * r.steps);
  }
  return bound + transient;
}

// Every run succeeded and counted what its schedule says, within the staging bound.
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
    EXPECT_LE(schedule->quant_staging_bytes, StagingBound(sync.own != nullptr ? mine.quant : quant,
                                                          sync.budget, p, sync.scales_first));
    if (!sync.scales_first) {
      EXPECT_LE(schedule->quant_staging_bytes, schedule->quant_staging_whole_bytes + 64);
    }
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
  const int64_t cases = test::ScaledCases(60, 20);
  for (int64_t i = 0; i < cases; ++i) {
    SCOPED_TRACE(i);
    RunRandomCase(rng, counts);
    if (HasFatalFailure()) return;
  }
  // Both sides and small budgets were exercised.
  EXPECT_GT(counts.sender, cases / 2);
  EXPECT_GT(counts.receiver, cases / 2);
  EXPECT_GT(counts.staged_budgets, cases / 6);
}

// `target` (QuantTarget's: "w" with scales "w_scale") with the scales renamed "a_scale":
// parameters are ordered by name, so each lane then carries a step's scales before its e4m3 bytes.
Layout ScalesFirst(Layout target) {
  for (ParamInfo& param : target.params) {
    if (param.name == "w_scale") param.name = "a_scale";
    if (param.quant.scale_param == "w_scale") param.quant.scale_param = "a_scale";
  }
  return target;
}

// Scales that go out before their e4m3 bytes: the sender computes them when they are first sent
// (the e4m3 output dropped into the transient) and again, into a scratch, when the e4m3 bytes
// are due; the rollouts get the reference quantization and the staging stays within the bound.
TEST(QuantExecutorTest, ScalesSentBeforeTheirBlocksAreTheReferenceScales) {
  std::mt19937_64 rng(2424);
  struct Case {
    Dims shape;
    AxisCuts source_cuts, target_cuts;
  };
  // Steps of more than 64 KiB of e4m3 bytes travel alone, after their scales.
  const Case cases[] = {
      {{512, 384}, {{0, 512}, {0, 256, 384}}, {{0, 256, 512}, {0, 384}}},
      {{1024, 256}, {{0, 1024}, {0, 256}}, {{0, 256, 512, 768, 1024}, {0, 256}}},
      {{2, 512, 256}, {{0, 2}, {0, 512}, {0, 256}}, {{0, 1, 2}, {0, 512}, {0, 256}}},
  };
  for (const Case& c : cases) {
    for (const bool lockstep : {false, true}) {
      SCOPED_TRACE(::testing::Message() << DimsToString(c.shape) << " lockstep " << lockstep);
      SyncOptions sync;
      sync.scales_first = true;
      sync.lockstep = lockstep;
      sync.verify = static_cast<VerifyMode>(lockstep);
      absl::StatusOr<Job> job =
          Job::Create(quant_plan_test::QuantSource(c.shape, c.source_cuts, 1, 0),
                      ScalesFirst(quant_plan_test::QuantTarget(c.shape, ParamQuant{128, 128, ""},
                                                               c.target_cuts, 1, 0)));
      ASSERT_TRUE(job.ok()) << job.status();
      absl::StatusOr<Plan> plan = MakePlan(*job, *MakeFirstHolderPolicy());
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t rank = static_cast<int64_t>(c.shape.size());
      const fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, rank == 3 ? c.shape[0] : 1,
                                                             c.shape[rank - 2], c.shape[rank - 1]);
      Memory memory = quant_plan_test::AllocateMemory(*job, tensor);
      const auto results = RunSync(*job, *plan, plan->quant, sync, memory);
      ExpectRunsAsScheduled(*job, *plan, plan->quant, sync, results);
      if (HasFatalFailure()) return;
      quant_plan_test::ExpectMatchesReference(*job, tensor, memory);
      if (HasFatalFailure()) return;
    }
  }
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

// A trainer that fails on a NaN before its first message tells its rollouts, also when they post
// their receives only after its run returned and its transport is gone (its notice is a small
// message, eager over UCX and over the threads' fabric): they fail on the notice, naming the
// trainer, long before their deadline.
TEST(QuantExecutorTest, ANaNRefusalReachesRolloutsThatPostTheirReceivesLate) {
  const FixedCase c = MakeFixedCase();
  std::mt19937_64 rng(4);
  fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, 1, 256, 300);
  tensor.at(0, 7, 5) = 0x7fc0;  // A bf16 NaN in trainer 0's columns.
  Memory memory = quant_plan_test::AllocateMemory(c.job, tensor);
  SyncOptions late;
  late.gone_before_receives = 0;
  late.deadline = absl::Seconds(20);
  const absl::Time start = absl::Now();
  const auto results = RunSync(c.job, c.plan, c.plan.quant, late, memory);
  test::ExpectNaNRefused(results, {0}, "(0, 7, 5)");
  for (const int32_t rollout : {2, 3}) {
    ASSERT_FALSE(results[rollout].ok()) << rollout;
    EXPECT_NE(results[rollout].status().code(), absl::StatusCode::kDeadlineExceeded)
        << results[rollout].status();
    EXPECT_THAT(std::string(results[rollout].status().message()), HasSubstr("process 0"));
  }
  EXPECT_LT(absl::Now() - start, late.deadline);
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

// A job of named layouts with random bf16 source tensors and its plan.
struct NamedCase {
  Job job;
  Plan plan;
  std::vector<fp8_test::Tensor> tensors;  // Per source parameter.
};

NamedCase MakeNamedCase(const quant_plan_test::NamedSpec& spec, std::mt19937_64& rng) {
  absl::StatusOr<quant_plan_test::NamedJob> named = quant_plan_test::MakeNamedJob(spec);
  EXPECT_TRUE(named.ok()) << named.status();
  EXPECT_TRUE(named->job.HasQuantizedParams());
  std::vector<fp8_test::Tensor> tensors = quant_plan_test::RandomSourceTensors(named->job, rng);
  return NamedCase{std::move(named->job), std::move(named->plan), std::move(tensors)};
}

// Named layouts: every parameter of a small model, the FP8 ones quantized as the reference does
// and the others copied.
TEST(QuantExecutorTest, NamedModelsSyncIntoFp8Rollouts) {
  using Case = quant_plan_test::NamedSpec;
  const Case cases[] = {
      {"qwen2.5-tiny", "megatron(tp=2)", "vllm(tp=1, quant=fp8_block)"},
      {"qwen2.5-tiny", "megatron(tp=2, pp=2)", "vllm(tp=2, quant=fp8_channel)"},
      {"deepseek-v3-tiny", "megatron(tp=2, ep=2)", "vllm(tp=2, ep=2, quant=fp8_block)"},
      {"deepseek-v3-tiny", "megatron(tp=2)", "vllm(quant=fp8_tensor)"},
  };
  std::mt19937_64 rng(5);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.model << " " << c.source << " -> " << c.target);
    NamedCase n = MakeNamedCase(c, rng);
    if (HasFailure()) return;
    Memory memory = quant_plan_test::AllocateMemory(n.job, n.tensors);
    SyncOptions sync;
    sync.verify = VerifyMode::kHash;
    const auto results = RunSync(n.job, n.plan, n.plan.quant, sync, memory);
    ExpectRunsAsScheduled(n.job, n.plan, n.plan.quant, sync, results);
    if (HasFatalFailure()) return;
    quant_plan_test::ExpectMatchesReference(n.job, n.tensors, memory);
    if (HasFatalFailure()) return;
  }
}

// A trainer of a named layout sends many quantized parameters to each rollout: under small
// budgets its staging holds a few steps at a time (ExpectRunsAsScheduled checks the stated bound
// and that the run allocated what the schedule says and wrote no further), far below every step
// at once, and the rollouts still get the reference quantization, with either lane driver.
TEST(QuantExecutorTest, StagingOfManyStepsStaysWithinTheBudgetBound) {
  std::mt19937_64 rng(6);
  NamedCase n =
      MakeNamedCase({"qwen2.5-tiny", "megatron(tp=2)", "vllm(tp=1, quant=fp8_block)"}, rng);
  if (HasFailure()) return;
  for (const int64_t budget : {int64_t{64} << 20, int64_t{64} << 10, int64_t{8} << 10}) {
    for (const bool lockstep : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "budget " << budget << " lockstep " << lockstep);
      SyncOptions sync;
      sync.budget = budget;
      sync.lockstep = lockstep;
      sync.verify = lockstep ? VerifyMode::kHash : VerifyMode::kOff;
      Memory memory = quant_plan_test::AllocateMemory(n.job, n.tensors);
      const auto results = RunSync(n.job, n.plan, n.plan.quant, sync, memory);
      ExpectRunsAsScheduled(n.job, n.plan, n.plan.quant, sync, results);
      if (HasFatalFailure()) return;
      quant_plan_test::ExpectMatchesReference(n.job, n.tensors, memory);
      if (HasFatalFailure()) return;
      for (int32_t p = 0; p < n.job.num_processes(); ++p) {
        if (n.job.IsSource(p)) {
          EXPECT_GT(results[p]->quant_staging_written_bytes, 0) << p;
        }
      }
    }
  }
}

// A trainer of a real model sends hundreds of quantized parameters: its staging is laid out for a
// few at a time, far below all of them at once (what it took before), and within the bound.
TEST(QuantExecutorTest, StagingOfARealModelIsFarBelowEveryStepAtOnce) {
  using Case = quant_plan_test::NamedSpec;
  const Case cases[] = {
      {"qwen2.5-0.5b", "megatron(tp=1)", "vllm(tp=1, quant=fp8_block)"},
      {"qwen2.5-0.5b", "megatron(tp=2)", "vllm(dp=4, quant=fp8_block)"},
      {"llama-3-8b", "megatron(tp=4, pp=2)", "vllm(tp=2, quant=fp8_channel)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<quant_plan_test::NamedJob> named = quant_plan_test::MakeNamedJob(c);
    ASSERT_TRUE(named.ok()) << named.status();
    const Job* job = &named->job;
    const Plan* plan = &named->plan;
    for (const int64_t budget : {int64_t{64} << 20, int64_t{1} << 20, int64_t{64} << 10}) {
      SCOPED_TRACE(::testing::Message()
                   << c.model << " " << c.source << " -> " << c.target << " budget " << budget);
      for (int32_t p = 0; p < job->num_processes(); ++p) {
        if (!job->IsSource(p)) continue;
        absl::StatusOr<ProcessSchedule> schedule =
            ScheduleTransfers(*job, plan->segments, plan->quant, test::AllProcesses(*job),
                              StagingBudget{static_cast<double>(budget)}, p);
        ASSERT_TRUE(schedule.ok()) << schedule.status();
        EXPECT_LE(schedule->quant_staging_bytes, StagingBound(plan->quant, budget, p, false)) << p;
        EXPECT_LE(schedule->quant_staging_bytes * 8, schedule->quant_staging_whole_bytes) << p;
      }
    }
  }
}

// A NaN in the last quantized parameter a trainer sends, under a small budget: the trainer fails
// naming the parameter when it reaches that step, after earlier messages landed (the rollouts'
// buffers are partly written), and every other process fails too.
TEST(QuantExecutorTest, NaNInALaterStepFailsEveryProcessMidRun) {
  std::mt19937_64 rng(7);
  NamedCase n =
      MakeNamedCase({"qwen2.5-tiny", "megatron(tp=1)", "vllm(dp=2, quant=fp8_block)"}, rng);
  if (HasFailure()) return;
  const QuantTransform* last = nullptr;  // The sender-side step of the highest parameter.
  for (const QuantTransform& step : n.plan.quant.transforms) {
    if (step.side == QuantSide::kSender && (last == nullptr || step.param > last->param)) {
      last = &step;
    }
  }
  ASSERT_NE(last, nullptr);
  const int32_t source_param = n.job.SourceParamOf(last->param);
  const Dims& origin = last->blocks.origin;
  fp8_test::Tensor& tensor = n.tensors[source_param];
  const size_t rank = origin.size();
  tensor.at(rank == 3 ? origin[0] : 0, origin[rank - 2], origin[rank - 1]) = 0x7fc0;  // bf16 NaN.
  const std::string name = n.job.target().params[last->param].name;
  for (const bool lockstep : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "lockstep " << lockstep);
    SyncOptions sync;
    sync.budget = int64_t{8} << 10;
    sync.lockstep = lockstep;
    Memory memory = quant_plan_test::AllocateMemory(n.job, n.tensors);
    const auto results = RunSync(n.job, n.plan, n.plan.quant, sync, memory);
    for (int32_t p = 0; p < n.job.num_processes(); ++p) {
      ASSERT_FALSE(results[p].ok()) << p;
    }
    const absl::Status& failed = results[last->from.process].status();
    EXPECT_EQ(failed.code(), absl::StatusCode::kInvalidArgument) << failed;
    EXPECT_THAT(std::string(failed.message()), HasSubstr("parameter " + name));
    EXPECT_THAT(std::string(failed.message()), HasSubstr("cannot quantize NaN"));
    int64_t landed = 0;  // Rollout bytes written before the failure.
    for (const auto& [key, bytes] : Rollouts(n.job, memory)) {
      landed += std::count_if(bytes.begin(), bytes.end(), [](uint8_t b) { return b != 0xff; });
    }
    EXPECT_GT(landed, 0);
  }
}

}  // namespace
}  // namespace wsync
