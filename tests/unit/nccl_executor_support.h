#ifndef WSYNC_TESTS_UNIT_NCCL_EXECUTOR_SUPPORT_H_
#define WSYNC_TESTS_UNIT_NCCL_EXECUTOR_SUPPORT_H_

// What the executor tests with CUDA memory share (nccl_executor_test.cc, nccl_failure_test.cc):
// random cases with buffers placed in CUDA memory, and a run of every process as a thread against
// a fake of CUDA and NCCL with its hooks.

#include <atomic>
#include <functional>
#include <random>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "control/loss_watch.h"
#include "device/cuda_device_memory.h"
#include "executor/execute.h"
#include "executor/memory_kinds.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/policy.h"
#include "planner/relay.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "tests/unit/control_job.h"
#include "tests/unit/fake_cuda_fabric.h"
#include "transport/loopback/loopback.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/selector/selector.h"

namespace wsync::test::nccl_executor {

using test::AllProcesses;
using test::FakeCudaFabric;
using test::HostBuffers;

// How a test places buffers in CUDA memory.
enum class Placement { kAllCuda, kRandomBuffers, kRolloutsOnly };

inline void PlaceBuffers(Placement placement, std::mt19937_64& rng, test::LayoutPair& pair) {
  for (Layout* layout : {&pair.source, &pair.target}) {
    for (BufferInfo& buffer : layout->buffers) {
      const bool cuda = placement == Placement::kAllCuda ||
                        (placement == Placement::kRandomBuffers && rng() % 2 == 0) ||
                        (placement == Placement::kRolloutsOnly && layout == &pair.target);
      buffer.kind = cuda ? MemoryKind::kCuda : MemoryKind::kHost;
    }
  }
}

// Per-process knobs of a run.
struct RunHooks {
  // Wraps or replaces the process's DeviceMemory (null: none given).
  std::function<std::unique_ptr<DeviceMemory>(int32_t, std::unique_ptr<DeviceMemory>)> device;
  // Called with the process's transport before its run starts.
  std::function<void(int32_t, Transport&)> before_run;
  absl::Duration deadline = absl::Seconds(60);
  bool verify = false;
  // Process p's own segments (its own plan); empty: the batch's segments for every process.
  std::function<std::vector<Segment>(int32_t)> segments_of;
  // Process p's Group instead of the loopback fabric's (e.g. a ControlClient).
  std::function<Group*(int32_t)> group;
  // Made just before the process's run and destroyed right after it (e.g. a LossWatch).
  std::function<std::shared_ptr<void>(int32_t, Transport&)> during_run;
  // The plan's quantization steps (ExecuteOptions::quant), for jobs with FP8 targets.
  const QuantPlan* quant = nullptr;
};

struct CudaRun {
  std::vector<absl::StatusOr<TransferStats>> results;
  std::vector<absl::Duration> elapsed;
  LoopbackCounters host_counters;  // Bytes the host transport carried.
};

// Runs every process as a thread: a RoutedTransport per process over a loopback fabric (host
// pairs) and one NCCL communicator of the CUDA processes (CUDA pairs), a CudaDeviceMemory on the
// fake per CUDA process, and the buffers of CUDA memory declared device memory to the fake.
inline CudaRun RunCudaBatch(const Job& job, const std::vector<Segment>& segments,
                            StagingBudget budget, HostBuffers& source, HostBuffers& target,
                            FakeCudaFabric& cuda, const RunHooks& hooks = {}) {
  const JobMemoryKinds kinds(job);
  const std::vector<int32_t> members = kinds.CudaProcesses();
  for (const bool is_source : {true, false}) {
    const Layout& layout = is_source ? job.source() : job.target();
    HostBuffers& memory = is_source ? source : target;
    for (const BufferInfo& info : layout.buffers) {
      if (info.kind != MemoryKind::kCuda) continue;
      const BufferKey key{info.process, info.id};
      cuda.AddDeviceRange(memory.data(key), memory.bytes(key));
    }
  }
  absl::StatusOr<NcclUniqueId> id = NcclTransport::NewUniqueId(*cuda.Api());
  LoopbackFabric fabric(job.num_processes());
  CudaRun run;
  run.results.resize(job.num_processes(), absl::UnknownError("not run"));
  run.elapsed.resize(job.num_processes());
  std::vector<std::thread> threads;
  const Endpoints endpoints = AllProcesses(job);
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    threads.emplace_back([&, p] {
      auto fail = [&](const absl::Status& status) { run.results[p] = status; };
      auto group = fabric.MakeGroup(p);
      auto host = fabric.Connect(p);
      if (!group.ok() || !host.ok()) return fail(group.ok() ? host.status() : group.status());
      std::vector<std::unique_ptr<Transport>> backends;
      backends.push_back(std::move(*host));
      std::unique_ptr<DeviceMemory> device;
      const bool cuda_process = kinds.Process(p) == MemoryKind::kCuda;
      if (cuda_process) {
        NcclOptions options;
        options.process = p;
        options.members = members;
        options.unique_id = *id;
        options.connect_deadline = absl::Now() + absl::Seconds(30);
        absl::StatusOr<std::unique_ptr<NcclTransport>> nccl =
            NcclTransport::Create(options, cuda.Api());
        if (!nccl.ok()) return fail(nccl.status());
        backends.push_back(std::move(*nccl));
        absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
            CudaDeviceMemory::Create(cuda.Api(), 0);
        if (!memory.ok()) return fail(memory.status());
        device = std::move(*memory);
      }
      if (hooks.device) device = hooks.device(p, std::move(device));
      std::vector<int32_t> route(job.num_processes(), 0);
      for (int32_t peer = 0; peer < job.num_processes(); ++peer) {
        route[peer] = kinds.Pair(p, peer) == MemoryKind::kCuda ? 1 : 0;
      }
      absl::StatusOr<std::unique_ptr<RoutedTransport>> transport =
          RoutedTransport::Create(p, std::move(backends), std::move(route));
      if (!transport.ok()) return fail(transport.status());
      const LocalBuffers buffers = test::BuffersOf(job, p, source, target);
      if (hooks.before_run) hooks.before_run(p, **transport);
      ArenaCache arenas;
      ExecuteOptions options;
      options.sync_id = 7;
      options.plan_digest = 42;
      options.deadline = absl::Now() + hooks.deadline;
      options.device = device.get();
      options.arenas = &arenas;
      options.verify = hooks.verify ? VerifyMode::kHash : VerifyMode::kOff;
      options.quant = hooks.quant;
      const absl::Time start = absl::Now();
      const std::vector<Segment> mine = hooks.segments_of ? hooks.segments_of(p) : segments;
      std::shared_ptr<void> during = hooks.during_run ? hooks.during_run(p, **transport) : nullptr;
      Group& members = hooks.group ? *hooks.group(p) : **group;
      run.results[p] =
          ExecuteTransfers(job, mine, endpoints, budget, p, buffers, **transport, members, options);
      during.reset();
      run.elapsed[p] = absl::Now() - start;
    });
  }
  for (std::thread& thread : threads) thread.join();
  run.host_counters = fabric.counters();
  return run;
}

struct RandomCase {
  Job job;
  Plan plan;
};

inline absl::StatusOr<RandomCase> MakeCase(uint64_t seed, Placement placement) {
  std::mt19937_64 rng(seed);
  test::LayoutPair pair = test::RandomLayoutPair(rng);
  PlaceBuffers(placement, rng, pair);
  absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
  if (!job.ok()) return job.status();
  test::RandomAnswersPolicy policy(seed);
  absl::StatusOr<Plan> plan = MakePlan(*job, policy);
  if (!plan.ok()) return plan.status();
  return RandomCase{std::move(*job), std::move(*plan)};
}

// One seed of the random-layout tests, placements and budgets cycling by seed: its case, schedules,
// buffers (sources filled, targets poisoned), fabric and run.
struct CycledRun {
  CycledRun(RandomCase c, int64_t budget, std::vector<ProcessSchedule> all)
      : random(std::move(c)),
        budget_bytes(budget),
        schedules(std::move(all)),
        source(random.job.source(), test::kSourceFill),
        target(random.job.target(), test::kPoison) {}
  RandomCase random;
  const int64_t budget_bytes;
  const std::vector<ProcessSchedule> schedules;
  HostBuffers source;
  HostBuffers target;
  FakeCudaFabric cuda;
  CudaRun run;
};

// Runs seed `seed` with `hooks`; null when the budget is too small for a staged row (refused as
// on hosts).
inline absl::StatusOr<std::unique_ptr<CycledRun>> RunCycledCase(uint64_t seed,
                                                                const RunHooks& hooks = {}) {
  const int64_t kBudgets[] = {256, 1024, 4096, int64_t{1} << 20};
  const Placement kPlacements[] = {Placement::kAllCuda, Placement::kRandomBuffers,
                                   Placement::kRolloutsOnly};
  absl::StatusOr<RandomCase> c = MakeCase(seed, kPlacements[seed % 3]);
  if (!c.ok()) return c.status();
  const StagingBudget budget{static_cast<double>(kBudgets[seed % 4])};
  absl::StatusOr<std::vector<ProcessSchedule>> schedules =
      ScheduleTransfers(c->job, c->plan.segments, AllProcesses(c->job), budget);
  if (!schedules.ok()) return nullptr;
  auto r = std::make_unique<CycledRun>(*std::move(c), kBudgets[seed % 4], *std::move(schedules));
  WSYNC_RETURN_IF_ERROR(test::FillLogical(r->random.job.source(), 3, &r->source));
  r->run = RunCudaBatch(r->random.job, r->random.plan.segments, budget, r->source, r->target,
                        r->cuda, hooks);
  return r;
}

}  // namespace wsync::test::nccl_executor

#endif  // WSYNC_TESTS_UNIT_NCCL_EXECUTOR_SUPPORT_H_
