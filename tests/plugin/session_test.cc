// The session behind the C ABI, driven from C++ with every process as a thread: both sync modes
// (engine RPC and trainer-triggered), wrong-state calls and error kinds.

#include "plugin/session.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/fill/fill.h"
#include "planner/layout_parts.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "tests/plugin/tiny_session.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;

using Process = test::TinySessionProcess;

Process MakeProcess(Role role, int32_t rank, int port, const std::string& job) {
  SessionConfig config = test::TinyJobConfig(role, rank, port, job, "WSYNC_SESSION_TEST_SECRET");
  config.deadline = absl::Seconds(20);
  return test::MakeTinySessionProcess(config);
}

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("WSYNC_SESSION_TEST_SECRET", "session-test-secret-0123456789abcdef", 1);
  }
};

TEST_F(SessionTest, EngineRpcModeSyncsThreeVersionsExactly) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kTrainer, r, port, "rpc"));
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kRollout, r, port, "rpc"));
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) {
    threads.emplace_back([&, p] {
      Process& me = processes[p];
      results[p] = me.session->Connect();
      for (int64_t v = 1; v <= 3 && results[p].ok(); ++v) {
        if (p < 2) results[p] = test::FillLogical(me.part, v, me.memory.get());
        if (results[p].ok()) results[p] = me.session->Sync(v);
        if (results[p].ok() && p >= 2) results[p] = test::CheckLogical(me.part, *me.memory, v);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int p = 0; p < 4; ++p) {
    EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
    const auto [version, state] = processes[p].session->State();
    EXPECT_EQ(version, 3);
    EXPECT_EQ(state, SessionState::kIdle);
  }
  EXPECT_GT(processes[2].session->LastStats().stats.received_bytes, 0);
  absl::StatusOr<std::string> report = processes[2].session->ScheduleReport();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr("process 2 (rollout rank 0)"));
}

// Rollout rank 1 dies after version 1 (its session is finalized, so the coordinator loses it);
// the next sync fails on the others at once, naming it. A replacement session of the same rank
// and layout connects to the running job, starts with no version (not consistent), and the very
// next sync brings it to the current version: every element it holds is then version 3's.
TEST_F(SessionTest, AReplacementProcessJoinsTheRunningJobAndIsBroughtToTheCurrentVersion) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kTrainer, r, port, "replace"));
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kRollout, r, port, "replace"));
  auto on = [&](const std::vector<int>& ids, const std::function<absl::Status(int)>& call) {
    return test::OnEachProcess(processes.size(), ids, call);
  };
  auto sync = [&](int64_t v) {
    return [&, v](int p) { return test::SyncAndCheckTinyJob(processes[p], p, v); };
  };
  for (const absl::Status& s :
       on({0, 1, 2, 3}, [&](int p) { return processes[p].session->Connect(); })) {
    ASSERT_TRUE(s.ok()) << s;
  }
  for (const absl::Status& s : on({0, 1, 2, 3}, sync(1))) ASSERT_TRUE(s.ok()) << s;

  processes[3].session->Finalize();
  const absl::Time lost_at = absl::Now();
  std::vector<absl::Status> failed = on({0, 1, 2}, sync(2));
  for (int p : {0, 1, 2}) {
    EXPECT_TRUE(absl::IsUnavailable(failed[p])) << p << ": " << failed[p];
    EXPECT_THAT(failed[p].message(), HasSubstr("process 3 (rollout rank 1"));
  }
  EXPECT_LT(absl::Now() - lost_at, absl::Seconds(5));

  processes[3] = MakeProcess(Role::kRollout, 1, port, "replace");
  ASSERT_TRUE(processes[3].session->Connect().ok()) << processes[3].session->LastError();
  EXPECT_EQ(processes[3].session->State(), std::make_pair(int64_t{-1}, SessionState::kIdle))
      << "a replacement must not report a version before a sync brought it there";
  for (const absl::Status& s : on({0, 1, 2, 3}, sync(3))) EXPECT_TRUE(s.ok()) << s;
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(processes[p].session->State(), std::make_pair(int64_t{3}, SessionState::kIdle)) << p;
  }
}

// The hosting trainer's heartbeat settings reach its coordinator, which announces them to every
// process in its Welcome; the others' own settings are not used.
TEST_F(SessionTest, TheHostingSessionsHeartbeatSettingsReachTheCoordinator) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (const Role role : {Role::kTrainer, Role::kRollout}) {
    for (int r = 0; r < 2; ++r) {
      SessionConfig config =
          test::TinyJobConfig(role, r, port, "heartbeats", "WSYNC_SESSION_TEST_SECRET");
      config.deadline = absl::Seconds(20);
      config.heartbeat_interval = processes.empty() ? absl::Milliseconds(40) : absl::Seconds(1);
      config.silence_limit = processes.empty() ? absl::Milliseconds(1500) : absl::Seconds(9);
      processes.push_back(test::MakeTinySessionProcess(config));
    }
  }
  EXPECT_EQ(processes[0].session->CoordinatorHeartbeats(),
            std::make_pair(absl::ZeroDuration(), absl::ZeroDuration()));
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) {
    threads.emplace_back([&, p] { results[p] = processes[p].session->Connect(); });
  }
  for (std::thread& thread : threads) thread.join();
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(results[p].ok()) << p << ": " << results[p];
    EXPECT_EQ(processes[p].session->CoordinatorHeartbeats(),
              std::make_pair(absl::Milliseconds(40), absl::Milliseconds(1500)))
        << p;
  }
}

TEST_F(SessionTest, TrainerTriggeredModeCallsTheCallbacksAroundEverySync) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kTrainer, r, port, "bg"));
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kRollout, r, port, "bg"));
  absl::Mutex mu;
  std::vector<std::string> events;
  for (int p = 2; p < 4; ++p) {
    Process* me = &processes[p];
    ASSERT_TRUE(me->session
                    ->SetUpdateCallbacks(
                        [&, p](int64_t v) {
                          absl::MutexLock lock(&mu);
                          events.push_back(absl::StrCat(p, " before ", v));
                        },
                        [&, p, me](int64_t v, const absl::Status& status) {
                          absl::Status checked =
                              status.ok() ? test::CheckLogical(me->part, *me->memory, v) : status;
                          absl::MutexLock lock(&mu);
                          events.push_back(absl::StrCat(p, " after ", v, " ", checked.ToString()));
                        })
                    .ok());
  }
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) {
    threads.emplace_back([&, p] {
      Process& me = processes[p];
      results[p] = me.session->Connect();
      if (p >= 2) return;  // Rollouts: the background thread joins every sync.
      for (int64_t v = 1; v <= 3 && results[p].ok(); ++v) {
        results[p] = test::FillLogical(me.part, v, me.memory.get());
        if (results[p].ok()) results[p] = me.session->Sync(v);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int p = 0; p < 4; ++p) EXPECT_TRUE(results[p].ok()) << p << ": " << results[p];
  // Every sync committed on the trainers; wait (bounded) for the rollouts' after_update calls.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&mu);
      if (events.size() >= 12) break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::MutexLock lock(&mu);
  for (int p = 2; p < 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      EXPECT_THAT(events, ::testing::Contains(absl::StrCat(p, " before ", v)));
      EXPECT_THAT(events, ::testing::Contains(absl::StrCat(p, " after ", v, " OK")));
    }
  }
  EXPECT_EQ(processes[2].session->State().first, 3);
  EXPECT_EQ(processes[2].session->Sync(4).code(), absl::StatusCode::kFailedPrecondition);
}

// Trainer-triggered rollouts survive a lost peer: rollout 1 dies after version 1, the trainers'
// sync 2 fails naming it, and rollout 0's background thread, instead of ending, waits (taking part
// in no collective) until a replacement joined; the trainers' sync 3 then commits on all four, the
// replacement also trainer-triggered, and both rollouts hold version 3's elements.
TEST_F(SessionTest, TrainerTriggeredRolloutsOutliveALostPeerAndMeetItsReplacement) {
  const int port = test::FreeLoopbackPort();
  std::vector<Process> processes;
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kTrainer, r, port, "bg-loss"));
  for (int r = 0; r < 2; ++r) processes.push_back(MakeProcess(Role::kRollout, r, port, "bg-loss"));
  absl::Mutex mu;
  std::map<int, std::vector<std::pair<int64_t, absl::Status>>> after;  // Per rollout.
  auto callbacks = [&](int p) {
    Process* me = &processes[p];
    return me->session->SetUpdateCallbacks(
        [](int64_t) {},
        [&, p, me](int64_t v, const absl::Status& status) {
          absl::Status checked =
              status.ok() ? test::CheckLogical(me->part, *me->memory, v) : status;
          absl::MutexLock lock(&mu);
          after[p].emplace_back(v, checked);
        });
  };
  // Waits (bounded) until rollout `p` reported version `v`; its outcome.
  auto reported = [&](int p, int64_t v) -> absl::Status {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      {
        absl::MutexLock lock(&mu);
        for (const auto& [version, status] : after[p]) {
          if (version == v) return status;
        }
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(absl::StrCat("rollout ", p, " never reported ", v));
  };
  for (int p = 2; p < 4; ++p) ASSERT_TRUE(callbacks(p).ok());
  auto trainers_sync = [&](int64_t v) {
    std::vector<absl::Status> results(2);
    std::vector<std::thread> threads;
    for (int p = 0; p < 2; ++p) {
      threads.emplace_back([&, p] {
        results[p] = test::FillLogical(processes[p].part, v, processes[p].memory.get());
        if (results[p].ok()) results[p] = processes[p].session->Sync(v);
      });
    }
    for (std::thread& thread : threads) thread.join();
    return results;
  };
  {
    std::vector<absl::Status> connected(4);
    std::vector<std::thread> threads;
    for (int p = 0; p < 4; ++p) {
      threads.emplace_back([&, p] { connected[p] = processes[p].session->Connect(); });
    }
    for (std::thread& thread : threads) thread.join();
    for (int p = 0; p < 4; ++p) ASSERT_TRUE(connected[p].ok()) << p << ": " << connected[p];
  }
  for (const absl::Status& s : trainers_sync(1)) ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(reported(2, 1).ok());

  processes[3].session->Finalize();
  for (const absl::Status& s : trainers_sync(2)) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("process 3 (rollout rank 1"));
  }
  {
    absl::MutexLock lock(&mu);  // A failed trigger reaches no callback; a failed sync reports it.
    for (const auto& [version, status] : after[2]) EXPECT_TRUE(version != 2 || !status.ok());
  }

  processes[3] = MakeProcess(Role::kRollout, 1, port, "bg-loss");
  ASSERT_TRUE(callbacks(3).ok());
  ASSERT_TRUE(processes[3].session->Connect().ok()) << processes[3].session->LastError();
  for (const absl::Status& s : trainers_sync(3)) EXPECT_TRUE(s.ok()) << s;
  for (int p : {2, 3}) {
    EXPECT_TRUE(reported(p, 3).ok()) << p << ": " << reported(p, 3);
    EXPECT_EQ(processes[p].session->State(), std::make_pair(int64_t{3}, SessionState::kIdle)) << p;
  }
}

TEST_F(SessionTest, WrongStateCallsAreRefusedWithTheirKind) {
  Process trainer = MakeProcess(Role::kTrainer, 1, 1, "state");
  absl::Status status = trainer.session->Sync(1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not allowed in state registered"));
  EXPECT_EQ(ErrorKind(status), std::string(kErrorWrongState));
  EXPECT_FALSE(trainer.session->ScheduleReport().ok());
  EXPECT_THAT(std::string(trainer.session->DeclareParameter("x", DType::kFloat32, {2}).message()),
              ::testing::IsEmpty());
  EXPECT_THAT(std::string(trainer.session->DeclareParameter("x", DType::kFloat32, {2}).message()),
              HasSubstr("declared twice"));
  trainer.session->Finalize();
  EXPECT_EQ(trainer.session->State().second, SessionState::kFinalized);
  EXPECT_EQ(ErrorKind(trainer.session->Connect()), std::string(kErrorWrongState));
}

// A 1-trainer job's configuration whose secret is in WSYNC_SESSION_TEST_SECRET; never connected.
SessionConfig UnconnectedConfig() {
  SessionConfig config;
  config.num_trainers = 1;
  config.job_id = "j";
  config.coordinator_port = 1;
  config.secret = SecretSource::Environment("WSYNC_SESSION_TEST_SECRET");
  return config;
}

// The secret's variable is removed from the environment once read: a child started later does
// not inherit it, and a second read finds nothing. A secret given by value works without one.
TEST_F(SessionTest, TheSecretVariableIsRemovedOnceReadAndASecretByValueIsUsed) {
  SessionConfig config = UnconnectedConfig();
  ASSERT_TRUE(Session::Create(config).ok());
  EXPECT_EQ(std::getenv("WSYNC_SESSION_TEST_SECRET"), nullptr);
  EXPECT_EQ(std::system("exit ${WSYNC_SESSION_TEST_SECRET:+1}"), 0) << "a child inherited it";
  EXPECT_EQ(Session::Create(config).status().code(), absl::StatusCode::kNotFound);
  config.secret = SecretSource::Value("session-test-secret-0123456789abcdef");
  absl::StatusOr<std::unique_ptr<Session>> by_value = Session::Create(config);
  ASSERT_TRUE(by_value.ok()) << by_value.status();
  config.secret = SecretSource::Value("short");
  EXPECT_EQ(Session::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionTest, CreateRefusesBadConfigurations) {
  const SessionConfig config = UnconnectedConfig();
  SessionConfig bad = config;
  bad.rank = 1;
  EXPECT_THAT(std::string(Session::Create(bad).status().message()),
              HasSubstr("trainer rank 1 is outside [0, 1)"));
  bad = config;
  bad.job_id = "";
  EXPECT_THAT(std::string(Session::Create(bad).status().message()), HasSubstr("job id"));
  bad = config;
  bad.role = Role::kRollout;
  bad.host_coordinator = true;
  bad.num_rollouts = 1;
  EXPECT_THAT(std::string(Session::Create(bad).status().message()),
              HasSubstr("only trainer rank 0 may host"));
  bad = config;
  bad.silence_limit = absl::Milliseconds(400);  // Below twice the default interval (250 ms).
  EXPECT_THAT(std::string(Session::Create(bad).status().message()),
              HasSubstr("the silence limit at least twice it"));
  bad = config;
  bad.heartbeat_interval = absl::Microseconds(100);
  EXPECT_EQ(Session::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = config;
  bad.heartbeat_interval = -absl::Seconds(1);
  EXPECT_EQ(Session::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = config;
  bad.secret = SecretSource::Environment("WSYNC_SESSION_TEST_NO_SUCH_VARIABLE");
  EXPECT_EQ(Session::Create(bad).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Session::Create(config).ok());
}

}  // namespace
}  // namespace wsync
