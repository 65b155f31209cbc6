// The executor's quantization steps on CUDA processes (executor/quant_device.h): every process a
// thread over the loopback transport (host messages), the trainers' or the rollouts' buffers in
// CUDA memory, so the CUDA side quantizes with its device's FP8 kernels from or into device
// staging and arenas, packing to and unpacking from host messages. Built twice:
// - quant_device_executor_test (unit): the device is CudaDeviceMemory over the fake of CUDA
//   (tests/unit/fake_cuda_fabric.h), whose kernels are the host emulation of the CUDA kernels;
//   also with every buffer in CUDA memory over the fake's NCCL;
// - gpu_quant_executor_test (gpu, WSYNC_QUANT_DEVICE_REAL_CUDA): CudaDeviceMemory over the real
//   CUDA module's API on GPU 0, the real kernels.
// Random shapes, blockings and TP/EP cuts on both sides; the rollouts' e4m3 bytes and scales equal
// the reference quantizer's bit for bit; a NaN fails the quantizing process naming the parameter;
// a CUDA process quantizing host memory, or without kernels, is refused on every process.

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "device/cuda_device_memory.h"
#include "executor/execute.h"
#include "executor/memory_kinds.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/unit/quant_loopback_run.h"
#include "tests/unit/quant_plan_support.h"
#ifdef WSYNC_QUANT_DEVICE_REAL_CUDA
#include "tests/gpu/gpu_count.h"
#include "transport/nccl/nccl_api_real.h"
#else
#include "tests/unit/fake_cuda_fabric.h"
#include "tests/unit/nccl_executor_support.h"
#endif

namespace wsync {
namespace {

using quant_plan_test::Memory;
using ::testing::HasSubstr;

using DeviceFactory = std::function<absl::StatusOr<std::unique_ptr<DeviceMemory>>()>;

// The device of the build: the fake's (one fabric for the whole binary) or GPU 0's.
DeviceFactory Devices() {
#ifdef WSYNC_QUANT_DEVICE_REAL_CUDA
  return []() -> absl::StatusOr<std::unique_ptr<DeviceMemory>> {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<CudaDeviceMemory> memory,
                           CudaDeviceMemory::Create(MakeRealNcclApi(), 0));
    return std::unique_ptr<DeviceMemory>(std::move(memory));
  };
#else
  static test::FakeCudaFabric* fabric = new test::FakeCudaFabric();
  return []() -> absl::StatusOr<std::unique_ptr<DeviceMemory>> {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<CudaDeviceMemory> memory,
                           CudaDeviceMemory::Create(fabric->Api(), 0));
    return std::unique_ptr<DeviceMemory>(std::move(memory));
  };
#endif
}

void RequireDevice() {
#ifdef WSYNC_QUANT_DEVICE_REAL_CUDA
  ASSERT_GT(test::GpuCount(), 0) << "no NVIDIA device: this gpu-labelled test needs one";
#endif
}

// A DeviceMemory without FP8 kernels (a build without nvcc), forwarding everything else.
class NoKernelDevice final : public DeviceMemory {
 public:
  explicit NoKernelDevice(std::unique_ptr<DeviceMemory> inner) : inner_(std::move(inner)) {}
  MemoryKind kind() const override { return inner_->kind(); }
  absl::StatusOr<void*> Allocate(int64_t bytes) override { return inner_->Allocate(bytes); }
  void Free(void* memory) override { inner_->Free(memory); }
  absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) override {
    return inner_->CopyStridedAsync(dst, dst_strides, src, src_strides, shape, element_size);
  }
  absl::Status Synchronize(absl::Time deadline) override { return inner_->Synchronize(deadline); }

 private:
  std::unique_ptr<DeviceMemory> inner_;
};

enum class Placement { kTrainers, kRollouts };

Job Place(const Job& job, Placement placement) {
  Layout source = job.source(), target = job.target();
  for (BufferInfo& b : (placement == Placement::kTrainers ? source : target).buffers) {
    b.kind = MemoryKind::kCuda;
  }
  absl::StatusOr<Job> placed = Job::Create(source, target);
  EXPECT_TRUE(placed.ok()) << placed.status();
  return *std::move(placed);
}

struct SyncOptions {
  int64_t budget = int64_t{1} << 20;
  VerifyMode verify = VerifyMode::kOff;
  bool no_kernel = false;  // CUDA processes get a DeviceMemory without FP8 kernels.
  // A process that did not fail itself may wait this long for peers that failed (a sender whose
  // receivers gave up before its messages came), so failure tests use a shorter one.
  absl::Duration deadline = absl::Seconds(60);
};

// One process's run: its CUDA buffers copied into device memory of its own DeviceMemory and back.
absl::StatusOr<TransferStats> RunProcess(const Job& job, const Plan& plan, int32_t p,
                                         const SyncOptions& sync, Memory& memory,
                                         Transport& transport, Group& group) {
  const JobMemoryKinds kinds(job);
  std::unique_ptr<DeviceMemory> device;
  if (kinds.Process(p) == MemoryKind::kCuda) {
    WSYNC_ASSIGN_OR_RETURN(device, Devices()());
    if (sync.no_kernel) device = std::make_unique<NoKernelDevice>(std::move(device));
  }
  LocalBuffers buffers;
  std::vector<std::pair<void*, std::vector<uint8_t>*>> on_device;
  for (auto& [key, bytes] : memory) {
    if (key.first != p) continue;
    if (kinds.Buffer(p, key.second) == MemoryKind::kHost) {
      buffers[key.second] = bytes.data();
      continue;
    }
    const int64_t size = static_cast<int64_t>(bytes.size());
    WSYNC_ASSIGN_OR_RETURN(void* area, device->Allocate(size));
    on_device.emplace_back(area, &bytes);
    buffers[key.second] = area;
    WSYNC_RETURN_IF_ERROR(device->CopyStridedAsync(area, {1}, bytes.data(), {1}, {size}, 1));
  }
  const absl::Time deadline = absl::Now() + sync.deadline;
  if (device) {
    WSYNC_RETURN_IF_ERROR(device->Synchronize(deadline));
  }
  absl::StatusOr<TransferStats> result;
  {
    ArenaCache arenas;  // Frees its device arenas before `device` goes.
    ExecuteOptions options;
    options.sync_id = 9;
    options.plan_digest = plan.digest;
    options.deadline = deadline;
    options.verify = sync.verify;
    options.quant = &plan.quant;
    options.device = device.get();
    options.arenas = &arenas;
    result = ExecuteTransfers(job, plan.segments, test::AllProcesses(job),
                              StagingBudget{static_cast<double>(sync.budget)}, p, buffers,
                              transport, group, options);
  }
  for (auto& [area, bytes] : on_device) {
    const int64_t size = static_cast<int64_t>(bytes->size());
    WSYNC_RETURN_IF_ERROR(device->CopyStridedAsync(bytes->data(), {1}, area, {1}, {size}, 1));
  }
  if (device) {
    WSYNC_RETURN_IF_ERROR(device->Synchronize(deadline));
  }
  for (auto& [area, bytes] : on_device) device->Free(area);
  return result;
}

// Every process as a thread over a fresh loopback fabric.
std::vector<absl::StatusOr<TransferStats>> RunSync(const Job& job, const Plan& plan,
                                                   const SyncOptions& sync, Memory& memory) {
  return test::RunOnLoopback(job, [&](int32_t p, Transport& transport, Group& group) {
    return RunProcess(job, plan, p, sync, memory, transport, group);
  });
}

void ExpectRunsAsScheduled(const Job& job, const Plan& plan, const SyncOptions& sync,
                           const std::vector<absl::StatusOr<TransferStats>>& results) {
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    ASSERT_TRUE(results[p].ok()) << "process " << p << ": " << results[p].status();
    absl::StatusOr<ProcessSchedule> schedule =
        ScheduleTransfers(job, plan.segments, plan.quant, test::AllProcesses(job),
                          StagingBudget{static_cast<double>(sync.budget)}, p);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    SCOPED_TRACE(::testing::Message() << "process " << p);
    test::ExpectStatsMatchSchedule(*schedule, *results[p]);
  }
}

TEST(QuantDeviceExecutorTest, RandomSyncsQuantizeOnTheDeviceAsTheReference) {
  RequireDevice();
  if (HasFatalFailure()) return;
  std::mt19937_64 rng(2323);
  int device_sender = 0, device_receiver = 0;
  for (int i = 0; i < 24; ++i) {
    SCOPED_TRACE(i);
    const quant_plan_test::Geometry g = quant_plan_test::RandomGeometry(rng, 3, 2);
    const Placement placement = i % 2 == 0 ? Placement::kTrainers : Placement::kRollouts;
    absl::StatusOr<Job> host = Job::Create(
        quant_plan_test::QuantSource(g.shape, g.source_cuts, 1, static_cast<int64_t>(rng() % 2)),
        quant_plan_test::QuantTarget(g.shape, g.quant, g.target_cuts, 1, 0));
    ASSERT_TRUE(host.ok()) << host.status();
    const Job job = Place(*host, placement);
    absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy());
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const QuantTransform& step : plan->quant.transforms) {
      const bool sender = step.side == QuantSide::kSender;
      device_sender += sender && placement == Placement::kTrainers;
      device_receiver += !sender && placement == Placement::kRollouts;
    }
    const Dims& shape = g.shape;
    fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, g.experts ? shape[0] : 1,
                                                     shape[shape.size() - 2], shape.back());
    if (i % 7 == 3) std::fill(tensor.bits.begin(), tensor.bits.end(), 0);
    SyncOptions sync;
    sync.verify = static_cast<VerifyMode>(i % 3 == 0 ? 1 : 0);
    sync.budget = g.experts || i % 4 != 1 ? int64_t{1} << 20 : 8192;
    Memory memory = quant_plan_test::AllocateMemory(job, tensor);
    const auto results = RunSync(job, *plan, sync, memory);
    ExpectRunsAsScheduled(job, *plan, sync, results);
    if (HasFatalFailure()) return;
    quant_plan_test::ExpectMatchesReference(job, tensor, memory);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(device_sender, 5);
  EXPECT_GT(device_receiver, 5);
}

// Many quantized parameters per CUDA trainer: the trainers quantize each step on the device into
// its place in their lanes' staging rings (executor/quant_work.h) when its first message is due,
// under a small budget reusing the bytes of steps already sent, and the rollouts get the
// reference quantization; the run allocates what the schedule says and writes no further.
TEST(QuantDeviceExecutorTest, NamedModelReusesTheDeviceStagingAsTheReference) {
  RequireDevice();
  if (HasFatalFailure()) return;
  absl::StatusOr<quant_plan_test::NamedJob> named = quant_plan_test::MakeNamedJob(
      {"qwen2.5-tiny", "megatron(tp=2)", "vllm(tp=1, quant=fp8_block)"});
  ASSERT_TRUE(named.ok()) << named.status();
  const Job job = Place(named->job, Placement::kTrainers);
  absl::StatusOr<Plan> plan = MakePlan(job, *MakeFirstHolderPolicy());
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::mt19937_64 rng(8);
  const std::vector<fp8_test::Tensor> tensors = quant_plan_test::RandomSourceTensors(job, rng);
  for (const int64_t budget : {int64_t{1} << 20, int64_t{8} << 10}) {
    SCOPED_TRACE(budget);
    SyncOptions sync;
    sync.budget = budget;
    sync.verify = VerifyMode::kHash;
    Memory memory = quant_plan_test::AllocateMemory(job, tensors);
    const auto results = RunSync(job, *plan, sync, memory);
    ExpectRunsAsScheduled(job, *plan, sync, results);
    if (HasFatalFailure()) return;
    quant_plan_test::ExpectMatchesReference(job, tensors, memory);
    if (HasFatalFailure()) return;
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      if (!job.IsSource(p)) continue;
      EXPECT_GT(results[p]->quant_staging_written_bytes, 0) << p;
      const ProcessSchedule schedule =
          *ScheduleTransfers(job, plan->segments, plan->quant, test::AllProcesses(job),
                             StagingBudget{static_cast<double>(budget)}, p);
      if (budget < (int64_t{1} << 20)) {  // Many messages: steps sent before are reused.
        EXPECT_LT(schedule.quant_staging_bytes, schedule.quant_staging_whole_bytes) << p;
      }
    }
  }
}

// A NaN in a block a CUDA trainer quantizes fails it when its step is due (its rollouts then fail
// too); one in a block the CUDA rollouts quantize fails those, naming the parameter.
TEST(QuantDeviceExecutorTest, NaNOnTheDeviceIsRefusedNamingTheParameter) {
  RequireDevice();
  if (HasFatalFailure()) return;
  const quant_plan_test::FixedCase c = quant_plan_test::MakeFixedCase();
  for (const int64_t col : {5, 140}) {
    SCOPED_TRACE(col);
    const Job job = Place(c.job, col < 128 ? Placement::kTrainers : Placement::kRollouts);
    const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
    std::mt19937_64 rng(4);
    fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, 1, 256, 300);
    tensor.at(0, 7, col) = 0x7fc0;
    Memory memory = quant_plan_test::AllocateMemory(job, tensor);
    SyncOptions sync;
    sync.deadline = absl::Seconds(10);
    const auto results = RunSync(job, plan, sync, memory);
    // Element (0, 7, col) of block column 0 (trainer 0) or 1 (the rollouts: columns [128, 256)).
    test::ExpectNaNRefused(results,
                           col < 128 ? std::vector<int32_t>{0} : std::vector<int32_t>{2, 3},
                           absl::StrCat("(0, 7, ", col % 128, ")"));
    EXPECT_FALSE(results[2].ok());
    EXPECT_FALSE(results[3].ok());
  }
}

// Refused on every process before any byte moves: a CUDA rollout whose scales are host memory
// (the kernels write device memory only), and CUDA processes whose device has no FP8 kernel.
TEST(QuantDeviceExecutorTest, UnrunnableDeviceStepsAreRefusedOnEveryProcess) {
  RequireDevice();
  if (HasFatalFailure()) return;
  const quant_plan_test::FixedCase c = quant_plan_test::MakeFixedCase();
  Layout target = c.job.target();
  target.buffers[0].kind = MemoryKind::kCuda;  // Rollout 2's e4m3 buffer; its scales stay host.
  const Job mixed = *Job::Create(c.job.source(), target);
  struct Case {
    const Job* job;
    bool no_kernel;
    const char* says;
  };
  const Job rollouts = Place(c.job, Placement::kRollouts);
  for (const Case& k : {Case{&mixed, false, "would quantize into host memory"},
                        Case{&rollouts, true, "has no FP8 kernel"}}) {
    SCOPED_TRACE(k.says);
    const Plan plan = *MakePlan(*k.job, *MakeFirstHolderPolicy());
    const fp8_test::Tensor tensor{1, 256, 300, std::vector<uint16_t>(256 * 300, 0x3f80)};
    Memory memory = quant_plan_test::AllocateMemory(*k.job, tensor);
    SyncOptions sync;
    sync.no_kernel = k.no_kernel;
    sync.deadline = absl::Seconds(10);
    const auto results = RunSync(*k.job, plan, sync, memory);
    for (int32_t p = 0; p < k.job->num_processes(); ++p) {
      ASSERT_FALSE(results[p].ok()) << p;
      // The trainers have no device: with kernels missing they learn the rollouts' refusal.
      EXPECT_EQ(results[p].status().code(), k.no_kernel && k.job->IsSource(p)
                                                ? absl::StatusCode::kFailedPrecondition
                                                : absl::StatusCode::kUnimplemented)
          << results[p].status();
      EXPECT_THAT(std::string(results[p].status().message()), HasSubstr(k.says));
    }
    for (const auto& [key, bytes] : memory) {
      if (k.job->IsSource(key.first)) continue;
      EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0xff; }));
    }
  }
}

#ifndef WSYNC_QUANT_DEVICE_REAL_CUDA
// Every buffer in CUDA memory: CUDA pairs over the fake's NCCL, the trainers' device staging sent
// directly, the rollouts' gathers landing in device arenas.
TEST(QuantDeviceExecutorTest, AllCudaJobOverNcclQuantizesAsTheReference) {
  std::mt19937_64 rng(77);
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    const quant_plan_test::Geometry g = quant_plan_test::RandomGeometry(rng, 3, 2);
    Layout source = quant_plan_test::QuantSource(g.shape, g.source_cuts, 1, 0);
    Layout target = quant_plan_test::QuantTarget(g.shape, g.quant, g.target_cuts, 1, 0);
    for (Layout* layout : {&source, &target}) {
      for (BufferInfo& b : layout->buffers) b.kind = MemoryKind::kCuda;
    }
    const Job job = *Job::Create(source, target);
    const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
    const Dims& shape = g.shape;
    const fp8_test::Tensor tensor = fp8_test::RandomTensor(rng, g.experts ? shape[0] : 1,
                                                           shape[shape.size() - 2], shape.back());
    Memory memory = quant_plan_test::AllocateMemory(job, tensor);
    test::HostBuffers sources(job.source(), 0), targets(job.target(), 0);
    auto exchange = [&](bool into_buffers) {
      for (const bool is_source : {true, false}) {
        const Layout& layout = is_source ? job.source() : job.target();
        for (const BufferInfo& b : layout.buffers) {
          const int32_t global = is_source ? job.SourceId(b.process) : job.TargetId(b.process);
          std::vector<uint8_t>& bytes = memory.at({global, b.id});
          unsigned char* data = (is_source ? sources : targets).data({b.process, b.id});
          if (into_buffers) {
            std::copy(bytes.begin(), bytes.end(), data);
          } else {
            std::copy(data, data + bytes.size(), bytes.begin());
          }
        }
      }
    };
    exchange(true);
    test::FakeCudaFabric cuda;
    test::nccl_executor::RunHooks hooks;
    hooks.quant = &plan.quant;
    hooks.verify = i % 2 == 0;
    const test::nccl_executor::CudaRun run = test::nccl_executor::RunCudaBatch(
        job, plan.segments, StagingBudget{1 << 20}, sources, targets, cuda, hooks);
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
    }
    EXPECT_GT(cuda.kernel_launches(), 0);
    exchange(false);
    quant_plan_test::ExpectMatchesReference(job, tensor, memory);
    if (HasFatalFailure()) return;
  }
}
#endif

}  // namespace
}  // namespace wsync
