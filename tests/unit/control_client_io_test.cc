// The control client's one owner of its socket (client.h: the I/O thread): calls from many
// threads at once each get their own reply; a coordinator that falls silent, or closes the
// connection, while calls wait fails every one of them with the loss error naming the coordinator
// within the bound; a call after the loss fails at once; destruction with calls waiting fails them
// and returns. Time bounds are hang bounds with slack for a loaded (or instrumented) machine.

#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/framing.h"
#include "control/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_fake_coordinator.h"
#include "tests/unit/control_job.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Job;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::ServeUpToTheRoster;
using control_testing::StartJob;
using ::testing::HasSubstr;

constexpr absl::Duration kInterval = absl::Milliseconds(50);
constexpr absl::Duration kLimit = absl::Milliseconds(400);
constexpr absl::Duration kSlack = absl::Milliseconds(2500);
constexpr absl::Duration kLongDeadline = absl::Seconds(30);
// "At once": far below every deadline of the calls it bounds.
constexpr absl::Duration kAtOnce = absl::Seconds(1);

// Each process runs kThreads threads at once, each kRounds AllGathers of a payload naming the
// process, the thread and the round; another thread waits in WatchLosses and reads the losses and
// roster updates meanwhile. Round k is the k-th AllGather each process queued, whichever thread
// queued it, so: every call's result holds its own payload at its own index, every payload of
// every process appears in exactly one round, and every process sees the same rounds.
TEST(ControlClientIoTest, CallsFromManyThreadsAtOnceEachGetTheirOwnReply) {
  constexpr int kProcesses = 3;
  constexpr int kThreads = 8;
  constexpr int kRounds = 6;
  CoordinatorOptions options = Options(2, 1);
  options.max_rounds_ahead = 2 * kThreads;  // A process may run ahead by all its threads' calls.
  Job job = StartJob(2, 1, options);
  ASSERT_EQ(job.clients.size(), static_cast<size_t>(kProcesses));
  absl::Mutex mu;
  std::vector<std::multiset<std::vector<std::string>>> results(kProcesses);
  std::atomic<bool> done{false};
  std::vector<std::thread> watchers;
  for (int p = 0; p < kProcesses; ++p) {
    watchers.emplace_back([&, p] {
      ControlClient& client = *job.clients[p];
      while (!done.load()) {
        EXPECT_TRUE(client.WatchLosses(absl::Now() + absl::Milliseconds(5), -1).ok());
        EXPECT_EQ(client.loss_count(), 0u);
        EXPECT_FALSE(client.HasRosterUpdate());
      }
    });
  }
  Parallel(kProcesses * kThreads, [&](int i) {
    const int p = i / kThreads;
    const int thread = i % kThreads;
    for (int round = 0; round < kRounds; ++round) {
      const std::string mine = absl::StrCat("p", p, "t", thread, "r", round);
      absl::StatusOr<std::vector<std::string>> all =
          job.clients[p]->AllGather(mine, absl::Now() + kLongDeadline);
      ASSERT_TRUE(all.ok()) << mine << ": " << all.status();
      ASSERT_EQ(all->size(), static_cast<size_t>(kProcesses));
      EXPECT_EQ((*all)[p], mine) << "a reply routed to the wrong call";
      absl::MutexLock lock(&mu);
      results[p].insert(*std::move(all));
    }
  });
  done.store(true);
  for (std::thread& watcher : watchers) watcher.join();
  for (int p = 0; p < kProcesses; ++p) {
    EXPECT_EQ(results[p].size(), static_cast<size_t>(kThreads * kRounds));
    EXPECT_EQ(results[p], results[0]) << "process " << p << " saw other rounds";
  }
  for (int p = 0; p < kProcesses; ++p) {
    std::multiset<std::string> payloads;
    for (const std::vector<std::string>& round : results[0]) payloads.insert(round[p]);
    std::multiset<std::string> expected;
    for (int thread = 0; thread < kThreads; ++thread) {
      for (int round = 0; round < kRounds; ++round) {
        expected.insert(absl::StrCat("p", p, "t", thread, "r", round));
      }
    }
    EXPECT_EQ(payloads, expected) << "process " << p;
  }
  const CoordinatorCounters counters = job.coordinator->counters();
  EXPECT_EQ(counters.rounds_completed, kThreads * kRounds);
  EXPECT_EQ(counters.rounds_failed, 0);
}

// A coordinator by hand for trainer 0 of a job of one trainer and one rollout (the rollout never
// connects): serves up to the roster, then reads what the client sends without answering, until
// `contributions` contributions arrived, and then either goes silent (keeps the connection open,
// reads until the client closes it) or closes the connection.
class FakeCoordinator {
 public:
  enum class End { kSilent, kClose };

  FakeCoordinator(int contributions, End end) {
    absl::StatusOr<UniqueFd> listener = ListenTcp("127.0.0.1", 0, false, &port_);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    thread_ = std::thread([this, contributions, end] { Serve(contributions, end); });
  }
  ~FakeCoordinator() { thread_.join(); }

  int port() const { return port_; }
  // When the coordinator stopped answering for good (silent or closed); InfinitePast before.
  absl::Time ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }

 private:
  void Serve(int contributions, End end) {
    FrameReader reader(kDefaultMaxFrameBytes);
    UniqueFd c;
    ServeUpToTheRoster(listener_.get(), kInterval, kLimit, &c, &reader);
    if (!c.valid()) return;
    int seen = 0;
    while (seen < contributions) {
      absl::StatusOr<control::Frame> got = ReadFrame(c.get(), reader, absl::Now() + kLongDeadline);
      if (!got.ok()) return;
      if (got->has_contribute()) ++seen;
    }
    {
      absl::MutexLock lock(&mu_);
      ended_ = absl::Now();
    }
    if (end == End::kClose) return;  // `c` closes.
    while (ReadFrame(c.get(), reader, absl::Now() + kLongDeadline).ok()) {
    }
  }

  int port_ = 0;
  UniqueFd listener_;
  absl::Mutex mu_;
  absl::Time ended_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

std::unique_ptr<ControlClient> ConnectAndJoin(int port, bool heartbeats) {
  ControlClientOptions options = ClientOptions(port, ControlRole::kTrainer, 0);
  options.heartbeats = heartbeats;
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  absl::StatusOr<Roster> roster = (*client)->Join(JoinRequest{}, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(roster.ok()) << roster.status();
  return roster.ok() ? *std::move(client) : nullptr;
}

// Calls of four kinds from four threads at once, each with kLongDeadline; returns their errors
// (in thread order) and, in `*last`, when the last one returned.
std::vector<absl::Status> FourWaitingCalls(ControlClient& client, absl::Time* last) {
  std::vector<absl::Status> errors(4);
  std::vector<absl::Time> returned(4);
  Parallel(4, [&](int i) {
    const absl::Time deadline = absl::Now() + kLongDeadline;
    switch (i) {
      case 0:
        errors[i] = client.Barrier(deadline);
        break;
      case 1:
        errors[i] = client.AllGather("x", deadline).status();
        break;
      case 2:
        errors[i] = client.Broadcast(0, "y", deadline).status();
        break;
      default:
        errors[i] = client.Decide(true, "", deadline);
        break;
    }
    returned[i] = absl::Now();
  });
  *last = *std::max_element(returned.begin(), returned.end());
  return errors;
}

// The number N in "#N: " of a call's error, -1 when there is none.
int CallNumber(const absl::Status& status) {
  const std::string message(status.message());
  const size_t hash = message.find(" #");
  if (hash == std::string::npos) return -1;
  const size_t colon = message.find(':', hash);
  int number = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(message.substr(hash + 2, colon - hash - 2), &number)) {
    return -1;
  }
  return number;
}

// The coordinator goes silent (connection open) while four calls wait: every one fails with
// Unavailable naming the lost coordinator and its silence, at the silence limit (not at the 30 s
// deadline); a later call, and WatchLosses, fail at once the same way.
TEST(ControlClientIoTest, ASilentCoordinatorFailsEveryWaitingCallAndEveryLaterOne) {
  FakeCoordinator fake(4, FakeCoordinator::End::kSilent);
  std::unique_ptr<ControlClient> client = ConnectAndJoin(fake.port(), /*heartbeats=*/true);
  ASSERT_NE(client, nullptr);
  const absl::Time silent_from = absl::Now();  // The roster was the coordinator's last frame.
  absl::Time last;
  const std::vector<absl::Status> errors = FourWaitingCalls(*client, &last);
  const absl::Duration last_after = last - silent_from;
  for (const absl::Status& error : errors) {
    EXPECT_TRUE(absl::IsUnavailable(error)) << error;
    EXPECT_THAT(error.message(), HasSubstr("lost the coordinator: nothing arrived from it for"));
  }
  EXPECT_GE(last_after, kLimit - absl::Milliseconds(50));
  EXPECT_LT(last_after, kLimit + kSlack);
  const absl::Time call = absl::Now();
  const absl::Status later = client->Barrier(absl::Now() + kLongDeadline);
  EXPECT_TRUE(absl::IsUnavailable(later)) << later;
  EXPECT_THAT(later.message(), HasSubstr("lost the coordinator: nothing arrived from it for"));
  const absl::Status watched = client->WatchLosses(absl::Now() + kLongDeadline, -1);
  EXPECT_EQ(watched, later);
  EXPECT_LT(absl::Now() - call, kAtOnce);
}

// The coordinator closes the connection while four calls wait, the client without heartbeats (so
// only the I/O thread's read sees the end): every call fails at once with Unavailable, each named
// by its own number ("Barrier #0: lost the coordinator: connection closed by peer"); a later call
// fails at once with the first of them.
TEST(ControlClientIoTest, ACoordinatorThatClosesFailsEveryWaitingCallEachNamedAndLaterOnesAtOnce) {
  FakeCoordinator fake(4, FakeCoordinator::End::kClose);
  std::unique_ptr<ControlClient> client = ConnectAndJoin(fake.port(), /*heartbeats=*/false);
  ASSERT_NE(client, nullptr);
  absl::Time last;
  const std::vector<absl::Status> errors = FourWaitingCalls(*client, &last);
  const absl::Duration last_after = last - fake.ended();
  std::set<int> numbers;
  for (const absl::Status& error : errors) {
    EXPECT_TRUE(absl::IsUnavailable(error)) << error;
    EXPECT_THAT(error.message(), HasSubstr("lost the coordinator: connection closed by peer"));
    numbers.insert(CallNumber(error));
  }
  EXPECT_EQ(numbers, (std::set<int>{0, 1, 2, 3}));
  EXPECT_LT(last_after, kAtOnce);
  const absl::Time call = absl::Now();
  const absl::Status later = client->AllGather("z", absl::Now() + kLongDeadline).status();
  EXPECT_LT(absl::Now() - call, kAtOnce);
  EXPECT_TRUE(absl::IsUnavailable(later)) << later;
  EXPECT_THAT(later.message(), HasSubstr("#0: lost the coordinator: connection closed by peer"));
}

// Destroying a client while three collectives and two WatchLosses (one with a wake_fd) wait on
// other threads: each returns at once with Cancelled naming the destruction, the destructor
// returns, and the coordinator tells the other process that this one was lost.
TEST(ControlClientIoTest, DestructionWithWaitingCallsFailsThemAndReturns) {
  Job job = StartJob(2, 0, Options(2, 0));
  ControlClient* doomed = job.clients[0].get();
  UniqueFd never(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));  // Nobody writes to it.
  ASSERT_TRUE(never.valid());
  std::vector<absl::Status> errors(5);
  std::vector<absl::Time> returned(5);
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back([&, i] {
      const absl::Time deadline = absl::Now() + kLongDeadline;
      if (i < 3) {
        errors[i] = doomed->Barrier(deadline);  // Trainer 1 never calls: no round completes.
      } else {
        errors[i] = doomed->WatchLosses(deadline, i == 3 ? -1 : never.get());
      }
      returned[i] = absl::Now();
    });
  }
  absl::SleepFor(absl::Milliseconds(300));  // Every call queued and waiting.
  const absl::Time destroyed = absl::Now();
  job.clients[0].reset();
  const absl::Duration destruction = absl::Now() - destroyed;
  for (std::thread& thread : threads) thread.join();
  EXPECT_LT(destruction, kAtOnce);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(absl::IsCancelled(errors[i])) << i << ": " << errors[i];
    EXPECT_THAT(errors[i].message(), HasSubstr("the control client was destroyed"));
    EXPECT_LT(returned[i] - destroyed, kAtOnce) << i;
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (job.clients[1]->loss_count() == 0 && absl::Now() < give_up) {
    ASSERT_TRUE(job.clients[1]->WatchLosses(absl::Now() + absl::Milliseconds(100), -1).ok());
  }
  ASSERT_EQ(job.clients[1]->loss_count(), 1u);
  EXPECT_EQ(job.clients[1]->LossesSince(0)[0].process, 0);
}

}  // namespace
}  // namespace wsync
