// A process that dies in the middle of a transfer: its control connection closes and its transport
// neither completes nor fails anything more, as after SIGKILL. The coordinator's loss notice
// reaches every other process, whose LossWatch fails its transport's requests with the dead process
// (Transport::PeerLost): every survivor ends well before the deadline, those that hear of it fail
// naming it (the others may fail on a survivor that gave up first, through the executor's notice);
// without the notice they would wait for the deadline (loopback, like NCCL and UCX over
// shared memory, reports nothing of a dead peer). Random layouts over the loopback transport, with
// a real coordinator and control clients.

#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "control/loss_watch.h"
#include "executor/execute.h"
#include "executor/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "tests/testing/executor_checks.h"
#include "tests/testing/random_layouts.h"
#include "tests/unit/control_job.h"
#include "transport/forwarding_transport.h"
#include "transport/loopback/loopback.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(30);
// Every survivor ends within this: far below kDeadline (a bound against waiting for the deadline,
// not a benchmark).
constexpr absl::Duration kBound = absl::Seconds(5);

// The `die_at`-th receive this process posts closes its control connection and then blocks until
// `release`: a process that died mid-transfer. Everything else passes through.
class DyingTransport final : public ForwardingTransport {
 public:
  DyingTransport(Transport& inner, ControlClient& client, int die_at, absl::Notification& release)
      : ForwardingTransport(inner), client_(client), die_at_(die_at), release_(release) {}

  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    if (++receives_ == die_at_) {
      client_.Abort(absl::UnavailableError("killed by the test"));
      release_.WaitForNotification();
      return absl::UnavailableError("the dead process was released");
    }
    return ForwardingTransport::PostReceive(peer, tag, data, bytes);
  }

 private:
  ControlClient& client_;
  const int die_at_;
  absl::Notification& release_;
  int receives_ = 0;
};

struct Case {
  Job job;
  Plan plan;
  std::vector<ProcessSchedule> schedules;
  int32_t victim = -1;  // A process receiving at least two messages.
};

absl::StatusOr<Case> FindCase(uint64_t seed, const StagingBudget& budget) {
  std::mt19937_64 rng(seed);
  test::LayoutPair pair = test::RandomLayoutPair(rng);
  absl::StatusOr<Job> job = Job::Create(pair.source, pair.target);
  if (!job.ok()) return job.status();
  test::RandomAnswersPolicy policy(seed);
  absl::StatusOr<Plan> plan = MakePlan(*job, policy);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<std::vector<ProcessSchedule>> schedules =
      ScheduleTransfers(*job, plan->segments, test::AllProcesses(*job), budget);
  if (!schedules.ok()) return schedules.status();
  for (const ProcessSchedule& schedule : *schedules) {
    int64_t receives = 0;
    for (const PeerSchedule& lane : schedule.peers) {
      if (lane.direction == Direction::kReceive) receives += lane.rounds.size();
    }
    if (receives >= 2) {
      const int32_t victim = schedule.process;
      return Case{*std::move(job), *std::move(plan), *std::move(schedules), victim};
    }
  }
  return absl::NotFoundError("no process receives two messages");
}

TEST(PeerLossTest, ALostProcessFailsTheOthersWellBeforeTheDeadlineNamingIt) {
  const StagingBudget budget{1024};
  int cases = 0, named = 0;
  for (uint64_t seed = 0; seed < 40 && cases < 4; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    absl::StatusOr<Case> c = FindCase(seed, budget);
    if (!c.ok()) continue;
    ++cases;
    const Job& job = c->job;
    const int32_t world = job.num_processes();
    int32_t trainers = 0;
    for (int32_t p = 0; p < world; ++p) trainers += job.IsSource(p) ? 1 : 0;
    control_testing::Job control = control_testing::StartJob(
        trainers, world - trainers, control_testing::Options(trainers, world - trainers));
    ASSERT_EQ(static_cast<int32_t>(control.clients.size()), world);
    test::HostBuffers source(job.source(), test::kSourceFill);
    ASSERT_TRUE(test::FillLogical(job.source(), 3, &source).ok());
    test::HostBuffers target(job.target(), test::kPoison);
    LoopbackFabric fabric(world);
    const Endpoints endpoints = test::AllProcesses(job);
    absl::Notification release;
    std::vector<absl::Status> results(world, absl::UnknownError("not run"));
    std::vector<absl::Duration> elapsed(world);
    std::vector<int> reported(world, 0);
    auto run = [&](int32_t p) {
      absl::StatusOr<std::unique_ptr<Transport>> transport = fabric.Connect(p);
      ASSERT_TRUE(transport.ok()) << transport.status();
      ControlClient& client = *control.clients[p];
      std::unique_ptr<Transport> dying;
      Transport* used = transport->get();
      if (p == c->victim) {
        dying = std::make_unique<DyingTransport>(**transport, client, 2, release);
        used = dying.get();
      }
      const LocalBuffers buffers = test::BuffersOf(job, p, source, target);
      ExecuteOptions options;
      options.sync_id = 1;
      options.plan_digest = 42;
      options.deadline = absl::Now() + kDeadline;
      const absl::Time start = absl::Now();
      {
        LossWatch watch(client, [&](int32_t process, const absl::Status& reason) {
          (*transport)->PeerLost(process, reason);
        });
        results[p] = ExecuteTransfers(job, c->plan.segments, endpoints, budget, p, buffers, *used,
                                      client, options)
                         .status();
        reported[p] = watch.reported();
      }
      elapsed[p] = absl::Now() - start;
    };
    std::vector<std::thread> survivors;
    std::thread victim(run, c->victim);
    for (int32_t p = 0; p < world; ++p) {
      if (p != c->victim) survivors.emplace_back(run, p);
    }
    for (std::thread& thread : survivors) thread.join();
    release.Notify();
    victim.join();
    int watches_reporting = 0;
    for (int32_t p = 0; p < world; ++p) watches_reporting += reported[p] > 0 ? 1 : 0;
    // The notice did it: some survivor's watch reported the loss before its transfer ended (the
    // others may have failed first because a peer that heard of it gave up on them).
    EXPECT_GT(watches_reporting, 0);
    int failed = 0, naming = 0;
    for (int32_t p = 0; p < world; ++p) {
      if (p == c->victim) continue;
      SCOPED_TRACE(testing::Message() << "process " << p << ": " << results[p]);
      EXPECT_LT(elapsed[p], kBound);
      // A survivor may finish when the victim took its last message before dying (the commit
      // decision fails it then), or fail on another survivor that gave up first (its notice, or
      // its abort); none waits for the deadline, and the first to hear of the loss names it.
      if (results[p].ok()) continue;
      ++failed;
      EXPECT_FALSE(absl::IsDeadlineExceeded(results[p]));
      const std::string message(results[p].message());
      if (absl::StrContains(message, absl::StrCat("process ", c->victim, " (")) &&
          absl::StrContains(message, "was lost: disconnected")) {
        ++naming;
      }
    }
    EXPECT_GT(failed, 0) << "nobody was waiting for the victim";
    EXPECT_GT(naming, 0) << "no survivor named the lost process";
    named += naming;
  }
  EXPECT_GE(cases, 3);
  EXPECT_GT(named, 0);
}

}  // namespace
}  // namespace wsync
