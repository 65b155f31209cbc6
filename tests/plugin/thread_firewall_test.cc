// No exception leaves a thread the library starts (plugin/include/wsync/wsync.h): an exception
// injected (WSYNC_FAILPOINTS action `throw`, common/failpoint.h) in the sync_begin thread, a
// host's sync, the trainer-triggered loop or the control connection's heartbeat thread becomes
// the session's error;
// the host process (this test) stays alive and the other processes fail promptly instead of
// hanging. Before the firewall each case terminated the process (std::terminate).

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "control/loss_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "plugin/session.h"
#include "tests/plugin/tiny_session.h"
#include "tests/unit/control_job.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using Process = test::TinySessionProcess;

constexpr char kSecretEnv[] = "WSYNC_FIREWALL_TEST_SECRET";

Process MakeProcess(Role role, int32_t rank, int port, const std::string& job) {
  SessionConfig config = test::TinyJobConfig(role, rank, port, job, kSecretEnv);
  config.deadline = absl::Seconds(15);
  return test::MakeTinySessionProcess(config);
}

class ThreadFirewallTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv(kSecretEnv, "thread-firewall-test-secret-0123456789", 1); }
  void TearDown() override { ASSERT_TRUE(failpoint::SetForTesting("").ok()); }
};

// Connects the 2 + 2 job (processes as threads) and returns them.
std::vector<Process> ConnectedJob(const std::string& job,
                                  const std::function<void(std::vector<Process>&)>& before = {}) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kTrainer, r, port, job));
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kRollout, r, port, job));
  if (before) before(processes);
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) {
    threads.emplace_back([&, p] { EXPECT_TRUE(processes[p].session->Connect().ok()) << p; });
  }
  for (std::thread& thread : threads) thread.join();
  return processes;
}

// Version 1 on every process but `skipped` (the trainer-triggered rollout, which joins by
// itself; -1: none), the trainers filling it: each process's result (OK for `skipped`).
std::vector<absl::Status> SyncOfTheOthers(std::vector<Process>& processes, int skipped) {
  std::vector<absl::Status> results(processes.size());
  std::vector<std::thread> threads;
  for (int p = 0; p < static_cast<int>(processes.size()); ++p) {
    if (p == skipped) continue;
    threads.emplace_back([&, p] {
      Process& me = processes[p];
      if (me.part.role == Role::kTrainer) {
        results[p] = test::FillLogical(me.part, 1, me.memory.get());
      }
      if (results[p].ok()) results[p] = me.session->Sync(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

// SyncOfTheOthers, every one of which must fail, promptly (no hang).
void ExpectSyncOfTheOthersFails(std::vector<Process>& processes, int skipped) {
  const std::vector<absl::Status> results = SyncOfTheOthers(processes, skipped);
  for (int p = 0; p < static_cast<int>(processes.size()); ++p) {
    if (p == skipped) continue;
    EXPECT_FALSE(results[p].ok()) << p;
  }
}

TEST_F(ThreadFirewallTest, AnExceptionInTheSyncBeginThreadIsTheSessionsError) {
  std::vector<Process> processes = ConnectedJob("firewall-begin");
  ASSERT_TRUE(failpoint::SetForTesting("sync_thread:throw@1").ok());
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) {
    threads.emplace_back([&, p] {
      Process& me = processes[p];
      if (p < 2) results[p] = test::FillLogical(me.part, 1, me.memory.get());
      if (p != 0) {
        results[p] = me.session->Sync(1);
        return;
      }
      results[p] = me.session->SyncBegin(1);
      const absl::Time until = absl::Now() + absl::Seconds(30);
      std::optional<absl::Status> outcome;
      while (results[p].ok() && !(outcome = me.session->SyncTest()) && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      if (results[p].ok()) results[p] = outcome.value_or(absl::DeadlineExceededError("no outcome"));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(results[0].code(), absl::StatusCode::kInternal) << results[0];
  EXPECT_THAT(results[0].message(), HasSubstr("sync_begin thread: internal error: exception"));
  EXPECT_THAT(processes[0].session->LastError(), HasSubstr("failpoint 'sync_thread' threw"));
  EXPECT_EQ(processes[0].session->State().second, SessionState::kIdle);
  for (int p = 1; p < 4; ++p) EXPECT_FALSE(results[p].ok()) << p;  // Failed, not hung.
  EXPECT_NE(processes[2].session->State().first, 1);               // Version 1 never committed.
  // The session stays failed: the next sync returns an error, never runs half a job.
  EXPECT_FALSE(processes[0].session->Sync(2).ok());
  for (Process& process : processes) process.session->Finalize();
}

// An exception inside a host's own sync (after the session became SYNCING) is that sync's error:
// the session is IDLE (trainer) or DIRTY (rollout) again, never left SYNCING, and the others fail
// promptly. Before the firewall it left Session::Sync (and terminated this test).
TEST_F(ThreadFirewallTest, AnExceptionInAHostSyncLeavesNoSessionSyncing) {
  std::vector<Process> processes = ConnectedJob("firewall-sync");
  ASSERT_TRUE(failpoint::SetForTesting("sync_step:throw@1").ok());
  const std::vector<absl::Status> results = SyncOfTheOthers(processes, /*skipped=*/-1);
  int threw = 0;
  for (int p = 0; p < 4; ++p) {
    EXPECT_FALSE(results[p].ok()) << p;  // Failed, not hung.
    const SessionState state = processes[p].session->State().second;
    EXPECT_EQ(state, p < 2 ? SessionState::kIdle : SessionState::kDirty) << p;
    if (absl::StrContains(results[p].message(),
                          "wsync sync: internal error: exception: "
                          "failpoint 'sync_step' threw")) {
      ++threw;
      EXPECT_EQ(results[p].code(), absl::StatusCode::kInternal) << results[p];
    }
  }
  EXPECT_EQ(threw, 1);
  for (Process& process : processes) process.session->Finalize();
}

TEST_F(ThreadFirewallTest, AnExceptionInTheTrainerTriggeredLoopIsTheSessionsError) {
  std::atomic<int> after_calls{0};
  std::vector<Process> processes = ConnectedJob("firewall-loop", [&](std::vector<Process>& ps) {
    // Only rollout rank 0 is trainer-triggered; rank 1 joins syncs itself.
    ASSERT_TRUE(failpoint::SetForTesting("background_thread:throw@1").ok());
    ASSERT_TRUE(ps[2]
                    .session
                    ->SetUpdateCallbacks([](int64_t) {},
                                         [&](int64_t, const absl::Status&) { ++after_calls; })
                    .ok());
  });
  // The loop's first step threw as it started: the session holds the error, the process lives.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (processes[2].session->LastError().empty() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(processes[2].session->LastError(),
              HasSubstr("trainer-triggered thread: internal error: exception: failpoint "
                        "'background_thread' threw"));
  EXPECT_EQ(processes[2].session->State().second, SessionState::kDirty);
  // The others' sync fails promptly (that process was aborted), it does not hang.
  ExpectSyncOfTheOthersFails(processes, /*skipped=*/2);
  for (Process& process : processes) process.session->Finalize();
}

// An exception after before_update (here the engine's own callback) still tells the engine the
// outcome through after_update: it paused serving and must hear that the sync failed.
TEST_F(ThreadFirewallTest, AnExceptionMidStepStillCallsAfterUpdateWithTheError) {
  absl::Mutex mu;
  std::vector<std::pair<int64_t, absl::Status>> after_calls;
  std::vector<Process> processes = ConnectedJob("firewall-mid-step", [&](std::vector<Process>& ps) {
    ASSERT_TRUE(ps[2]
                    .session
                    ->SetUpdateCallbacks(
                        [](int64_t) { throw std::runtime_error("the engine could not pause"); },
                        [&](int64_t version, const absl::Status& status) {
                          absl::MutexLock lock(&mu);
                          after_calls.emplace_back(version, status);
                        })
                    .ok());
  });
  ExpectSyncOfTheOthersFails(processes, /*skipped=*/2);
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(after_calls.size(), 1u);
    EXPECT_EQ(after_calls[0].first, 1);
    EXPECT_THAT(after_calls[0].second.message(),
                HasSubstr("trainer-triggered thread: internal error: exception: the engine could "
                          "not pause"));
  }
  EXPECT_EQ(processes[2].session->State().second, SessionState::kDirty);
  for (Process& process : processes) process.session->Finalize();
}

TEST_F(ThreadFirewallTest, AnExceptionInTheHeartbeatThreadClosesTheConnectionWithIt) {
  std::vector<Process> processes = ConnectedJob("firewall-beat");
  // Every heartbeat thread's next turn throws: each closes its connection with the exception.
  ASSERT_TRUE(failpoint::SetForTesting("keepalive_thread:throw@1+").ok());
  absl::SleepFor(absl::Seconds(1));  // Several heartbeat intervals (250 ms).
  ASSERT_TRUE(test::FillLogical(processes[0].part, 1, processes[0].memory.get()).ok());
  const absl::Status status = processes[0].session->Sync(1);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("heartbeat thread: internal error: exception"));
  ASSERT_TRUE(failpoint::SetForTesting("").ok());
  for (Process& process : processes) process.session->Finalize();
}

TEST_F(ThreadFirewallTest, AnExceptionInTheCoordinatorThreadEndsServingNotTheProcess) {
  control_testing::Job job = control_testing::StartJob(2, 0, control_testing::Options(2, 0));
  ASSERT_TRUE(failpoint::SetForTesting("coordinator_thread:throw@1+").ok());
  // The serving thread's next turn throws: it stops serving (every connection closed), so the
  // clients' calls fail with a lost coordinator instead of this process terminating.
  const absl::Status status =
      job.clients[0]->AllGather("x", absl::Now() + absl::Seconds(10)).status();
  EXPECT_FALSE(status.ok());
  ASSERT_TRUE(failpoint::SetForTesting("").ok());
  job.clients.clear();
  job.coordinator->Stop();
}

TEST_F(ThreadFirewallTest, AnExceptionInTheLossWatchThreadReportsThePeersLostWithIt) {
  control_testing::Job job = control_testing::StartJob(2, 0, control_testing::Options(2, 0));
  absl::Mutex mu;
  std::vector<std::string> reported;
  ASSERT_TRUE(failpoint::SetForTesting("loss_watch_thread:throw@1").ok());
  {
    LossWatch watch(*job.clients[0], [&](int32_t process, const absl::Status& reason) {
      absl::MutexLock lock(&mu);
      reported.push_back(absl::StrCat(process, ": ", reason.message()));
    });
    const absl::Time until = absl::Now() + absl::Seconds(10);
    auto any = [&] {
      absl::MutexLock lock(&mu);
      return !reported.empty();
    };
    while (!any() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(failpoint::SetForTesting("").ok());
  absl::MutexLock lock(&mu);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_THAT(reported[0], HasSubstr("1: wsync loss watch thread: internal error: exception"));
}

}  // namespace
}  // namespace wsync
