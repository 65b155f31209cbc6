// The executor with CUDA memory, end to end against a fake of CUDA and NCCL (FakeCudaFabric:
// device memory is host memory, streams run lazily, NCCL p2p between threads): random layouts
// whose buffers are CUDA memory (all, some, or one side's) run as scheduled and write exactly what
// the reference writes; messages between CUDA processes go over NCCL and all others over the host
// transport; a host-only job never calls the device; CUDA buffers without a device are refused
// everywhere; verify checks every chunk through the device (and names a byte corrupted in device
// memory); a failure or an abort on one process ends every process's run, and so does a process
// lost mid-transfer (the coordinator's notice, LossWatch, PeerLost aborting the communicator).

#include <atomic>
#include <functional>
#include <random>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "executor/execute.h"
#include "executor/memory_kinds.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/policy.h"
#include "planner/relay.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "tests/testing/reference.h"
#include "tests/unit/control_job.h"
#include "tests/unit/fake_cuda_fabric.h"
#include "transport/control/loss_watch.h"
#include "transport/loopback/loopback.h"
#include "transport/nccl/cuda_device_memory.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/selector/selector.h"

namespace wsync {
namespace {

using test::AllProcesses;
using test::BufferKey;
using test::ExpectStatsMatchSchedule;
using test::ExpectTargetsAsTheReferenceWrites;
using test::FakeCudaFabric;
using test::HostBuffers;
using ::testing::HasSubstr;

// How a test places buffers in CUDA memory.
enum class Placement { kAllCuda, kRandomBuffers, kRolloutsOnly };

void PlaceBuffers(Placement placement, std::mt19937_64& rng, test::LayoutPair& pair) {
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
};

struct CudaRun {
  std::vector<absl::StatusOr<TransferStats>> results;
  std::vector<absl::Duration> elapsed;
  LoopbackCounters host_counters;  // Bytes the host transport carried.
};

// Runs every process as a thread: a RoutedTransport per process over a loopback fabric (host
// pairs) and one NCCL communicator of the CUDA processes (CUDA pairs), a CudaDeviceMemory on the
// fake per CUDA process, and the buffers of CUDA memory declared device memory to the fake.
CudaRun RunCudaBatch(const Job& job, const std::vector<Segment>& segments, StagingBudget budget,
                     HostBuffers& source, HostBuffers& target, FakeCudaFabric& cuda,
                     const RunHooks& hooks = {}) {
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

absl::StatusOr<RandomCase> MakeCase(uint64_t seed, Placement placement) {
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
absl::StatusOr<std::unique_ptr<CycledRun>> RunCycledCase(uint64_t seed,
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

TEST(NcclExecutorTest, CudaMemoryRunsAsScheduledAndExact) {
  int64_t runs = 0, cuda_direct = 0, cuda_staged = 0, cuda_arenas = 0, host_lanes_of_cuda = 0;
  int64_t kernel_launches = 0;
  for (uint64_t seed = 0; seed < 240; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    absl::StatusOr<std::unique_ptr<CycledRun>> cycled = RunCycledCase(seed);
    ASSERT_TRUE(cycled.ok()) << cycled.status();
    if (*cycled == nullptr) continue;
    const CycledRun& r = **cycled;
    const Job& job = r.random.job;
    const CudaRun& run = r.run;
    ++runs;
    const JobMemoryKinds kinds(job);
    for (int32_t p = 0; p < job.num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
      const ProcessSchedule& schedule = r.schedules[p];
      ExpectStatsMatchSchedule(schedule, *run.results[p]);
      int64_t cuda_arena = 0;
      for (const PeerSchedule& lane : schedule.peers) {
        EXPECT_EQ(lane.arena_kind, kinds.Pair(p, lane.peer));
        EXPECT_LE(lane.arena_bytes(), r.budget_bytes);
        if (lane.arena_kind == MemoryKind::kCuda) {
          cuda_arena += lane.arena_bytes();
          for (const ScheduledRound& round : lane.rounds) {
            (round.direct ? cuda_direct : cuda_staged) += round.bytes;
          }
        } else if (kinds.Process(p) == MemoryKind::kCuda) {
          ++host_lanes_of_cuda;  // A CUDA process staging through host memory to a host peer.
        }
        if (lane.direction != Direction::kSend) continue;
        // CUDA pairs go over NCCL, never over the host transport; host pairs the other way.
        int64_t bytes = 0;
        for (const ScheduledRound& round : lane.rounds) bytes += round.bytes;
        EXPECT_EQ(run.host_counters.BytesDelivered(p, lane.peer),
                  lane.arena_kind == MemoryKind::kCuda ? 0 : bytes);
      }
      EXPECT_EQ(schedule.cuda_arena_bytes, cuda_arena);
      cuda_arenas += cuda_arena;
    }
    ExpectTargetsAsTheReferenceWrites(job, r.random.plan.segments, r.source, r.target);
    EXPECT_EQ(r.cuda.live_allocations(), 0);  // Every device arena was freed with its cache.
    kernel_launches += r.cuda.kernel_launches();
  }
  EXPECT_GT(runs, 160);
  EXPECT_GT(cuda_direct, 0);  // Every path was exercised.
  EXPECT_GT(cuda_staged, 0);
  EXPECT_GT(cuda_arenas, 0);
  EXPECT_GT(host_lanes_of_cuda, 0);
  EXPECT_GT(kernel_launches, 0);  // Geometries beyond kMaxCopies2D copies took the kernel path.
}

// Relayed plans (planner/relay.h) with every buffer in CUDA memory, each process running its own
// plan: stage 1 lands in the relays' device arenas, stage 2 forwards from them over NCCL, and the
// targets equal the reference's.
TEST(NcclExecutorTest, RelayedPlansWithCudaMemoryForwardThroughDeviceArenas) {
  const int64_t kBudgets[] = {1024, 4096, int64_t{1} << 20};
  int64_t relayed_runs = 0, forwarded = 0, cuda_relay_arena = 0;
  for (uint64_t seed = 0; seed < 80; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    const int64_t budget_bytes = kBudgets[seed % 3];
    absl::StatusOr<test::RelayedCase> relayed =
        test::MakeRelayedCase(seed, budget_bytes, [](std::mt19937_64& rng, test::LayoutPair& pair) {
          PlaceBuffers(Placement::kAllCuda, rng, pair);
        });
    ASSERT_TRUE(relayed.ok()) << relayed.status();
    const Job* job = &relayed->job;
    const Plan* plan = &relayed->plan;
    const std::vector<std::vector<Segment>>& own = relayed->own;
    if (plan->relays.empty()) continue;
    const StagingBudget budget{static_cast<double>(budget_bytes)};
    absl::StatusOr<std::vector<ProcessSchedule>> schedules =
        ScheduleTransfers(*job, plan->segments, AllProcesses(*job), budget);
    if (!schedules.ok()) continue;
    HostBuffers source(job->source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job->source(), 3, &source).ok());
    HostBuffers target(job->target(), test::kPoison);
    FakeCudaFabric cuda;
    RunHooks hooks;
    hooks.segments_of = [&](int32_t p) { return own[p]; };
    CudaRun run = RunCudaBatch(*job, plan->segments, budget, source, target, cuda, hooks);
    ++relayed_runs;
    const JobMemoryKinds kinds(*job);
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
      const ProcessSchedule& schedule = (*schedules)[p];
      EXPECT_EQ(run.results[p]->forwarded_bytes, schedule.forwarded_bytes);
      EXPECT_EQ(run.results[p]->peak_arena_bytes, schedule.arena_bytes);
      forwarded += schedule.forwarded_bytes;
      for (const PeerSchedule& lane : schedule.peers) {
        // CUDA pairs (forwards included) never touch the host transport. (A process holding no
        // buffer at all is a host process: its pairs travel in host memory.)
        if (lane.direction == Direction::kSend && lane.arena_kind == MemoryKind::kCuda) {
          EXPECT_EQ(run.host_counters.BytesDelivered(p, lane.peer), 0);
        }
      }
      if (schedule.relay_arena_bytes > 0 && kinds.Process(p) == MemoryKind::kCuda) {
        EXPECT_GE(schedule.cuda_arena_bytes, schedule.relay_arena_bytes);
        cuda_relay_arena += schedule.relay_arena_bytes;
      }
    }
    ExpectTargetsAsTheReferenceWrites(*job, plan->segments, source, target);
    EXPECT_EQ(cuda.live_allocations(), 0);
  }
  EXPECT_GT(relayed_runs, 10);
  EXPECT_GT(forwarded, 0);
  EXPECT_GT(cuda_relay_arena, 0);
}

// A DeviceMemory that fails the test when called: a host-only job must never touch the device.
class UntouchableDevice final : public DeviceMemory {
 public:
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t) override { return Touched("Allocate"); }
  void Free(void*) override { Touched("Free").IgnoreError(); }
  absl::Status CopyStridedAsync(void*, absl::Span<const int64_t>, const void*,
                                absl::Span<const int64_t>, absl::Span<const int64_t>,
                                int64_t) override {
    return Touched("CopyStridedAsync");
  }
  absl::Status Synchronize(absl::Time) override { return Touched("Synchronize"); }

 private:
  absl::Status Touched(const char* call) {
    ADD_FAILURE() << "host-only job called DeviceMemory::" << call;
    return absl::InternalError(call);
  }
};

TEST(NcclExecutorTest, HostOnlyJobNeverCallsTheDevice) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    test::LayoutPair pair = test::RandomLayoutPair(rng);
    absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
    ASSERT_TRUE(job.ok());
    test::RandomAnswersPolicy policy(seed);
    absl::StatusOr<Plan> plan = MakePlan(*job, policy);
    ASSERT_TRUE(plan.ok());
    HostBuffers source(job->source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job->source(), 3, &source).ok());
    HostBuffers target(job->target(), test::kPoison);
    FakeCudaFabric cuda;
    RunHooks hooks;
    hooks.device = [](int32_t, std::unique_ptr<DeviceMemory>) {
      return std::make_unique<UntouchableDevice>();
    };
    CudaRun run =
        RunCudaBatch(*job, plan->segments, StagingBudget{4096}, source, target, cuda, hooks);
    for (int32_t p = 0; p < job->num_processes(); ++p) {
      ASSERT_TRUE(run.results[p].ok()) << run.results[p].status();
    }
    ExpectTargetsAsTheReferenceWrites(*job, plan->segments, source, target);
  }
}

TEST(NcclExecutorTest, CudaBuffersWithoutDeviceAreRefusedEverywhere) {
  absl::StatusOr<RandomCase> c = MakeCase(5, Placement::kRolloutsOnly);
  ASSERT_TRUE(c.ok());
  HostBuffers source(c->job.source(), test::kSourceFill);
  HostBuffers target(c->job.target(), test::kPoison);
  FakeCudaFabric cuda;
  RunHooks hooks;
  hooks.device = [](int32_t, std::unique_ptr<DeviceMemory>) {
    return std::unique_ptr<DeviceMemory>();
  };
  CudaRun run =
      RunCudaBatch(c->job, c->plan.segments, StagingBudget{4096}, source, target, cuda, hooks);
  for (int32_t p = 0; p < c->job.num_processes(); ++p) {
    ASSERT_FALSE(run.results[p].ok()) << "process " << p;
    // The refusing process's reason reaches every process through the agreement.
    EXPECT_THAT(std::string(run.results[p].status().message()), HasSubstr("no device memory"));
  }
}

// Chunks this process receives, by its schedule.
int64_t ReceivedChunks(const ProcessSchedule& schedule) {
  int64_t chunks = 0;
  for (const PeerSchedule& lane : schedule.peers) {
    if (lane.direction != Direction::kReceive) continue;
    for (const ScheduledRound& round : lane.rounds) chunks += round.chunks;
  }
  return chunks;
}

// verify=true with CUDA buffers on both sides (all CUDA), on some buffers, or on the rollouts only
// (host/CUDA pairs, each side hashing its own memory kind): every received chunk's hash equals
// its sender's, the targets are exact and the device memory of the hash messages is freed.
TEST(NcclExecutorTest, VerifyChecksEveryChunkWithCudaBuffers) {
  int64_t runs = 0, verified = 0, cuda_pair_chunks = 0;
  for (uint64_t seed = 0; seed < 120; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    RunHooks hooks;
    hooks.verify = true;
    absl::StatusOr<std::unique_ptr<CycledRun>> cycled = RunCycledCase(seed, hooks);
    ASSERT_TRUE(cycled.ok()) << cycled.status();
    if (*cycled == nullptr) continue;
    const CycledRun& r = **cycled;
    ++runs;
    for (int32_t p = 0; p < r.random.job.num_processes(); ++p) {
      ASSERT_TRUE(r.run.results[p].ok()) << "process " << p << ": " << r.run.results[p].status();
      const ProcessSchedule& schedule = r.schedules[p];
      EXPECT_EQ(r.run.results[p]->verified_chunks, ReceivedChunks(schedule)) << "process " << p;
      verified += r.run.results[p]->verified_chunks;
      for (const PeerSchedule& lane : schedule.peers) {
        if (lane.direction != Direction::kReceive || lane.arena_kind != MemoryKind::kCuda) continue;
        for (const ScheduledRound& round : lane.rounds) cuda_pair_chunks += round.chunks;
      }
    }
    ExpectTargetsAsTheReferenceWrites(r.random.job, r.random.plan.segments, r.source, r.target);
    EXPECT_EQ(r.cuda.live_allocations(), 0);
  }
  EXPECT_GT(runs, 80);
  EXPECT_GT(verified, 0);
  EXPECT_GT(cuda_pair_chunks, 0);  // Hash messages went over NCCL too.
}

// A byte flipped as an NCCL message lands in device memory (injected by the fake): the receiver
// hashes what landed, through the device, and fails with DataLoss naming the sender and the chunk,
// as the host path does.
TEST(NcclExecutorTest, VerifyNamesAByteCorruptedInDeviceMemory) {
  int corrupted_runs = 0;
  for (uint64_t seed = 0; seed < 60 && corrupted_runs < 6; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    absl::StatusOr<RandomCase> c = MakeCase(seed, Placement::kAllCuda);
    ASSERT_TRUE(c.ok()) << c.status();
    const Job& job = c->job;
    const StagingBudget budget{static_cast<double>(seed % 2 == 0 ? 1024 : 1 << 20)};
    if (!ScheduleTransfers(job, c->plan.segments, AllProcesses(job), budget).ok()) continue;
    HostBuffers source(job.source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job.source(), 3, &source).ok());
    HostBuffers target(job.target(), test::kPoison);
    FakeCudaFabric cuda;
    cuda.FlipByteOfReceivedMessage(1);
    RunHooks hooks;
    hooks.verify = true;
    hooks.deadline = absl::Seconds(20);
    CudaRun run = RunCudaBatch(job, c->plan.segments, budget, source, target, cuda, hooks);
    const std::vector<std::pair<int, int>> flipped = cuda.flipped_messages();
    if (flipped.empty()) continue;  // No message between CUDA processes in this plan.
    ASSERT_EQ(flipped.size(), 1u);
    ++corrupted_runs;
    const std::vector<int32_t> members = JobMemoryKinds(job).CudaProcesses();
    const int32_t sender = members[flipped[0].first];
    const int32_t receiver = members[flipped[0].second];
    const absl::Status& status = run.results[receiver].status();
    ASSERT_FALSE(status.ok()) << "process " << receiver << " accepted a corrupted byte";
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("verify: chunk ")));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat(" from process ", sender, " differs (parameter '")));
  }
  EXPECT_GE(corrupted_runs, 3);
}

// Fails every call after the first `healthy` copies.
class FailingDevice final : public DeviceMemory {
 public:
  FailingDevice(std::unique_ptr<DeviceMemory> inner, int healthy)
      : inner_(std::move(inner)), healthy_(healthy) {}
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t bytes) override { return inner_->Allocate(bytes); }
  void Free(void* memory) override { inner_->Free(memory); }
  absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) override {
    if (healthy_-- <= 0) return absl::InternalError("injected: cudaMemcpy2DAsync failed");
    return inner_->CopyStridedAsync(dst, dst_strides, src, src_strides, shape, element_size);
  }
  absl::Status Synchronize(absl::Time deadline) override { return inner_->Synchronize(deadline); }

 private:
  std::unique_ptr<DeviceMemory> inner_;
  int healthy_;
};

// The first seed whose all-CUDA plan makes process `p` pack staged sends over NCCL.
absl::StatusOr<RandomCase> CaseWithCudaStagedSends(int32_t* sender) {
  for (uint64_t seed = 100; seed < 400; ++seed) {
    absl::StatusOr<RandomCase> c = MakeCase(seed, Placement::kAllCuda);
    if (!c.ok()) continue;
    absl::StatusOr<std::vector<ProcessSchedule>> schedules =
        ScheduleTransfers(c->job, c->plan.segments, AllProcesses(c->job), StagingBudget{1024});
    if (!schedules.ok()) continue;
    for (const ProcessSchedule& schedule : *schedules) {
      for (const PeerSchedule& lane : schedule.peers) {
        if (lane.direction == Direction::kSend && lane.rounds.size() >= 2 &&
            !lane.rounds[0].direct) {
          *sender = schedule.process;
          return c;
        }
      }
    }
  }
  return absl::NotFoundError("no case");
}

// An all-CUDA job in which `sender` packs staged sends over NCCL, with its buffers and fabric.
class NcclFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<RandomCase> found = CaseWithCudaStagedSends(&sender_);
    ASSERT_TRUE(found.ok()) << found.status();
    case_ = std::make_unique<RandomCase>(*std::move(found));
    source_ = std::make_unique<HostBuffers>(case_->job.source(), test::kSourceFill);
    target_ = std::make_unique<HostBuffers>(case_->job.target(), test::kPoison);
  }
  CudaRun RunWith(const RunHooks& hooks) {
    return RunCudaBatch(case_->job, case_->plan.segments, StagingBudget{1024}, *source_, *target_,
                        cuda_, hooks);
  }
  CudaRun RunWithDyingSender(absl::Duration dead_for, const std::function<bool(int32_t)>& watching);

  int32_t sender_ = -1;
  std::unique_ptr<RandomCase> case_;
  std::unique_ptr<HostBuffers> source_;
  std::unique_ptr<HostBuffers> target_;
  FakeCudaFabric cuda_;
};

TEST_F(NcclFailureTest, DeviceFailureOnOneProcessEndsEveryRunByTheDeadline) {
  RunHooks hooks;
  hooks.deadline = absl::Seconds(2);
  hooks.device = [&](int32_t p,
                     std::unique_ptr<DeviceMemory> inner) -> std::unique_ptr<DeviceMemory> {
    if (p != sender_) return inner;
    return std::make_unique<FailingDevice>(std::move(inner), 0);
  };
  CudaRun run = RunWith(hooks);
  EXPECT_THAT(std::string(run.results[sender_].status().message()), HasSubstr("injected"));
  int failed_peers = 0;
  for (int32_t p = 0; p < case_->job.num_processes(); ++p) {
    EXPECT_LT(run.elapsed[p], absl::Seconds(2) + absl::Seconds(2)) << "process " << p;
    if (p != sender_ && !run.results[p].ok()) ++failed_peers;
  }
  EXPECT_GT(failed_peers, 0);    // The processes waiting for the sender did not report success.
  EXPECT_GE(cuda_.aborts(), 1);  // A deadline over NCCL aborts the communicator.
}

TEST_F(NcclFailureTest, AbortOfOneProcessFailsItsNcclPeersAtOnce) {
  RunHooks hooks;
  hooks.deadline = absl::Seconds(30);
  hooks.before_run = [&](int32_t p, Transport& transport) {
    if (p == sender_) transport.Abort(absl::CancelledError("the host aborted"));
  };
  CudaRun run = RunWith(hooks);
  EXPECT_THAT(std::string(run.results[sender_].status().message()), HasSubstr("the host aborted"));
  const JobMemoryKinds kinds(case_->job);
  for (int32_t p = 0; p < case_->job.num_processes(); ++p) {
    // Nobody waits for the 30 s deadline: NCCL peers see the abort as a remote error.
    EXPECT_LT(run.elapsed[p], absl::Seconds(10)) << "process " << p;
    if (kinds.Process(p) == MemoryKind::kCuda && p != sender_) {
      EXPECT_FALSE(run.results[p].ok()) << "process " << p;
    }
  }
}

// Device memory whose first copy closes the process's control connection and then blocks for
// `dead_for`: the process dies in the middle of its transfer (before its first pack is sent).
class DyingDevice final : public DeviceMemory {
 public:
  DyingDevice(std::unique_ptr<DeviceMemory> inner, ControlClient& client, absl::Duration dead_for)
      : inner_(std::move(inner)), client_(client), dead_for_(dead_for) {}
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t bytes) override { return inner_->Allocate(bytes); }
  void Free(void* memory) override { inner_->Free(memory); }
  absl::Status CopyStridedAsync(void*, absl::Span<const int64_t>, const void*,
                                absl::Span<const int64_t>, absl::Span<const int64_t>,
                                int64_t) override {
    client_.Abort(absl::UnavailableError("killed by the test"));
    absl::SleepFor(dead_for_);
    return absl::UnavailableError("the dead process woke up");
  }
  absl::Status Synchronize(absl::Time deadline) override { return inner_->Synchronize(deadline); }

 private:
  std::unique_ptr<DeviceMemory> inner_;
  ControlClient& client_;
  const absl::Duration dead_for_;
};

// Runs the job with `sender_` dying mid-transfer (DyingDevice: its control connection closes, it
// posts nothing more, and NCCL reports nothing of it) and a LossWatch on each process `watching`
// selects: the coordinator's loss notice reaches them, and PeerLost aborts their NCCL
// communicator (ncclCommAbort). Returns each process's result and time.
CudaRun NcclFailureTest::RunWithDyingSender(absl::Duration dead_for,
                                            const std::function<bool(int32_t)>& watching) {
  const Job& job = case_->job;
  int32_t trainers = 0;
  for (int32_t p = 0; p < job.num_processes(); ++p) trainers += job.IsSource(p) ? 1 : 0;
  control_testing::Job control =
      control_testing::StartJob(trainers, job.num_processes() - trainers,
                                control_testing::Options(trainers, job.num_processes() - trainers));
  EXPECT_EQ(static_cast<int32_t>(control.clients.size()), job.num_processes());
  RunHooks hooks;
  hooks.deadline = absl::Seconds(30);
  hooks.group = [&](int32_t p) -> Group* { return control.clients[p].get(); };
  hooks.during_run = [&](int32_t p, Transport& transport) -> std::shared_ptr<void> {
    if (p == sender_ || !watching(p)) return nullptr;
    return std::make_shared<LossWatch>(*control.clients[p],
                                       [&transport](int32_t lost, const absl::Status& reason) {
                                         transport.PeerLost(lost, reason);
                                       });
  };
  hooks.device = [&](int32_t p,
                     std::unique_ptr<DeviceMemory> inner) -> std::unique_ptr<DeviceMemory> {
    if (p != sender_) return inner;
    return std::make_unique<DyingDevice>(std::move(inner), *control.clients[p], dead_for);
  };
  return RunWith(hooks);
}

// Every process watches. The processes waiting for the sender fail within seconds of a 30 s
// deadline. Each failure names the lost process (it heard of the loss while waiting) or is its
// communicator's remote error: whichever process hears first aborts its communicator, which
// fails its NCCL peers' outstanding requests at once, and when that process had nothing
// outstanding (a trainer done with its sends) nobody's own notice comes first.
TEST_F(NcclFailureTest, ALostProcessAbortsTheCommunicatorWellBeforeTheDeadline) {
  constexpr absl::Duration kDeadFor = absl::Seconds(6);
  CudaRun run = RunWithDyingSender(kDeadFor, [](int32_t) { return true; });
  int failed = 0;
  for (int32_t p = 0; p < case_->job.num_processes(); ++p) {
    if (p == sender_) continue;
    SCOPED_TRACE(testing::Message() << "process " << p << ": " << run.results[p].status());
    EXPECT_LT(run.elapsed[p], kDeadFor - absl::Seconds(1));  // Not the deadline, nor the sender.
    if (run.results[p].ok()) continue;
    ++failed;
    const std::string message(run.results[p].status().message());
    const bool names_the_lost_one =
        absl::StrContains(message, absl::StrCat("process ", sender_, " (")) &&
        absl::StrContains(message, "was lost: disconnected");
    const bool aborted_by_a_peer =
        absl::StrContains(message, absl::StrCat("NCCL communicator of process ", p, " failed")) &&
        absl::StrContains(message, "a peer's communicator was aborted");
    EXPECT_TRUE(names_the_lost_one || aborted_by_a_peer);
  }
  EXPECT_GT(failed, 0);          // The processes waiting for the sender did not report success.
  EXPECT_GE(cuda_.aborts(), 1);  // PeerLost over NCCL aborts the communicator.
}

// Only the processes that receive from the sender watch: the first to hear is waiting for it
// (nobody else aborts first), so its failure names the lost process.
TEST_F(NcclFailureTest, AProcessWaitingForTheLostOneNamesIt) {
  absl::StatusOr<std::vector<ProcessSchedule>> schedules = ScheduleTransfers(
      case_->job, case_->plan.segments, AllProcesses(case_->job), StagingBudget{1024});
  ASSERT_TRUE(schedules.ok()) << schedules.status();
  absl::flat_hash_set<int32_t> receivers;
  for (const ProcessSchedule& schedule : *schedules) {
    for (const PeerSchedule& lane : schedule.peers) {
      if (lane.direction == Direction::kReceive && lane.peer == sender_) {
        receivers.insert(schedule.process);
      }
    }
  }
  ASSERT_FALSE(receivers.empty());
  constexpr absl::Duration kDeadFor = absl::Seconds(6);
  CudaRun run =
      RunWithDyingSender(kDeadFor, [&receivers](int32_t p) { return receivers.contains(p); });
  int naming = 0;
  std::string outcomes;
  for (int32_t p : receivers) {
    absl::StrAppend(&outcomes, "\n  process ", p, ": ", run.results[p].status().ToString());
    EXPECT_LT(run.elapsed[p], kDeadFor - absl::Seconds(1)) << "process " << p;
    EXPECT_FALSE(run.results[p].ok()) << "process " << p;
    const std::string message(run.results[p].status().message());
    naming += absl::StrContains(message, absl::StrCat("process ", sender_, " (")) &&
              absl::StrContains(message, "was lost: disconnected");
  }
  EXPECT_GT(naming, 0) << "no process named the lost one (sender " << sender_ << ")" << outcomes;
}

TEST_F(NcclFailureTest, DeviceArenaAllocationFailureIsRefusedNotCrashed) {
  cuda_.FailMallocAfter(1);
  RunHooks hooks;
  hooks.deadline = absl::Seconds(2);
  CudaRun run = RunWith(hooks);
  int exhausted = 0;
  for (const auto& result : run.results) {
    if (!result.ok() && absl::IsResourceExhausted(result.status())) ++exhausted;
  }
  EXPECT_EQ(exhausted, 1);
  EXPECT_EQ(cuda_.live_allocations(), 0);
}

TEST(CudaDeviceMemoryTest, NoDeviceFailsFastAndClearly) {
  FakeCudaFabric no_gpu(/*devices=*/0);
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
      CudaDeviceMemory::Create(no_gpu.Api(), 0);
  ASSERT_FALSE(memory.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(memory.status()));
  EXPECT_THAT(std::string(memory.status().message()), HasSubstr("no CUDA device"));
  FakeCudaFabric one_gpu(1);
  memory = CudaDeviceMemory::Create(one_gpu.Api(), 3);
  ASSERT_FALSE(memory.ok());
  EXPECT_THAT(std::string(memory.status().message()), HasSubstr("device 3 does not exist"));
}

TEST(CudaDeviceMemoryTest, CopiesLandOnlyAfterSynchronize) {
  FakeCudaFabric cuda;
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
      CudaDeviceMemory::Create(cuda.Api(), 0);
  ASSERT_TRUE(memory.ok()) << memory.status();
  absl::StatusOr<void*> device = (*memory)->Allocate(64);
  ASSERT_TRUE(device.ok());
  std::vector<uint16_t> host(32);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(i * 7 + 1);
  // A 4x8 transpose into device memory, then back.
  const int64_t shape[] = {4, 8};
  const int64_t src_strides[] = {8, 1};
  const int64_t dst_strides[] = {1, 4};
  ASSERT_TRUE(
      (*memory)->CopyStridedAsync(*device, dst_strides, host.data(), src_strides, shape, 2).ok());
  std::vector<uint16_t> back(32, 0);
  const int64_t packed[] = {8, 1};
  ASSERT_TRUE((*memory)->CopyStridedAsync(back.data(), packed, *device, packed, shape, 2).ok());
  EXPECT_EQ(back[1], 0);  // The fake's stream has not run yet.
  ASSERT_TRUE((*memory)->Synchronize(absl::Now() + absl::Seconds(5)).ok());
  const auto* d = static_cast<const uint16_t*>(*device);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(d[j * 4 + i], host[i * 8 + j]);
  }
  for (size_t k = 0; k < back.size(); ++k) EXPECT_EQ(back[k], d[k]);  // In stream order.
  (*memory)->Free(*device);
  EXPECT_EQ(cuda.live_allocations(), 0);
}

}  // namespace
}  // namespace wsync
