// The executor over CudaIpcTransport, end to end on FakeCudaFabric: random layouts whose buffers
// are all CUDA memory (fake cudaMalloc allocations in memfds, so every message is a real pull
// through an IPC mapping at another address), arenas from CudaDeviceMemory, a loopback
// messenger; every process a thread; every other seed verifies its chunks. Targets must hold
// exactly what the reference writes and each process's stats must match its schedule; a process
// aborted before its run ends every run promptly.

#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "device/cuda_device_memory.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "tests/unit/fake_cuda_fabric.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::BufferKey;
using test::FakeCudaFabric;
using test::HostBuffers;

// Device copies of every buffer of one layout: allocated and filled from `host` at construction,
// copied back into `host` by CopyBack.
class DeviceMirror {
 public:
  DeviceMirror(NcclApi& api, HostBuffers& host) : api_(api), host_(host) {
    for (const BufferKey& key : host.keys()) {
      const int64_t bytes = std::max<int64_t>(host.bytes(key), 0);
      absl::StatusOr<void*> memory = api.Malloc(static_cast<size_t>(bytes));
      EXPECT_TRUE(memory.ok()) << memory.status();
      std::memcpy(*memory, host.data(key), bytes);  // The fake's device memory is host memory.
      device_[key] = static_cast<unsigned char*>(*memory);
    }
  }
  ~DeviceMirror() {
    for (const auto& [key, memory] : device_) EXPECT_TRUE(api_.Free(memory).ok());
  }
  unsigned char* data(BufferKey key) { return device_.at(key); }
  void CopyBack() {
    for (const auto& [key, memory] : device_) {
      std::memcpy(host_.data(key), memory, std::max<int64_t>(host_.bytes(key), 0));
    }
  }

 private:
  NcclApi& api_;
  HostBuffers& host_;
  std::map<BufferKey, unsigned char*> device_;
};

// One seed's job with every buffer in CUDA memory, its plan and schedules; null when a staged row
// is larger than the budget (refused as on hosts).
struct IpcCase {
  Job job;
  Plan plan;
  StagingBudget budget;
  std::vector<ProcessSchedule> schedules;
};

absl::StatusOr<std::unique_ptr<IpcCase>> MakeCase(uint64_t seed) {
  const int64_t kBudgets[] = {256, 4096, int64_t{1} << 20};
  std::mt19937_64 rng(seed);
  test::LayoutPair pair = test::RandomLayoutPair(rng);
  for (Layout* layout : {&pair.source, &pair.target}) {
    for (BufferInfo& buffer : layout->buffers) buffer.kind = MemoryKind::kCuda;
  }
  absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
  if (!job.ok()) return job.status();
  test::RandomAnswersPolicy policy(seed);
  absl::StatusOr<Plan> plan = MakePlan(*job, policy);
  if (!plan.ok()) return plan.status();
  const StagingBudget budget{static_cast<double>(kBudgets[seed % 3])};
  absl::StatusOr<std::vector<ProcessSchedule>> schedules =
      ScheduleTransfers(*job, plan->segments, test::AllProcesses(*job), budget);
  if (!schedules.ok()) return nullptr;
  return std::make_unique<IpcCase>(
      IpcCase{*std::move(job), *std::move(plan), budget, *std::move(schedules)});
}

struct IpcRun {
  std::vector<absl::StatusOr<TransferStats>> results;
  std::vector<absl::Duration> elapsed;
};

// Runs every process of `c` as a thread over CudaIpcTransport (loopback messenger) with its
// buffers in device copies of `source` and `target`, and copies the targets back. Process
// `aborted` (-1: none) has its transport aborted before its run starts.
IpcRun RunCase(const IpcCase& c, HostBuffers& source, HostBuffers& target, FakeCudaFabric& cuda,
               bool verify, int32_t aborted = -1) {
  const Job& job = c.job;
  std::unique_ptr<NcclApi> api = cuda.Api();
  DeviceMirror device_source(*api, source);
  DeviceMirror device_target(*api, target);
  LoopbackFabric messengers(job.num_processes());
  IpcRun run;
  run.results.resize(job.num_processes(), absl::UnknownError("not run"));
  run.elapsed.resize(job.num_processes());
  const Endpoints endpoints = test::AllProcesses(job);
  std::vector<std::thread> threads;
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      absl::StatusOr<std::unique_ptr<Group>> group = messengers.MakeGroup(p);
      absl::StatusOr<std::unique_ptr<Transport>> messenger = messengers.Connect(p);
      if (!group.ok() || !messenger.ok()) return void(run.results[p] = messenger.status());
      CudaIpcOptions ipc;
      ipc.process = p;
      absl::StatusOr<std::unique_ptr<CudaIpcTransport>> transport =
          CudaIpcTransport::Create(ipc, cuda.Api(), std::move(*messenger));
      if (!transport.ok()) return void(run.results[p] = transport.status());
      absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
          CudaDeviceMemory::Create(cuda.Api(), 0);
      if (!memory.ok()) return void(run.results[p] = memory.status());
      const bool is_source = job.IsSource(p);
      const Layout& layout = is_source ? job.source() : job.target();
      DeviceMirror& mirror = is_source ? device_source : device_target;
      const int32_t rank = job.processes()[p].rank;
      LocalBuffers buffers;
      for (const BufferInfo& info : layout.buffers) {
        if (info.process == rank) buffers[info.id] = mirror.data(BufferKey{rank, info.id});
      }
      if (p == aborted) (*transport)->Abort(absl::CancelledError("the test aborts process 0"));
      ArenaCache arenas;
      ExecuteOptions options;
      options.sync_id = 5;
      options.plan_digest = 9;
      options.deadline = absl::Now() + absl::Seconds(60);
      options.device = memory->get();
      options.arenas = &arenas;
      options.verify = verify ? VerifyMode::kHash : VerifyMode::kOff;
      const absl::Time start = absl::Now();
      run.results[p] = ExecuteTransfers(job, c.plan.segments, endpoints, c.budget, p, buffers,
                                        **transport, **group, options);
      run.elapsed[p] = absl::Now() - start;
    });
  }
  for (std::thread& thread : threads) thread.join();
  device_target.CopyBack();
  return run;
}

TEST(CudaIpcExecutorTest, RandomCudaLayoutsLandExactlyAsTheReferenceWrites) {
  int64_t runs = 0, opens = 0;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    absl::StatusOr<std::unique_ptr<IpcCase>> c = MakeCase(seed);
    ASSERT_TRUE(c.ok()) << c.status();
    if (*c == nullptr) continue;
    ++runs;
    const Job& job = (*c)->job;
    HostBuffers source(job.source(), test::kSourceFill);
    HostBuffers target(job.target(), test::kPoison);
    ASSERT_TRUE(test::FillLogical(job.source(), 3, &source).ok());
    FakeCudaFabric cuda;
    // Every other seed verifies its chunks: digests travel in device slots, through IPC too.
    const IpcRun run = RunCase(**c, source, target, cuda, /*verify=*/seed % 2 == 0);
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
      test::ExpectStatsMatchSchedule((*c)->schedules[p], *run.results[p]);
    }
    test::ExpectTargetsAsTheReferenceWrites(job, (*c)->plan.segments, source, target);
    EXPECT_EQ(cuda.live_allocations(), 0);
    EXPECT_EQ(cuda.ipc_opens(), cuda.ipc_closes());  // Every mapping closed with its transport.
    opens += cuda.ipc_opens();
  }
  EXPECT_GT(runs, 40);
  EXPECT_GT(opens, runs);  // Messages between processes went through IPC mappings.
}

// Process 0's transport aborted before its run: it fails with Aborted, and every process returns
// long before the 60 s deadline (its peers learn of it through the messenger).
TEST(CudaIpcExecutorTest, AnAbortedProcessEndsEveryRunPromptly) {
  int64_t runs = 0;
  for (uint64_t seed = 100; seed < 110; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    absl::StatusOr<std::unique_ptr<IpcCase>> c = MakeCase(seed);
    ASSERT_TRUE(c.ok()) << c.status();
    if (*c == nullptr) continue;
    ++runs;
    const Job& job = (*c)->job;
    HostBuffers source(job.source(), test::kSourceFill);
    HostBuffers target(job.target(), test::kPoison);
    FakeCudaFabric cuda;
    const IpcRun run = RunCase(**c, source, target, cuda, /*verify=*/false, /*aborted=*/0);
    EXPECT_EQ(run.results[0].status().code(), absl::StatusCode::kAborted)
        << run.results[0].status();
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      EXPECT_LT(run.elapsed[p], absl::Seconds(20)) << "process " << p;
    }
    EXPECT_EQ(cuda.live_allocations(), 0);
  }
  EXPECT_GT(runs, 5);
}

}  // namespace
}  // namespace wsync
