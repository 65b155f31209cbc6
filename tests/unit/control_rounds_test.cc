// The control plane's collectives over rounds: many rounds of every kind, the numbering after a
// deadline, a replacement joining a running job after the process it replaces was lost, and the
// loss notices every live process gets at once (WatchLosses, LossWatch).

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/loss_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Job;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::StartJob;
using ::testing::HasSubstr;

// A replacement of the same role and rank joins a running job after the process it replaces was
// lost: one with another layout part is refused; the next gets the roster (with its new address)
// and the job's next collective number, the others get the same roster unasked during their next
// collective, a process still behind runs through the rounds it missed at once, and then all
// three complete collectives together again.
TEST(CoordinatorTest, AReplacementForALostProcessJoinsTheRunningJob) {
  Job job = StartJob(2, 1, Options(2, 1));
  Parallel(3, [&](int id) {
    ASSERT_TRUE(job.clients[id]->AllGather("before", absl::Now() + absl::Seconds(5)).ok());
  });
  job.clients[2].reset();  // Rollout rank 0 dies.
  // While it is gone every round fails at once, naming it; trainer 0 runs ahead of trainer 1.
  for (int call = 0; call < 2; ++call) {
    absl::Status s = job.clients[0]->AllGather("lost", absl::Now() + absl::Seconds(5)).status();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("process 2 (rollout rank 0"));
  }
  EXPECT_TRUE(absl::IsUnavailable(
      job.clients[1]->AllGather("lost", absl::Now() + absl::Seconds(5)).status()));

  auto connect_replacement = [&] {
    return ControlClient::Connect(ClientOptions(job.coordinator->port(), ControlRole::kRollout, 0));
  };
  {  // Another layout part cannot take the rank.
    absl::StatusOr<std::unique_ptr<ControlClient>> other = connect_replacement();
    ASSERT_TRUE(other.ok()) << other.status();
    JoinRequest request{"another-manifest", "address-x", "metadata"};
    absl::Status refused = (*other)->Join(request, absl::Now() + absl::Seconds(5)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("layout part differs"));
  }
  absl::StatusOr<std::unique_ptr<ControlClient>> replacement = connect_replacement();
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_EQ((*replacement)->process(), 2);
  JoinRequest request{"rollout-manifest", "address-2-new", "metadata"};
  absl::StatusOr<Roster> roster = (*replacement)->Join(request, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(roster.ok()) << roster.status();
  EXPECT_EQ(roster->epoch, 1u);
  EXPECT_EQ(roster->processes[2].address, "address-2-new");
  EXPECT_EQ(roster->processes[0].address, "address-0");
  EXPECT_EQ(roster->manifest(2), "rollout-manifest");
  job.clients[2] = *std::move(replacement);

  // Trainer 1 is one round behind: that round failed while the rank was lost, and says so at once.
  const absl::Time behind = absl::Now();
  EXPECT_FALSE(job.clients[1]->AllGather("late", behind + absl::Seconds(5)).ok());
  EXPECT_LT(absl::Now() - behind, absl::Seconds(1));
  Parallel(3, [&](int id) {
    absl::StatusOr<std::vector<std::string>> all =
        job.clients[id]->AllGather(absl::StrCat("again", id), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(*all, (std::vector<std::string>{"again0", "again1", "again2"}));
    ASSERT_TRUE(job.clients[id]->Decide(true, "", absl::Now() + absl::Seconds(5)).ok());
  });
  for (int id : {0, 1}) {
    std::optional<Roster> update = job.clients[id]->TakeRosterUpdate();
    ASSERT_TRUE(update.has_value()) << "process " << id << " did not learn the new address";
    EXPECT_EQ(update->epoch, 1u);
    EXPECT_EQ(update->processes[2].address, "address-2-new");
    EXPECT_FALSE(job.clients[id]->TakeRosterUpdate().has_value());
  }
  EXPECT_FALSE(job.clients[2]->TakeRosterUpdate().has_value());
  EXPECT_EQ(job.coordinator->counters().replaced, 1);
}

// A process whose connection ends after the rendezvous: every other process is told at once and
// unasked, naming it and why; WatchLosses reads the notice between calls, and a call that meets one
// records it (it is neither lost nor mistaken for an answer).
TEST(CoordinatorTest, EveryLiveProcessIsToldOfALostProcessAtOnce) {
  Job job = StartJob(2, 2, Options(2, 2));
  const absl::Time closed = absl::Now();
  job.clients[3].reset();  // Rollout rank 1's connection ends.
  for (int id : {0, 1}) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (job.clients[id]->loss_count() == 0 && absl::Now() < give_up) {
      ASSERT_TRUE(job.clients[id]->WatchLosses(absl::Now() + absl::Milliseconds(100), -1).ok());
    }
    const std::vector<LossNotice> notices = job.clients[id]->LossesSince(0);
    ASSERT_EQ(notices.size(), 1u) << "process " << id;
    EXPECT_EQ(notices[0].process, 3);
    EXPECT_THAT(notices[0].reason,
                HasSubstr("process 3 (rollout rank 1, node node-r0) was lost: "));
    EXPECT_TRUE(job.clients[id]->LossesSince(1).empty());
  }
  EXPECT_LT(absl::Now() - closed, absl::Seconds(5));  // A bound against a hang, not a benchmark.
  // Process 2 watched nothing: its next call meets the notice, records it, and fails naming it.
  absl::Status barrier = job.clients[2]->Barrier(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(barrier)) << barrier;
  EXPECT_THAT(barrier.message(), HasSubstr("process 3 (rollout rank 1"));
  ASSERT_EQ(job.clients[2]->loss_count(), 1u);
  EXPECT_EQ(job.clients[2]->LossesSince(0)[0].process, 3);
}

// A LossWatch reports each process lost after it started, once: one lost while its owner waits in
// a collective that the lost process never joins (the call reads the notice, the watch reports
// it), and one lost while no call runs (the watch reads the notice itself); a loss from before a
// watch started is not reported by it.
TEST(LossWatchTest, ReportsEachProcessLostAfterItStartedOnce) {
  Job job = StartJob(2, 2, Options(2, 2));
  absl::Mutex mu;
  std::vector<std::pair<int32_t, std::string>> reported;
  auto record = [&](int32_t process, const absl::Status& reason) {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(absl::IsUnavailable(reason)) << reason;
    reported.emplace_back(process, std::string(reason.message()));
  };
  auto reported_count = [&] {
    absl::MutexLock lock(&mu);
    return reported.size();
  };
  auto wait_for = [&](size_t count) {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (reported_count() < count && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  };
  {
    LossWatch watch(*job.clients[0], record);
    std::thread lose([&] {
      absl::SleepFor(absl::Milliseconds(200));
      job.clients[2].reset();  // Rollout rank 0, while process 0 waits in its call.
    });
    absl::Status call = job.clients[0]->Barrier(absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(absl::IsUnavailable(call)) << call;
    lose.join();
    wait_for(1);
    EXPECT_EQ(watch.reported(), 1);
  }
  {
    LossWatch watch(*job.clients[0], record);
    absl::SleepFor(kLossWatchPeriod * 2);  // Process 2 was lost before: not reported again.
    EXPECT_EQ(reported_count(), 1u);
    job.clients[3].reset();  // No call runs on process 0: the watch reads the notice itself.
    wait_for(2);
    absl::SleepFor(kLossWatchPeriod * 2);
    EXPECT_EQ(watch.reported(), 1);
  }
  absl::MutexLock lock(&mu);
  ASSERT_EQ(reported.size(), 2u);
  EXPECT_EQ(reported[0].first, 2);
  EXPECT_THAT(reported[0].second, HasSubstr("process 2 (rollout rank 0, node node-r0) was lost"));
  EXPECT_EQ(reported[1].first, 3);
  EXPECT_THAT(reported[1].second, HasSubstr("process 3 (rollout rank 1, node node-r0) was lost"));
}

}  // namespace
}  // namespace wsync
