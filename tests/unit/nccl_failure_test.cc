// The executor with CUDA memory when things fail, against a fake of CUDA and NCCL: a device
// failure or an abort on one process ends every process's run by the deadline or at once, a process
// lost mid-transfer aborts the communicator and is named by those waiting for it, a device arena
// that cannot be allocated is refused; and CudaDeviceMemory without a device.

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
