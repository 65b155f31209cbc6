// The coordinator with client threads in one process: rendezvous, collectives over repeated
// rounds, oversized and mixed payloads, hostile and half-open connections, missing, dying, late and
// aborting processes, stopping, IPv6 (control_test.cc: framing, HMAC, secrets, the client).

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "control/auth.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/framing.h"
#include "control/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"
#include "tests/unit/control_test_messages.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::ExpectNoSecret;
using control_testing::Header;
using control_testing::Job;
using control_testing::kJob;
using control_testing::kReplyWait;
using control_testing::kSecret;
using control_testing::kShortHandshakeTimeout;
using control_testing::kWrongSecret;
using control_testing::MakeHello;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::Raw;
using control_testing::Seen;
using control_testing::SendRaw;
using control_testing::StartJob;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(CoordinatorTest, RefusesTheWildcardAddressUnlessAllowed) {
  for (const char* any : {"0.0.0.0", "::"}) {
    CoordinatorOptions o = Options(1, 1);
    o.address = any;
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(o);
    EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
    ExpectNoSecret(c.status());
  }
  CoordinatorOptions o = Options(1, 1);
  o.address = "0.0.0.0";
  o.allow_any_address = true;
  EXPECT_TRUE(Coordinator::Start(o).ok());
  o = Options(1, 1);
  o.secret = "short";
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(o).status()));
}

TEST(CoordinatorTest, RendezvousGivesEveryProcessTheRoster) {
  Job job = StartJob(2, 2, Options(2, 2));
  ASSERT_EQ(job.clients.size(), 4u);
  EXPECT_TRUE(job.coordinator->rendezvous_status().ok());
  for (int id = 0; id < 4; ++id) {
    const Roster& r = job.rosters[id];
    ASSERT_EQ(r.size(), 4);
    EXPECT_EQ(r.num_trainers, 2);
    EXPECT_EQ(r.num_rollouts, 2);
    EXPECT_EQ(r.blobs.size(), 3u);  // Two distinct manifests and one metadata, sent once each.
    for (int q = 0; q < 4; ++q) {
      const RosterEntry& e = r.processes[q];
      EXPECT_EQ(e.process, q);
      EXPECT_EQ(e.role, q < 2 ? ControlRole::kTrainer : ControlRole::kRollout);
      EXPECT_EQ(e.rank, q % 2);
      EXPECT_EQ(e.address, absl::StrCat("address-", q));
      EXPECT_EQ(r.manifest(q), q < 2 ? "trainer-manifest" : "rollout-manifest");
      EXPECT_EQ(r.metadata(q), "metadata");
      EXPECT_EQ(e.node_id, ClientOptions(0, e.role, e.rank).node_id);
    }
    EXPECT_EQ(job.clients[id]->size(), 4);
  }
  const CoordinatorCounters counters = job.coordinator->counters();
  EXPECT_EQ(counters.welcomed, 4);
  EXPECT_EQ(counters.joined, 4);
  EXPECT_EQ(counters.TotalRefused(), 0);
}

TEST(CoordinatorTest, CollectivesOverRepeatedRounds) {
  Job job = StartJob(2, 2, Options(2, 2));
  Parallel(4, [&](int id) {
    ControlClient& c = *job.clients[id];
    for (int round = 0; round < 25; ++round) {
      const absl::Time deadline = absl::Now() + absl::Seconds(5);
      absl::StatusOr<std::vector<std::string>> all =
          c.AllGather(absl::StrCat("p", id, "r", round), deadline);
      ASSERT_TRUE(all.ok()) << all.status();
      ASSERT_EQ(all->size(), 4u);
      for (int q = 0; q < 4; ++q) EXPECT_EQ((*all)[q], absl::StrCat("p", q, "r", round));

      const int root = round % 4;
      absl::StatusOr<std::string> b =
          c.Broadcast(root, absl::StrCat("from ", id, " in ", round), deadline);
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(*b, absl::StrCat("from ", root, " in ", round));

      ASSERT_TRUE(c.Barrier(deadline).ok());
      ASSERT_TRUE(c.Decide(true, "", deadline).ok());
      const bool fail = round % 5 == 1 && id >= 2;  // Both rollouts refuse some steps.
      absl::Status decided = c.Decide(!fail, absl::StrCat("checksum mismatch on ", id), deadline);
      if (round % 5 == 1) {
        ASSERT_TRUE(absl::IsAborted(decided)) << decided;
        // The first "no" decides for everyone, naming that process and its reason.
        EXPECT_THAT(decided.message(),
                    AnyOf(AllOf(HasSubstr("aborted by process 2 (rollout rank 0"),
                                HasSubstr("checksum mismatch on 2")),
                          AllOf(HasSubstr("aborted by process 3 (rollout rank 1"),
                                HasSubstr("checksum mismatch on 3"))));
        ExpectNoSecret(decided);
      } else {
        ASSERT_TRUE(decided.ok()) << decided;
      }
    }
  });
  EXPECT_EQ(job.coordinator->counters().rounds_completed, 25 * 5 - 5);
  EXPECT_EQ(job.coordinator->counters().rounds_failed, 5);
}

TEST(CoordinatorTest, OversizedPayloadsFailTheRoundForEveryProcess) {
  CoordinatorOptions options = Options(1, 1);
  options.max_frame_bytes = 64 << 10;
  Job job = StartJob(1, 1, options);
  Parallel(2, [&](int id) {
    ControlClient& c = *job.clients[id];
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    // Process 0's payload is above the cap: it fails locally, and its peer learns why at once.
    absl::Status s = c.AllGather(std::string(id == 0 ? 100 << 10 : 10, 'x'), deadline).status();
    if (id == 0) {
      EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    } else {
      EXPECT_TRUE(absl::IsAborted(s)) << s;
      EXPECT_THAT(s.message(), AllOf(HasSubstr("process 0 (trainer rank 0"), HasSubstr("cap")));
    }
    // Each payload fits, but the gathered result does not.
    s = c.AllGather(std::string(40 << 10, 'y'), deadline).status();
    EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
    // A bad Broadcast root fails every process's round too.
    s = c.Broadcast(id == 0 ? 5 : 0, "z", deadline).status();
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(c.Barrier(deadline).ok());
  });
}

TEST(CoordinatorTest, DifferentCollectivesInOneRoundFailEveryProcess) {
  Job job = StartJob(1, 1, Options(1, 1));
  Parallel(2, [&](int id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    absl::Status s = id == 0 ? job.clients[0]->Barrier(deadline)
                             : job.clients[1]->AllGather("x", deadline).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("Barrier"), HasSubstr("AllGather")));
    // The next round pairs up again.
    EXPECT_TRUE(job.clients[id]->Barrier(deadline).ok());
  });
}

// The coordinator's refusal, read after the challenge, waiting at most `wait`.
absl::Status RefusalOf(Raw& raw, absl::Duration wait = absl::Seconds(3)) {
  absl::StatusOr<control::Frame> f = raw.Read(wait);
  if (!f.ok()) return f.status();
  if (!f->has_reject()) return absl::InternalError("no reject");
  return Seen(StatusFromWire(f->reject().code(), f->reject().reason()));
}

TEST(CoordinatorTest, HostileConnectionsAreRefusedWhileGoodProcessesJoin) {
  CoordinatorOptions options = Options(1, 1);
  options.handshake_timeout = kShortHandshakeTimeout;
  absl::StatusOr<std::unique_ptr<Coordinator>> started = Coordinator::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Coordinator& coordinator = **started;
  const int port = coordinator.port();

  // A half-open connection that never speaks stays open while everything below happens.
  Raw half_open(port);

  // Capture a valid Hello of rollout rank 0, then leave (freeing the rank before the roster).
  std::string captured;
  {
    Raw raw(port);
    absl::StatusOr<control::Frame> challenge = raw.Read();
    ASSERT_TRUE(challenge.ok() && challenge->has_challenge());
    absl::StatusOr<std::string> encoded = EncodeFrame(
        MakeHello(kSecret, challenge->challenge().nonce(), ControlRole::kRollout, 0), 1 << 20);
    ASSERT_TRUE(encoded.ok());
    captured = *encoded;
    SendRaw(raw.fd.get(), captured);
    absl::StatusOr<control::Frame> welcome = raw.Read();
    ASSERT_TRUE(welcome.ok() && welcome->has_welcome()) << welcome.status();
  }
  {  // Replayed on a new connection: the nonce differs, so the MAC does not verify.
    Raw raw(port);
    ASSERT_TRUE(raw.Read().ok());
    SendRaw(raw.fd.get(), captured);
    absl::Status refused = RefusalOf(raw);
    EXPECT_TRUE(absl::IsUnauthenticated(refused)) << refused;
    EXPECT_EQ(refused.message(), "control: authentication failed");
  }
  {  // A bad role value, with an otherwise good MAC.
    Raw raw(port);
    absl::StatusOr<control::Frame> challenge = raw.Read();
    ASSERT_TRUE(challenge.ok());
    absl::StatusOr<std::string> encoded = EncodeFrame(
        MakeHello(kSecret, challenge->challenge().nonce(), ControlRole::kRollout, 0, 7), 1 << 20);
    SendRaw(raw.fd.get(), *encoded);
    EXPECT_TRUE(absl::IsInvalidArgument(RefusalOf(raw)));
  }
  {  // A 2 GiB length prefix before the handshake.
    Raw raw(port);
    ASSERT_TRUE(raw.Read().ok());
    SendRaw(raw.fd.get(), Header(0x80000000u));
    EXPECT_TRUE(absl::IsResourceExhausted(RefusalOf(raw)));
  }
  {  // Garbage that does not parse.
    Raw raw(port);
    ASSERT_TRUE(raw.Read().ok());
    SendRaw(raw.fd.get(), Header(12) + std::string(12, '\xff'));
    EXPECT_TRUE(absl::IsDataLoss(RefusalOf(raw)));
  }
  {  // A truncated frame: the peer closes its side mid-frame.
    Raw raw(port);
    ASSERT_TRUE(raw.Read().ok());
    SendRaw(raw.fd.get(), Header(100) + "abc");
    shutdown(raw.fd.get(), SHUT_WR);
    (void)raw.Read();
  }
  auto connect = [&](ControlClientOptions o) {
    absl::StatusOr<std::unique_ptr<ControlClient>> c = ControlClient::Connect(std::move(o));
    if (!c.ok()) ExpectNoSecret(c.status());
    return c;
  };
  ControlClientOptions wrong = ClientOptions(port, ControlRole::kTrainer, 0);
  wrong.secret = kWrongSecret;
  absl::Status s = connect(wrong).status();
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("authentication failed"));

  ControlClientOptions other_job = ClientOptions(port, ControlRole::kTrainer, 0);
  other_job.job_id = "job-2";
  s = connect(other_job).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("unknown job id"));

  s = connect(ClientOptions(port, ControlRole::kRollout, 1)).status();
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;

  // The good trainer connects; a second trainer rank 0 is a duplicate.
  absl::StatusOr<std::unique_ptr<ControlClient>> trainer =
      connect(ClientOptions(port, ControlRole::kTrainer, 0));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  s = connect(ClientOptions(port, ControlRole::kTrainer, 0)).status();
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;

  absl::StatusOr<std::unique_ptr<ControlClient>> rollout =
      connect(ClientOptions(port, ControlRole::kRollout, 0));
  ASSERT_TRUE(rollout.ok()) << rollout.status();
  std::vector<absl::StatusOr<Roster>> rosters(2);
  Parallel(2, [&](int id) {
    ControlClient& c = id == 0 ? **trainer : **rollout;
    rosters[id] =
        c.Join(JoinRequest{"m", absl::StrCat("a", id), ""}, absl::Now() + absl::Seconds(5));
  });
  ASSERT_TRUE(rosters[0].ok()) << rosters[0].status();
  ASSERT_TRUE(rosters[1].ok()) << rosters[1].status();
  EXPECT_EQ(rosters[1]->processes[0].address, "a0");

  // The half-open connection got its challenge and is closed once its handshake time is up.
  absl::StatusOr<control::Frame> challenge = half_open.Read();
  ASSERT_TRUE(challenge.ok() && challenge->has_challenge());
  EXPECT_TRUE(absl::IsDeadlineExceeded(RefusalOf(half_open, kShortHandshakeTimeout + kReplyWait)));

  const CoordinatorCounters counters = coordinator.counters();
  EXPECT_EQ(counters.Refused(RefusalReason::kAuthenticationFailed), 2);  // Replay, wrong secret.
  EXPECT_EQ(counters.Refused(RefusalReason::kBadField), 1);
  EXPECT_EQ(counters.Refused(RefusalReason::kOversizedFrame), 1);
  EXPECT_EQ(counters.Refused(RefusalReason::kMalformedFrame), 1);
  EXPECT_EQ(counters.Refused(RefusalReason::kTruncatedFrame), 1);
  EXPECT_EQ(counters.Refused(RefusalReason::kUnknownJob), 1);
  EXPECT_EQ(counters.Refused(RefusalReason::kRankOutOfRange), 1);
  EXPECT_EQ(counters.Refused(RefusalReason::kDuplicateRank), 1);
  EXPECT_EQ(counters.Refused(RefusalReason::kHandshakeTimeout), 1);
  EXPECT_EQ(counters.joined, 2);
}

TEST(CoordinatorTest, TooManyHalfOpenConnectionsDelayButDoNotStopAGoodProcess) {
  CoordinatorOptions options = Options(1, 0);
  options.max_pending_connections = 2;
  options.handshake_timeout = kShortHandshakeTimeout;
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(options);
  ASSERT_TRUE(c.ok());
  Raw a((*c)->port()), b((*c)->port());
  absl::SleepFor(absl::Milliseconds(50));
  // Refused while both slots are taken, retried, and admitted once they time out.
  ControlClientOptions good = ClientOptions((*c)->port(), ControlRole::kTrainer, 0);
  good.connect_timeout = 2 * kShortHandshakeTimeout + kReplyWait;
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(good);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_GE((*c)->counters().Refused(RefusalReason::kTooManyConnections), 1);
  EXPECT_TRUE((*client)->Join(JoinRequest{}, absl::Now() + absl::Seconds(2)).ok());
}

TEST(CoordinatorTest, MissingProcessFailsTheRendezvousForEveryone) {
  CoordinatorOptions options = Options(2, 2);
  // Long enough for the three others to join on a loaded machine (the message counts them).
  options.rendezvous_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(options);
  ASSERT_TRUE(c.ok());
  const absl::Time start = absl::Now();
  Parallel(3, [&](int id) {  // Rollout rank 1 (process 3) never comes.
    const bool trainer = id < 2;
    absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(ClientOptions(
        (*c)->port(), trainer ? ControlRole::kTrainer : ControlRole::kRollout, id % 2));
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<Roster> roster =
        (*client)->Join(JoinRequest{"m", "a", ""}, absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(absl::IsDeadlineExceeded(roster.status())) << roster.status();
    EXPECT_THAT(roster.status().message(),
                AllOf(HasSubstr("process 3 (rollout rank 1)"), HasSubstr("1 of 4")));
    ExpectNoSecret(roster.status());
  });
  EXPECT_LT(absl::Now() - start, options.rendezvous_timeout + kReplyWait);
  EXPECT_TRUE(absl::IsDeadlineExceeded((*c)->rendezvous_status()));
  // A latecomer is refused.
  absl::StatusOr<std::unique_ptr<ControlClient>> late =
      ControlClient::Connect(ClientOptions((*c)->port(), ControlRole::kRollout, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
}

TEST(CoordinatorTest, AProcessThatDiesDuringAllGatherIsNamedAtOnce) {
  Job job = StartJob(2, 1, Options(2, 1));
  const absl::Time start = absl::Now();
  Parallel(3, [&](int id) {
    if (id == 2) {
      absl::SleepFor(absl::Milliseconds(100));
      job.clients[2].reset();  // Closes its socket, as a crash would.
      return;
    }
    absl::StatusOr<std::vector<std::string>> all =
        job.clients[id]->AllGather("x", absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(absl::IsUnavailable(all.status())) << all.status();
    EXPECT_THAT(all.status().message(), HasSubstr("process 2 (rollout rank 0"));
    ExpectNoSecret(all.status());
    // Later collectives fail at once too.
    absl::Status next = job.clients[id]->Barrier(absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(absl::IsUnavailable(next)) << next;
  });
  EXPECT_LT(absl::Now() - start, kReplyWait);  // Well before the 10 s deadlines.
  EXPECT_EQ(job.coordinator->counters().lost, 1);
}

TEST(CoordinatorTest, DeadlineNamesTheLateProcessAndNumberingResumes) {
  Job job = StartJob(2, 1, Options(2, 1));
  Parallel(2, [&](int id) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<std::string>> all =
        job.clients[id]->AllGather(absl::StrCat(id), start + absl::Milliseconds(400));
    EXPECT_TRUE(absl::IsDeadlineExceeded(all.status())) << all.status();
    EXPECT_THAT(all.status().message(), HasSubstr("process 2 (rollout rank 0"));
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(400) + kReplyWait);
  });
  // The late process's contribution to round 0 fails at once with the same outcome the others
  // saw (never a success the others did not share), and all meet in round 1.
  const absl::Time late_start = absl::Now();
  absl::StatusOr<std::vector<std::string>> late =
      job.clients[2]->AllGather("2", late_start + 2 * kReplyWait);
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr("did not contribute before the deadline"));
  EXPECT_LT(absl::Now() - late_start, kReplyWait);  // At once, not at its own deadline.
  Parallel(3, [&](int id) {
    absl::StatusOr<std::vector<std::string>> all =
        job.clients[id]->AllGather(absl::StrCat("n", id), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(*all, (std::vector<std::string>{"n0", "n1", "n2"}));
  });
}

TEST(CoordinatorTest, AbortFromAnotherThreadEndsTheCallAndNamesTheProcessToOthers) {
  Job job = StartJob(2, 1, Options(2, 1));  // Process 2 never calls, so the barrier blocks.
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    job.clients[0]->Abort(absl::CancelledError("trainer shutting down"));
    job.clients[0]->Abort(absl::CancelledError("again"));  // Harmless.
  });
  Parallel(2, [&](int id) {
    const absl::Time start = absl::Now();
    absl::Status s = job.clients[id]->Barrier(start + absl::Seconds(10));
    if (id == 0) {
      EXPECT_TRUE(absl::IsAborted(s)) << s;
      EXPECT_THAT(s.message(), HasSubstr("trainer shutting down"));
    } else {
      EXPECT_TRUE(absl::IsUnavailable(s)) << s;
      EXPECT_THAT(s.message(), HasSubstr("process 0 (trainer rank 0"));
    }
    EXPECT_LT(absl::Now() - start, kReplyWait);  // Well before the 10 s deadline.
  });
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(job.clients[0]->Barrier(absl::Now() + absl::Seconds(1))));
}

TEST(CoordinatorTest, StoppingTheCoordinatorFailsWaitingClients) {
  Job job = StartJob(1, 1, Options(1, 1));
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(100));
    job.coordinator->Stop();
  });
  const absl::Time start = absl::Now();
  absl::Status s = job.clients[0]->Barrier(start + absl::Seconds(10));
  stopper.join();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_LT(absl::Now() - start, kReplyWait);  // Well before the 10 s deadline.
  job.coordinator->Stop();                     // Idempotent.
}

TEST(CoordinatorTest, ServesIpv6) {
  CoordinatorOptions options = Options(1, 0);
  options.address = "::1";
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(options);
  if (absl::IsUnavailable(c.status())) GTEST_SKIP() << "no IPv6 loopback: " << c.status();
  ASSERT_TRUE(c.ok()) << c.status();
  ControlClientOptions o = ClientOptions((*c)->port(), ControlRole::kTrainer, 0);
  o.coordinator_host = "::1";
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Join(JoinRequest{}, absl::Now() + absl::Seconds(2)).ok());
}

}  // namespace
}  // namespace wsync
