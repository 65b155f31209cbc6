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
#include "tests/unit/nccl_executor_support.h"
#include "transport/loopback/loopback.h"
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
using test::nccl_executor::CudaRun;
using test::nccl_executor::CycledRun;
using test::nccl_executor::MakeCase;
using test::nccl_executor::Placement;
using test::nccl_executor::RandomCase;
using test::nccl_executor::RunCudaBatch;
using test::nccl_executor::RunCycledCase;
using test::nccl_executor::RunHooks;
using ::testing::HasSubstr;

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

}  // namespace
}  // namespace wsync
