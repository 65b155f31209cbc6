// Heartbeats of the control plane: a process that falls silent without closing its connection (a
// frozen or cut-off host) is lost like one whose connection closed, naming the silence; processes
// that are idle, or blocked in a call, for many silence limits are not (heartbeats cross
// collectives unnoticed); a client from before heartbeats is never timed out; and a coordinator
// that goes silent or away fails the call in flight and the LossWatch (every peer) long before the
// deadline, naming the coordinator. Time bounds are hang bounds with slack for a loaded machine.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "control/auth.h"
#include "control/channel_keys.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/framing.h"
#include "control/loss_watch.h"
#include "control/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_fake_coordinator.h"
#include "tests/unit/control_job.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Job;
using control_testing::kJob;
using control_testing::kSecret;
using control_testing::MakeHello;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::Raw;
using control_testing::ReadSkippingHeartbeats;
using control_testing::ServeUpToTheRoster;
using control_testing::StartJob;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kInterval = absl::Milliseconds(50);
constexpr absl::Duration kLimit = absl::Milliseconds(500);
// Detection may come this long after the silence limit on a loaded machine (a hang bound).
constexpr absl::Duration kSlack = absl::Milliseconds(2500);
constexpr absl::Duration kLongDeadline = absl::Seconds(30);

CoordinatorOptions FastOptions(int32_t trainers, int32_t rollouts) {
  CoordinatorOptions o = Options(trainers, rollouts);
  o.heartbeat_interval = kInterval;
  o.silence_limit = kLimit;
  return o;
}

std::unique_ptr<ControlClient> ConnectAndJoin(int port, ControlRole role, int32_t rank,
                                              bool heartbeats = true) {
  ControlClientOptions options = ClientOptions(port, role, rank);
  options.heartbeats = heartbeats;
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  JoinRequest request{role == ControlRole::kTrainer ? "trainer-manifest" : "rollout-manifest",
                      absl::StrCat("address-", rank), "metadata"};
  absl::StatusOr<Roster> roster = (*client)->Join(request, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(roster.ok()) << roster.status();
  return roster.ok() ? *std::move(client) : nullptr;
}

absl::Status Write(int fd, const control::Frame& frame) {
  FrameWriter writer;
  return WriteFrame(fd, writer, frame, kDefaultMaxFrameBytes, absl::Now() + absl::Seconds(5));
}

// What a LossWatch reported, in order, with the time of the first report.
struct Reports {
  void Record(int32_t process, const absl::Status& reason) {
    absl::MutexLock lock(&mu);
    if (processes.empty()) first_at = absl::Now();
    processes.push_back(process);
    reasons.push_back(reason);
  }
  bool WaitFor(size_t count) {
    absl::MutexLock lock(&mu);
    auto enough = [&] { return processes.size() >= count; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  absl::Mutex mu;
  std::vector<int32_t> processes;
  std::vector<absl::Status> reasons;
  absl::Time first_at;
};

// Rollout rank 0 (by hand) offers heartbeats, joins, and then sends nothing while keeping its
// connection open. The coordinator takes it as lost after the silence limit: the trainer blocked in
// a Barrier fails naming it and the silence, the other trainer's LossWatch reports it, and the
// silent process is told why (a Reject) should it wake up.
TEST(HeartbeatTest, AProcessThatFallsSilentIsLostAfterTheSilenceLimitNamingTheSilence) {
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Start(FastOptions(2, 1));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = (*coordinator)->port();
  Raw silent(port);
  absl::StatusOr<control::Frame> challenge = silent.Read();
  ASSERT_TRUE(challenge.ok() && challenge->has_challenge()) << challenge.status();
  ASSERT_TRUE(Write(silent.fd.get(), MakeHello(kSecret, challenge->challenge().nonce(),
                                               ControlRole::kRollout, 0, 0, /*heartbeats=*/true))
                  .ok());
  absl::StatusOr<control::Frame> welcome = silent.Read();
  ASSERT_TRUE(welcome.ok() && welcome->has_welcome()) << welcome.status();
  EXPECT_EQ(welcome->welcome().heartbeat_interval_ms(), absl::ToInt64Milliseconds(kInterval));
  EXPECT_EQ(welcome->welcome().silence_limit_ms(), absl::ToInt64Milliseconds(kLimit));

  ASSERT_TRUE(
      silent.SealAsClient(challenge->challenge().nonce(), welcome->welcome().process()).ok());
  control::Frame join;
  join.mutable_join()->set_manifest("rollout-manifest");
  ASSERT_TRUE(silent.Write(join).ok());
  const absl::Time last_sent = absl::Now();  // Nothing more comes from the silent process.
  std::vector<std::unique_ptr<ControlClient>> trainers(2);
  Parallel(2,
           [&](int rank) { trainers[rank] = ConnectAndJoin(port, ControlRole::kTrainer, rank); });
  absl::StatusOr<control::Frame> roster = ReadSkippingHeartbeats(silent.fd.get(), silent.reader);
  ASSERT_TRUE(roster.ok() && roster->has_roster()) << roster.status();
  ASSERT_NE(trainers[0], nullptr);
  ASSERT_NE(trainers[1], nullptr);

  Reports reports;
  absl::Status barrier;
  absl::Duration barrier_ended;
  {
    LossWatch watch(*trainers[0], [&](int32_t p, const absl::Status& s) { reports.Record(p, s); });
    barrier = trainers[1]->Barrier(absl::Now() + kLongDeadline);
    barrier_ended = absl::Now() - last_sent;
    ASSERT_TRUE(reports.WaitFor(1));
  }
  EXPECT_TRUE(absl::IsUnavailable(barrier)) << barrier;
  EXPECT_THAT(barrier.message(), HasSubstr("process 2 (rollout rank 0, node manual-node) left the "
                                           "job (silent for"));
  absl::MutexLock lock(&reports.mu);
  ASSERT_EQ(reports.processes.size(), 1u);
  EXPECT_EQ(reports.processes[0], 2);
  EXPECT_TRUE(absl::IsUnavailable(reports.reasons[0]));
  EXPECT_THAT(reports.reasons[0].message(),
              HasSubstr("process 2 (rollout rank 0, node manual-node) was lost: silent for"));
  const absl::Duration detected = reports.first_at - last_sent;
  std::printf(
      "silent process reported after %.3f s, the blocked Barrier failed after %.3f s "
      "(silence limit %.3f s)\n",
      absl::ToDoubleSeconds(detected), absl::ToDoubleSeconds(barrier_ended),
      absl::ToDoubleSeconds(kLimit));
  EXPECT_GE(detected, kLimit - absl::Milliseconds(50));
  EXPECT_LT(detected, kLimit + kSlack);
  EXPECT_LT(barrier_ended, kLimit + kSlack);
  const CoordinatorCounters counters = (*coordinator)->counters();
  EXPECT_EQ(counters.silent, 1);
  EXPECT_EQ(counters.lost, 1);
  // Should it wake up, it learns why instead of talking on as if it were in the job.
  absl::StatusOr<control::Frame> closed = ReadSkippingHeartbeats(silent.fd.get(), silent.reader);
  ASSERT_TRUE(closed.ok() && closed->has_reject()) << closed.status();
  EXPECT_EQ(closed->reject().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(closed->reject().reason(), HasSubstr("nothing arrived from this process for"));
}

// No false positives: processes idle (no calls at all) for five silence limits, and processes
// blocked in a collective for two while one of them arrives late, stay in the job; heartbeats
// cross the rounds both ways without disturbing them (every result is complete and correct).
TEST(HeartbeatTest, ProcessesIdleOrBlockedForManySilenceLimitsStayInTheJob) {
  Job job = StartJob(2, 1, FastOptions(2, 1));
  absl::SleepFor(5 * kLimit);
  for (int id = 0; id < 3; ++id) EXPECT_EQ(job.clients[id]->loss_count(), 0u) << id;
  for (int late = 0; late < 3; ++late) {
    Parallel(3, [&](int id) {
      if (id == late) absl::SleepFor(2 * kLimit);
      absl::StatusOr<std::vector<std::string>> all = job.clients[id]->AllGather(
          absl::StrCat("p", id, "r", late), absl::Now() + absl::Seconds(20));
      ASSERT_TRUE(all.ok()) << "process " << id << ": " << all.status();
      EXPECT_THAT(*all, ElementsAre(absl::StrCat("p0r", late), absl::StrCat("p1r", late),
                                    absl::StrCat("p2r", late)));
    });
  }
  const CoordinatorCounters counters = job.coordinator->counters();
  EXPECT_EQ(counters.silent, 0);
  EXPECT_EQ(counters.lost, 0);
  EXPECT_EQ(counters.rounds_completed, 3);
  EXPECT_EQ(counters.rounds_failed, 0);
}

// The child of the stall test: a job of two trainers and a rollout with heartbeats, all in this
// process. Writes a byte to `ready_fd` once joined, waits for a byte on `go_fd` (the parent stops
// and continues this process in between), gives the watchers a few silence limits to misjudge the
// stall, then checks that nobody was taken as lost. Returns the exit status (0: nobody was).
int RunJobThroughAStall(int ready_fd, int go_fd) {
  Job job = StartJob(2, 1, FastOptions(2, 1));
  char byte = 'r';
  if (write(ready_fd, &byte, 1) != 1 || read(go_fd, &byte, 1) != 1) return 2;
  absl::SleepFor(3 * kLimit);
  int failures = 0;
  for (int id = 0; id < 3; ++id) {
    if (job.clients[id]->loss_count() != 0) {
      std::fprintf(stderr, "process %d recorded %zu losses\n", id, job.clients[id]->loss_count());
      ++failures;
    }
  }
  std::vector<absl::Status> barriers(3);
  Parallel(3,
           [&](int id) { barriers[id] = job.clients[id]->Barrier(absl::Now() + kLongDeadline); });
  for (int id = 0; id < 3; ++id) {
    if (!barriers[id].ok()) {
      std::fprintf(stderr, "process %d: %s\n", id, barriers[id].ToString().c_str());
      ++failures;
    }
  }
  const CoordinatorCounters counters = job.coordinator->counters();
  if (counters.silent != 0 || counters.lost != 0) {
    std::fprintf(stderr, "the coordinator took %lld as silent, %lld as lost\n",
                 static_cast<long long>(counters.silent), static_cast<long long>(counters.lost));
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}

// A stall of the whole job (coordinator and clients in one process, stopped with SIGSTOP for four
// silence limits, as an overloaded machine or a paused VM stalls them) is not silence: when the
// process continues, every watcher has waited past its silence limit, but none of them heard
// nothing while it was there to hear, so nobody is lost and the next Barrier completes.
TEST(HeartbeatTest, AStallOfTheWholeJobIsNotTakenForSilence) {
  int ready[2];
  int go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(RunJobThroughAStall(ready[1], go[0]));
  close(ready[1]);
  close(go[0]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  absl::SleepFor(4 * kLimit);
  ASSERT_EQ(kill(child, SIGCONT), 0);
  ASSERT_EQ(write(go[1], &byte, 1), 1);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  close(ready[0]);
  close(go[1]);
}

// A client from before heartbeats (it does not offer them) gets none and is never timed out.
TEST(HeartbeatTest, AClientWithoutHeartbeatsIsNeverTimedOut) {
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Start(FastOptions(1, 1));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<std::unique_ptr<ControlClient>> clients(2);
  Parallel(2, [&](int id) {
    clients[id] = ConnectAndJoin((*coordinator)->port(),
                                 id == 0 ? ControlRole::kTrainer : ControlRole::kRollout, 0,
                                 /*heartbeats=*/id == 0);
  });
  ASSERT_NE(clients[0], nullptr);
  ASSERT_NE(clients[1], nullptr);
  absl::SleepFor(3 * kLimit);
  Parallel(2, [&](int id) {
    EXPECT_TRUE(clients[id]->Barrier(absl::Now() + absl::Seconds(10)).ok()) << id;
  });
  EXPECT_EQ((*coordinator)->counters().lost, 0);
}

// A coordinator (by hand) that completes the rendezvous and then sends nothing more while keeping
// the connection open (a frozen host). The client's Barrier, in flight with a 30 s deadline, fails
// after the silence limit naming the coordinator, the LossWatch reports the only other process
// with that error, later calls fail the same way, and the client kept heartbeating while blocked.
TEST(HeartbeatTest, ASilentCoordinatorFailsTheCallInFlightAndTheWatchNamingIt) {
  constexpr absl::Duration kCoordinatorLimit = absl::Milliseconds(400);
  int port = 0;
  absl::StatusOr<UniqueFd> listener = ListenTcp("127.0.0.1", 0, false, &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::atomic<int> heartbeats{0};
  std::thread fake([&] {
    FrameReader reader(kDefaultMaxFrameBytes);
    UniqueFd c;
    ServeUpToTheRoster(listener->get(), kInterval, kCoordinatorLimit, &c, &reader);
    if (!c.valid()) return;
    // Silent from here on; reads until the client gives up on it and closes.
    for (;;) {
      absl::StatusOr<control::Frame> got = ReadFrame(c.get(), reader, absl::Now() + kLongDeadline);
      if (!got.ok()) break;
      if (got->has_heartbeat()) heartbeats.fetch_add(1);
    }
  });
  ControlClientOptions options = ClientOptions(port, ControlRole::kTrainer, 0);
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Join(JoinRequest{}, absl::Now() + absl::Seconds(5)).ok());
  const absl::Time silent_from = absl::Now();  // The roster was the coordinator's last frame.
  Reports reports;
  absl::Status barrier;
  absl::Duration failed_after;
  {
    LossWatch watch(**client, [&](int32_t p, const absl::Status& s) { reports.Record(p, s); });
    barrier = (*client)->Barrier(absl::Now() + kLongDeadline);
    failed_after = absl::Now() - silent_from;
    ASSERT_TRUE(reports.WaitFor(1));
  }
  fake.join();
  std::printf(
      "the call in flight failed %.3f s after the coordinator fell silent (silence limit "
      "%.3f s)\n",
      absl::ToDoubleSeconds(failed_after), absl::ToDoubleSeconds(kCoordinatorLimit));
  EXPECT_TRUE(absl::IsUnavailable(barrier)) << barrier;
  EXPECT_THAT(barrier.message(), HasSubstr("lost the coordinator: nothing arrived from it for"));
  EXPECT_GE(failed_after, kCoordinatorLimit - absl::Milliseconds(50));
  EXPECT_LT(failed_after, kCoordinatorLimit + kSlack);
  {
    absl::MutexLock lock(&reports.mu);
    EXPECT_THAT(reports.processes, ElementsAre(1));
    EXPECT_TRUE(absl::IsUnavailable(reports.reasons[0])) << reports.reasons[0];
    EXPECT_THAT(reports.reasons[0].message(), HasSubstr("lost the coordinator"));
  }
  // It heartbeated all along, the blocked Barrier included (about limit / interval of them).
  EXPECT_GE(heartbeats.load(), 3);
  absl::Status later = (*client)->Barrier(absl::Now() + kLongDeadline);
  EXPECT_TRUE(absl::IsUnavailable(later)) << later;
  EXPECT_THAT(later.message(), HasSubstr("lost the coordinator"));
}

// A coordinator (by hand) that dies with the connection reset (SO_LINGER 0) after the roster: the
// next call fails naming the coordinator, whether the reset shows first on its write (usual on
// loopback: the reset has arrived before the call) or on its read. No heartbeats, so that only the
// call touches the connection.
TEST(HeartbeatTest, ACoordinatorThatResetsTheConnectionFailsTheNextCallNamingIt) {
  int port = 0;
  absl::StatusOr<UniqueFd> listener = ListenTcp("127.0.0.1", 0, false, &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::Notification reset;
  std::thread fake([&] {
    FrameReader reader(kDefaultMaxFrameBytes);
    UniqueFd c;
    ServeUpToTheRoster(listener->get(), kInterval, kLimit, &c, &reader);
    if (c.valid()) {
      const linger abort_on_close{1, 0};
      EXPECT_EQ(setsockopt(c.get(), SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close)),
                0);
      c.Reset();
    }
    reset.Notify();
  });
  ControlClientOptions options = ClientOptions(port, ControlRole::kTrainer, 0);
  options.heartbeats = false;
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Join(JoinRequest{}, absl::Now() + absl::Seconds(5)).ok());
  reset.WaitForNotification();
  fake.join();
  for (int call = 0; call < 2; ++call) {  // The later call fails the same way.
    const absl::Status barrier = (*client)->Barrier(absl::Now() + kLongDeadline);
    EXPECT_TRUE(absl::IsUnavailable(barrier)) << barrier;
    EXPECT_THAT(std::string(barrier.message()),
                HasSubstr("Barrier #0: lost the coordinator: connection lost ("));
  }
}

// A coordinator that goes away (stopped here; killed, its connections close the same way) while
// a process moves data with only its LossWatch reading the control connection: the watch reports
// every other process at once with an error naming the coordinator, and later calls fail at once.
TEST(HeartbeatTest, ACoordinatorThatGoesAwayFailsTheWatchWithEveryPeerAtOnce) {
  Job job = StartJob(1, 2, Options(1, 2));
  Reports reports;
  absl::Time stopped;
  {
    LossWatch watch(*job.clients[0],
                    [&](int32_t p, const absl::Status& s) { reports.Record(p, s); });
    stopped = absl::Now();
    job.coordinator->Stop();
    ASSERT_TRUE(reports.WaitFor(2));
  }
  absl::MutexLock lock(&reports.mu);
  std::printf("the watch reported every peer %.3f s after the coordinator stopped\n",
              absl::ToDoubleSeconds(reports.first_at - stopped));
  EXPECT_LT(reports.first_at - stopped, absl::Seconds(3));
  EXPECT_THAT(reports.processes, UnorderedElementsAre(1, 2));
  for (const absl::Status& reason : reports.reasons) {
    EXPECT_TRUE(absl::IsUnavailable(reason)) << reason;
    EXPECT_TRUE(IsCoordinatorLoss(reason)) << reason;
    EXPECT_THAT(reason.message(),
                HasSubstr("this process lost its connection to the coordinator: control:"));
  }
  const absl::Time call = absl::Now();
  absl::Status barrier = job.clients[0]->Barrier(absl::Now() + kLongDeadline);
  EXPECT_TRUE(absl::IsUnavailable(barrier)) << barrier;
  EXPECT_LT(absl::Now() - call, absl::Seconds(1));
}

TEST(HeartbeatTest, OptionsRefuseASilenceLimitBelowTwoIntervals) {
  CoordinatorOptions o = FastOptions(1, 1);
  o.silence_limit = kInterval;
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(o).status()));
  o.heartbeat_interval = -kInterval;
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(o).status()));
  o.heartbeat_interval = absl::ZeroDuration();  // No heartbeats: no silence limit either.
  EXPECT_TRUE(Coordinator::Start(o).ok());
}

}  // namespace
}  // namespace wsync
