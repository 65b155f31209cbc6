// The executor's refusals and pacing: the budget is validated the same way by scheduling and
// execution, rows too large to stage and unknown processes are refused, a digest or verify-mode
// disagreement or a local rejection fails every process before any byte moves, and a slow pair does
// not hold back the others.

#include <map>
#include <memory>
#include <random>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/builders.h"
#include "planner/policy.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "tests/unit/executor_test_support.h"
#include "tests/unit/quant_plan_support.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using test::AllProcesses;
using test::ExpectStatsMatchSchedule;
using test::HostBuffers;
using test::executor::BatchRun;
using test::executor::FindLane;
using test::executor::LockstepTransport;
using test::executor::RowsToColumns;
using test::executor::RunBatch;
using test::executor::WrapTransport;
using ::testing::HasSubstr;

TEST(ExecutorTest, BudgetIsValidatedTheSameWayBySchedulingAndExecution) {
  const Job job = RowsToColumns();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const std::vector<Segment> none;
  for (double bytes : {0.0, -1.0, 8.5, 3.0, std::nan("")}) {
    SCOPED_TRACE(bytes);
    for (const std::vector<Segment>* segments : {&plan.segments, &none}) {
      absl::StatusOr<std::vector<ProcessSchedule>> schedules =
          ScheduleTransfers(job, *segments, AllProcesses(job), StagingBudget{bytes});
      EXPECT_EQ(schedules.status().code(), absl::StatusCode::kInvalidArgument);
      HostBuffers source(job.source(), 0), target(job.target(), 0);
      BatchRun run = RunBatch(job, *segments, StagingBudget{bytes}, source, target);
      for (const auto& result : run.results) {
        ASSERT_FALSE(result.ok());
        EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(result.status().message(), schedules.status().message());
      }
    }
  }
  EXPECT_TRUE(
      ScheduleTransfers(job, none, AllProcesses(job), StagingBudget{4}).ok());  // One element.
}

TEST(ExecutorTest, RefusesARowTooLargeToStageUpFront) {
  // The rollout keeps "w" [8, 8] fp32 column-major: one row of the segment is 32 bytes with
  // stride 8, so it must be staged; a 16-byte budget can never hold it.
  LayoutBuilder source(Role::kTrainer);
  const int32_t w = source.AddParam("w", DType::kFloat32, {8, 8});
  source.AddProcess("n");
  source.AddPackedPiece(w, 0, source.AddBuffer(0, 256), WholeBox({8, 8}), 0);
  LayoutBuilder target(Role::kRollout);
  target.AddParam("w", DType::kFloat32, {8, 8});
  target.AddProcess("n");
  target.AddPiece(0, 0, target.AddBuffer(0, 256), WholeBox({8, 8}), 0, {1, 8});
  const Job job = *Job::Create(std::move(source).Build(), std::move(target).Build());
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  absl::StatusOr<ProcessSchedule> schedule =
      ScheduleTransfers(job, plan.segments, AllProcesses(job), StagingBudget{16}, 1);
  ASSERT_FALSE(schedule.ok());
  EXPECT_THAT(std::string(schedule.status().message()),
              HasSubstr("one row along axis 0 is 32 bytes, more than the staging budget of 16 "
                        "bytes, and it is not contiguous on the receiving side"));
  EXPECT_TRUE(ScheduleTransfers(job, plan.segments, AllProcesses(job), StagingBudget{32}, 1).ok());
}

TEST(ExecutorTest, RefusesAProcessTheEndpointsDoNotName) {
  const Job job = RowsToColumns();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  Endpoints some{{0, 1, 2}};
  EXPECT_THAT(
      std::string(
          ScheduleTransfers(job, plan.segments, some, StagingBudget{}, 5).status().message()),
      HasSubstr("process 5 is not one of the batch's endpoints"));
  EXPECT_THAT(
      std::string(
          ScheduleTransfers(job, plan.segments, some, StagingBudget{}, 0).status().message()),
      HasSubstr("names process 3, which is not one of the endpoints"));
}

TEST(ExecutorTest, DigestDisagreementFailsEveryProcessBeforeAnyByteMoves) {
  const Job job = RowsToColumns();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  HostBuffers source(job.source(), 1), target(job.target(), test::kPoison);
  BatchRun run = RunBatch(job, plan.segments, StagingBudget{}, source, target,
                          [](int32_t p) -> uint64_t { return p == 3 ? 0xbad : 0x600d; });
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    ASSERT_FALSE(run.results[p].ok());
    EXPECT_THAT(std::string(run.results[p].status().message()), HasSubstr("plan digests differ"));
    EXPECT_THAT(std::string(run.results[p].status().message()),
                HasSubstr(p == 3 ? "0000000000000bad" : "000000000000600d"));
  }
  EXPECT_EQ(run.counters.TotalBytes(), 0);
}

// A job with FP8 targets run without its quantization steps (ExecuteOptions::quant) fails on every
// process, and no byte moves (a sync must never report FP8 weights it did not write).
TEST(ExecutorTest, RefusesAJobWithQuantizedTargets) {
  const Dims shape = {64, 48};
  const quant_plan_test::AxisCuts cuts = {{0, 32, 64}, {0, 48}};
  const Job job = *Job::Create(quant_plan_test::QuantSource(shape, cuts, 1, 0),
                               quant_plan_test::QuantTarget(shape, ParamQuant{16, 16, ""},
                                                            quant_plan_test::Uncut(shape), 1, 0));
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  ASSERT_FALSE(plan.quant.transforms.empty());
  HostBuffers source(job.source(), 1), target(job.target(), test::kPoison);
  BatchRun run = RunBatch(job, plan.segments, StagingBudget{}, source, target);
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    ASSERT_FALSE(run.results[p].ok()) << p;
    EXPECT_THAT(std::string(run.results[p].status().message()),
                HasSubstr("was given no quantization steps"));
  }
  EXPECT_EQ(run.counters.TotalBytes(), 0);
}

// One process verifies with xxh3, the others not: its receivers would wait for hashes nobody
// sends (or its senders send hashes nobody reads), so the agreement refuses the batch on every
// process, naming both modes, before any byte moves.
TEST(ExecutorTest, VerifyModeDisagreementFailsEveryProcessBeforeAnyByteMoves) {
  const Job job = RowsToColumns();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  HostBuffers source(job.source(), 1), target(job.target(), test::kPoison);
  BatchRun run = RunBatch(job, plan.segments, StagingBudget{}, source, target, {}, -1, {}, false,
                          {}, absl::Seconds(60),
                          [](int32_t p) { return p == 2 ? VerifyMode::kHash : VerifyMode::kOff; });
  for (int32_t p = 0; p < job.num_processes(); ++p) {
    ASSERT_FALSE(run.results[p].ok()) << p;
    EXPECT_EQ(run.results[p].status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(run.results[p].status().message());
    EXPECT_THAT(message, HasSubstr("verify modes differ"));
    EXPECT_THAT(message, HasSubstr("xxh3 hashes"));
    EXPECT_THAT(message, HasSubstr("none (off)"));
  }
  EXPECT_EQ(run.counters.TotalBytes(), 0);
}

TEST(ExecutorTest, LocalRejectionFailsEveryProcessWithTheReason) {
  const Job job = RowsToColumns();
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  HostBuffers source(job.source(), 1), target(job.target(), test::kPoison);
  BatchRun run = RunBatch(job, plan.segments, StagingBudget{}, source, target, {},
                          /*drop_buffer_of=*/4);
  EXPECT_THAT(std::string(run.results[4].status().message()),
              HasSubstr("process 4 was given no address for its buffer 0"));
  for (int32_t p : {0, 1, 2, 3, 5}) {
    EXPECT_EQ(run.results[p].status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(run.results[p].status().message()),
                HasSubstr("rejected before any byte moved by process 4: process 4 was given no "
                          "address"));
  }
  EXPECT_EQ(run.counters.TotalBytes(), 0);
}

// Process `receiver`'s transport reports no request with `slow_peer` finished until `others`
// requests with other peers have: a pair that cannot move (a saturated link) while the others
// can. Requests that finish meanwhile are held back and reported afterwards.
class SlowPeerTransport final : public ForwardingTransport {
 public:
  SlowPeerTransport(std::unique_ptr<Transport> inner, int32_t slow_peer, int64_t others)
      : ForwardingTransport(std::move(inner)), slow_peer_(slow_peer), others_(others) {}

  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    return Remember(peer, ForwardingTransport::PostSend(peer, tag, data, bytes));
  }
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    return Remember(peer, ForwardingTransport::PostReceive(peer, tag, data, bytes));
  }
  absl::StatusOr<bool> Test(RequestId request) override {
    const bool slow = slow_.contains(request);
    if (slow && others_finished_ < others_) {
      if (!held_.contains(request)) {
        absl::StatusOr<bool> done = ForwardingTransport::Test(request);
        if (!done.ok()) return done;
        if (*done) held_.insert(request);
      }
      return false;
    }
    if (held_.erase(request) > 0) return true;
    absl::StatusOr<bool> done = ForwardingTransport::Test(request);
    if (done.ok() && *done && !slow) ++others_finished_;
    return done;
  }
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished) override {
    return Transport::WaitAny(requests, deadline, finished);  // Polls Test above.
  }
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override {
    std::vector<RequestId> left(requests.begin(), requests.end());
    while (!left.empty() && absl::Now() < deadline) {
      std::vector<size_t> finished;
      absl::Status status = WaitAny(left, deadline, &finished);
      for (auto it = finished.rbegin(); it != finished.rend(); ++it) left.erase(left.begin() + *it);
      if (!status.ok() && !absl::IsDeadlineExceeded(status)) return status;
    }
    if (left.empty()) return absl::OkStatus();
    for (RequestId request : left) held_.erase(request);
    ForwardingTransport::WaitAll(left, deadline).IgnoreError();  // Cancels them.
    return absl::DeadlineExceededError(absl::StrCat(left.size(), " requests missed the deadline"));
  }

 private:
  absl::StatusOr<RequestId> Remember(int32_t peer, absl::StatusOr<RequestId> request) {
    if (request.ok() && peer == slow_peer_) slow_.insert(*request);
    return request;
  }

  const int32_t slow_peer_;
  const int64_t others_;
  int64_t others_finished_ = 0;
  absl::flat_hash_set<RequestId> slow_;  // Requests with slow_peer_.
  absl::flat_hash_set<RequestId> held_;  // Finished, not yet reported.
};

// Two trainers each hold half the rows of one tensor that one rollout needs whole, 16 messages
// per pair. With the pair from trainer 0 unable to move until the rollout received everything
// from trainer 1, the executor (each pair advancing on its own) still completes the sync exactly;
// in lockstep rounds (a transport that needs round order) the rollout's round 0 waits on trainer
// 0 and the sync misses its deadline.
TEST(ExecutorTest, ASlowPairDoesNotHoldBackTheOthers) {
  LayoutBuilder source(Role::kTrainer);
  LayoutBuilder target(Role::kRollout);
  const Dims shape{64, 16};
  const int32_t w = source.AddParam("w", DType::kFloat32, shape);
  for (int32_t t = 0; t < 2; ++t) {
    source.AddProcess("n");
    const Box half = SplitBox(shape, 0, 2, t);
    source.AddPackedPiece(w, t, source.AddBuffer(t, Volume(half) * 4), half, 0);
  }
  const int32_t whole = target.AddParam("w", DType::kFloat32, shape);
  target.AddProcess("n");
  target.AddPackedPiece(whole, 0, target.AddBuffer(0, Volume(shape) * 4), WholeBox(shape), 0);
  const Job job = *Job::Create(std::move(source).Build(), std::move(target).Build());
  const Plan plan = *MakePlan(job, *MakeFirstHolderPolicy());
  const StagingBudget budget{256};  // 128-byte chunks: two rows each, 16 per trainer.
  const ProcessSchedule rollout =
      *ScheduleTransfers(job, plan.segments, AllProcesses(job), budget, 2);
  const PeerSchedule* fast = FindLane(rollout, 1, Direction::kReceive);
  ASSERT_NE(fast, nullptr);
  ASSERT_EQ(fast->rounds.size(), 16u);
  ASSERT_EQ(FindLane(rollout, 0, Direction::kReceive)->rounds.size(), 16u);

  for (const bool lockstep : {false, true}) {
    SCOPED_TRACE(lockstep ? "lockstep rounds" : "lanes");
    const WrapTransport wrap = [&](int32_t p, std::unique_ptr<Transport> inner) {
      if (lockstep) inner = std::make_unique<LockstepTransport>(std::move(inner));
      if (p != 2) return inner;
      return std::unique_ptr<Transport>(std::make_unique<SlowPeerTransport>(
          std::move(inner), /*slow_peer=*/0, std::ssize(fast->rounds)));
    };
    HostBuffers source_buffers(job.source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job.source(), 3, &source_buffers).ok());
    HostBuffers target_buffers(job.target(), test::kPoison);
    BatchRun run = RunBatch(job, plan.segments, budget, source_buffers, target_buffers, {}, -1, {},
                            false, wrap, lockstep ? absl::Seconds(1) : absl::Seconds(60));
    if (lockstep) {
      EXPECT_EQ(run.results[2].status().code(), absl::StatusCode::kDeadlineExceeded)
          << run.results[2].status();
      // The error says what the rollout still waited for: every message of both lanes (none of
      // round 0 completed), 128 bytes each.
      EXPECT_THAT(std::string(run.results[2].status().message()),
                  HasSubstr("outstanding with 2 peers: receive from process 0: 16 of 16 messages "
                            "(2048 bytes, rounds 0-15); receive from process 1: 16 of 16"));
      continue;
    }
    for (int32_t p = 0; p < 3; ++p) {
      ASSERT_TRUE(run.results[p].ok()) << "process " << p << ": " << run.results[p].status();
    }
    ExpectStatsMatchSchedule(rollout, *run.results[2]);
    EXPECT_TRUE(test::CheckLogical(job.target(), target_buffers, 3).ok());
  }
}

}  // namespace
}  // namespace wsync
