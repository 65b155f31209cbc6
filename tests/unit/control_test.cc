// Control plane: framing, HMAC and secrets, and a coordinator with client threads in one process
// (handshake, rendezvous, collectives, hostile input, failures).

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
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"
#include "transport/control/auth.h"
#include "transport/control/client.h"
#include "transport/control/coordinator.h"
#include "transport/control/framing.h"
#include "transport/control/socket.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Job;
using control_testing::kJob;
using control_testing::kSecret;
using control_testing::kShortHandshakeTimeout;
using control_testing::MakeHello;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::Raw;
using control_testing::StartJob;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kWrongSecret[] = "incorrect-donkey-battery-staple-7";
// How long a reply may take beyond its due time on a loaded machine (a hang bound).
constexpr absl::Duration kReplyWait = absl::Seconds(5);

// Every error message a test saw; the last test checks that no secret leaked into any of them.
absl::Mutex messages_mu;
std::vector<std::string>& Messages() {
  static auto* messages = new std::vector<std::string>();
  return *messages;
}
absl::Status Seen(absl::Status status) {
  absl::MutexLock lock(&messages_mu);
  Messages().push_back(std::string(status.message()));
  return status;
}
void ExpectNoSecret(const absl::Status& status) {
  (void)Seen(status);
  EXPECT_THAT(status.message(), AllOf(Not(HasSubstr(kSecret)), Not(HasSubstr(kWrongSecret))));
}

// ---------------------------------------------------------------------------------------------
// Framing over a socket pair.

struct Pair {
  UniqueFd a, b;
};
Pair MakePair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{UniqueFd(fds[0]), UniqueFd(fds[1])};
}
void SendRaw(int fd, const std::string& bytes) {
  FrameWriter writer;
  writer.Enqueue(std::make_shared<const std::string>(bytes));
  ASSERT_TRUE(FlushFrames(fd, writer, absl::Now() + absl::Seconds(5)).ok());
}
std::string Header(uint32_t length) {
  return std::string{static_cast<char>(length >> 24), static_cast<char>(length >> 16),
                     static_cast<char>(length >> 8), static_cast<char>(length)};
}

control::Frame SampleFrame(std::string payload) {
  control::Frame frame;
  control::Contribute* c = frame.mutable_contribute();
  c->set_number(7);
  c->set_kind(control::COLLECTIVE_ALL_GATHER);
  c->set_payload(std::move(payload));
  return frame;
}

TEST(FramingTest, RoundTripsSmallAndLargeFrames) {
  Pair p = MakePair();
  const control::Frame small = SampleFrame("hello");
  const control::Frame large = SampleFrame(std::string(3 << 20, 'x'));  // Above socket buffers.
  std::thread writer([&] {
    FrameWriter w;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    EXPECT_TRUE(WriteFrame(p.a.get(), w, small, kDefaultMaxFrameBytes, deadline).ok());
    EXPECT_TRUE(WriteFrame(p.a.get(), w, large, kDefaultMaxFrameBytes, deadline).ok());
    EXPECT_TRUE(WriteFrame(p.a.get(), w, small, kDefaultMaxFrameBytes, deadline).ok());
  });
  FrameReader reader(kDefaultMaxFrameBytes);
  for (const control::Frame* want : {&small, &large, &small}) {
    absl::StatusOr<control::Frame> got =
        ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->SerializeAsString(), want->SerializeAsString());
  }
  writer.join();
  p.a.Reset();
  absl::StatusOr<control::Frame> end = ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(end.status())) << end.status();
}

TEST(FramingTest, TruncatedFrameIsDataLoss) {
  Pair p = MakePair();
  SendRaw(p.a.get(), Header(100) + std::string(10, 'x'));
  p.a.Reset();
  FrameReader reader(kDefaultMaxFrameBytes);
  absl::StatusOr<control::Frame> got = ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(2));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("truncated"));

  Pair q = MakePair();  // Closed in the middle of the header.
  SendRaw(q.a.get(), std::string(2, '\0'));
  q.a.Reset();
  FrameReader reader2(kDefaultMaxFrameBytes);
  got = ReadFrame(q.b.get(), reader2, absl::Now() + absl::Seconds(2));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
}

TEST(FramingTest, OversizedLengthIsRefusedBeforeAllocating) {
  Pair p = MakePair();
  SendRaw(p.a.get(), Header(0x80000000u));  // 2 GiB announced; nothing follows.
  FrameReader reader(kDefaultMaxFrameBytes);
  const absl::Time start = absl::Now();
  absl::StatusOr<control::Frame> got = ReadFrame(p.b.get(), reader, start + 2 * kReplyWait);
  EXPECT_TRUE(absl::IsResourceExhausted(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("2147483648"));
  EXPECT_EQ(reader.allocated_bytes(), 0);
  EXPECT_LT(absl::Now() - start, kReplyWait);  // At once, not at the deadline.

  control::Frame big = SampleFrame(std::string(2000, 'y'));
  EXPECT_TRUE(absl::IsResourceExhausted(EncodeFrame(big, 1000).status()));
  EXPECT_FALSE(CheckFrameCap(0).ok());
  EXPECT_FALSE(CheckFrameCap(kMaxFrameBytesLimit + 1).ok());
}

TEST(FramingTest, MalformedBodiesAreDataLoss) {
  Pair p = MakePair();
  SendRaw(p.a.get(), Header(10) + std::string(10, '\xff'));  // Does not parse.
  SendRaw(p.a.get(), Header(0));                             // Parses, but sets no kind.
  FrameReader reader(kDefaultMaxFrameBytes);
  absl::StatusOr<control::Frame> got = ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(2));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  got = ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(2));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
}

TEST(FramingTest, SilentPeerHitsTheDeadlineAndAPartialFrameResumes) {
  Pair p = MakePair();
  FrameReader reader(kDefaultMaxFrameBytes);
  absl::Time start = absl::Now();
  absl::StatusOr<control::Frame> got =
      ReadFrame(p.b.get(), reader, start + absl::Milliseconds(150));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(140));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(150) + kReplyWait);

  // Half a frame, a deadline, then the rest: the reader resumes where it stopped.
  absl::StatusOr<std::string> encoded = EncodeFrame(SampleFrame("resume"), kDefaultMaxFrameBytes);
  ASSERT_TRUE(encoded.ok());
  SendRaw(p.a.get(), encoded->substr(0, 6));
  got = ReadFrame(p.b.get(), reader, absl::Now() + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status()));
  EXPECT_TRUE(reader.mid_frame());
  SendRaw(p.a.get(), encoded->substr(6));
  got = ReadFrame(p.b.get(), reader, absl::Now() + absl::Seconds(2));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->contribute().payload(), "resume");
}

// ---------------------------------------------------------------------------------------------
// HMAC and secrets.

TEST(AuthTest, HmacSha256MatchesRfc4231) {
  // RFC 4231 test case 1.
  EXPECT_EQ(absl::BytesToHexString(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // RFC 4231 test case 2.
  EXPECT_EQ(absl::BytesToHexString(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
}

TEST(AuthTest, HelloMacBindsEveryField) {
  const std::string n(kNonceBytes, 'n'), c(kNonceBytes, 'c');
  const std::string base = HelloMac(kSecret, n, c, "job", ControlRole::kTrainer, 1, "node");
  EXPECT_EQ(base.size(), kMacBytes);
  EXPECT_NE(base, HelloMac(kWrongSecret, n, c, "job", ControlRole::kTrainer, 1, "node"));
  EXPECT_NE(base, HelloMac(kSecret, c, c, "job", ControlRole::kTrainer, 1, "node"));
  EXPECT_NE(base, HelloMac(kSecret, n, n, "job", ControlRole::kTrainer, 1, "node"));
  EXPECT_NE(base, HelloMac(kSecret, n, c, "jobb", ControlRole::kTrainer, 1, "node"));
  EXPECT_NE(base, HelloMac(kSecret, n, c, "job", ControlRole::kRollout, 1, "node"));
  EXPECT_NE(base, HelloMac(kSecret, n, c, "job", ControlRole::kTrainer, 2, "node"));
  EXPECT_NE(base, HelloMac(kSecret, n, c, "job", ControlRole::kTrainer, 1, "nodf"));
  // Length prefixes: moving a byte from one field to the next changes the MAC.
  EXPECT_NE(HelloMac(kSecret, n, c, "ab", ControlRole::kTrainer, 1, "c"),
            HelloMac(kSecret, n, c, "a", ControlRole::kTrainer, 1, "bc"));
}

TEST(AuthTest, WelcomeMacBindsEveryFieldTheClientActsOn) {
  const std::string n(kNonceBytes, 'n'), c(kNonceBytes, 'c');
  const WelcomeFields fields{3, 2, 2, int64_t{1} << 20, 250, 3000};
  const std::string base = WelcomeMac(kSecret, c, n, "job", fields);
  EXPECT_EQ(base.size(), kMacBytes);
  EXPECT_NE(base, WelcomeMac(kWrongSecret, c, n, "job", fields));
  EXPECT_NE(base, WelcomeMac(kSecret, n, n, "job", fields));
  EXPECT_NE(base, WelcomeMac(kSecret, c, c, "job", fields));
  EXPECT_NE(base, WelcomeMac(kSecret, c, n, "jobb", fields));
  const std::vector<std::function<void(WelcomeFields&)>> alterations = {
      [](WelcomeFields& f) { f.process = 4; },
      [](WelcomeFields& f) { f.num_trainers = 3; },
      [](WelcomeFields& f) { f.num_rollouts = 1; },
      [](WelcomeFields& f) { f.max_frame_bytes = int64_t{1} << 40; },
      [](WelcomeFields& f) { f.heartbeat_interval_ms = 0; },
      [](WelcomeFields& f) { f.silence_limit_ms = 3000 + (int64_t{1} << 32); },  // High half.
  };
  for (size_t field = 0; field < alterations.size(); ++field) {
    WelcomeFields altered = fields;
    alterations[field](altered);
    EXPECT_NE(base, WelcomeMac(kSecret, c, n, "job", altered)) << "field " << field;
  }
}

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/wsync_control_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(SecretFileTest, ModeOwnerAndContentsAreChecked) {
  const std::string open_path = Write("open", absl::StrCat(kSecret, "\n"), 0644);
  absl::StatusOr<std::string> got = LoadSecret(SecretSource::File(open_path));
  EXPECT_TRUE(absl::IsPermissionDenied(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr(open_path), HasSubstr("0644")));
  ExpectNoSecret(got.status());

  const std::string good = Write("good", absl::StrCat(kSecret, "\n"), 0600);
  got = LoadSecret(SecretSource::File(good));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, kSecret);
  chmod(good.c_str(), 0400);
  EXPECT_TRUE(LoadSecret(SecretSource::File(good)).ok());

  got = LoadSecret(SecretSource::File(dir_ + "/missing"));
  EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
  const std::string short_path = Write("short", "tiny", 0600);
  got = LoadSecret(SecretSource::File(short_path));
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), Not(HasSubstr("tiny")));
  EXPECT_TRUE(absl::IsPermissionDenied(LoadSecret(SecretSource::File(dir_)).status()));
}

TEST(SecretEnvTest, VariableSource) {
  setenv("WSYNC_CONTROL_TEST_SECRET", kSecret, 1);
  absl::StatusOr<std::string> got =
      LoadSecret(SecretSource::Environment("WSYNC_CONTROL_TEST_SECRET"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, kSecret);
  unsetenv("WSYNC_CONTROL_TEST_SECRET");
  got = LoadSecret(SecretSource::Environment("WSYNC_CONTROL_TEST_SECRET"));
  EXPECT_TRUE(absl::IsNotFound(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("WSYNC_CONTROL_TEST_SECRET"));
}

// ---------------------------------------------------------------------------------------------
// Coordinator and clients.

// Options, ClientOptions, Parallel, Job and StartJob: tests/unit/control_job.h.

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

TEST(ClientTest, RefusesACoordinatorThatCannotProveTheSecret) {
  int port = 0;
  absl::StatusOr<UniqueFd> listener = ListenTcp("127.0.0.1", 0, false, &port);
  ASSERT_TRUE(listener.ok());
  std::thread impostor([&] {
    ASSERT_TRUE(PollOne(listener->get(), POLLIN, absl::Now() + absl::Seconds(5)).ok());
    UniqueFd fd(accept4(listener->get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    FrameWriter w;
    FrameReader r(1 << 16);
    control::Frame f;
    f.mutable_challenge()->set_protocol_version(kControlProtocolVersion);
    f.mutable_challenge()->set_nonce(std::string(kNonceBytes, 'n'));
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    ASSERT_TRUE(WriteFrame(fd.get(), w, f, 1 << 16, deadline).ok());
    ASSERT_TRUE(ReadFrame(fd.get(), r, deadline).ok());
    f.Clear();
    f.mutable_welcome()->set_process(0);
    f.mutable_welcome()->set_num_trainers(1);
    f.mutable_welcome()->set_max_frame_bytes(1 << 20);
    f.mutable_welcome()->set_mac(std::string(kMacBytes, 'm'));
    ASSERT_TRUE(WriteFrame(fd.get(), w, f, 1 << 16, deadline).ok());
    absl::SleepFor(absl::Milliseconds(100));
  });
  absl::StatusOr<std::unique_ptr<ControlClient>> client =
      ControlClient::Connect(ClientOptions(port, ControlRole::kTrainer, 0));
  impostor.join();
  EXPECT_TRUE(absl::IsUnauthenticated(client.status())) << client.status();
  ExpectNoSecret(client.status());
}

// An impostor on the path that holds no secret relays a real Welcome (its MAC is genuine) after
// changing one field the client acts on: the client refuses it. Here the "coordinator" computes
// the genuine MAC over the real fields and then alters one, as such an attacker would.
absl::Status ConnectThroughAlteredWelcome(const std::function<void(control::Welcome&)>& alter) {
  int port = 0;
  absl::StatusOr<UniqueFd> listener = ListenTcp("127.0.0.1", 0, false, &port);
  EXPECT_TRUE(listener.ok());
  std::thread relay([&] {
    ASSERT_TRUE(PollOne(listener->get(), POLLIN, absl::Now() + absl::Seconds(5)).ok());
    UniqueFd fd(accept4(listener->get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    FrameWriter w;
    FrameReader r(1 << 16);
    const std::string nonce(kNonceBytes, 'n');
    control::Frame f;
    f.mutable_challenge()->set_protocol_version(kControlProtocolVersion);
    f.mutable_challenge()->set_nonce(nonce);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    ASSERT_TRUE(WriteFrame(fd.get(), w, f, 1 << 16, deadline).ok());
    absl::StatusOr<control::Frame> hello = ReadFrame(fd.get(), r, deadline);
    ASSERT_TRUE(hello.ok() && hello->has_hello());
    f.Clear();
    control::Welcome* welcome = f.mutable_welcome();
    welcome->set_process(0);
    welcome->set_num_trainers(1);
    welcome->set_num_rollouts(1);
    welcome->set_max_frame_bytes(1 << 20);
    welcome->set_heartbeat_interval_ms(250);
    welcome->set_silence_limit_ms(3000);
    welcome->set_mac(
        WelcomeMac(kSecret, hello->hello().client_nonce(), nonce, kJob, WelcomeFieldsOf(*welcome)));
    alter(*welcome);
    ASSERT_TRUE(WriteFrame(fd.get(), w, f, 1 << 16, deadline).ok());
    absl::SleepFor(absl::Milliseconds(100));
  });
  absl::StatusOr<std::unique_ptr<ControlClient>> client =
      ControlClient::Connect(ClientOptions(port, ControlRole::kTrainer, 0));
  relay.join();
  return client.status();
}

TEST(ClientTest, RefusesAWelcomeWithAnyFieldAltered) {
  // Unaltered: accepted (the client is then connected to nothing more and is dropped).
  EXPECT_TRUE(ConnectThroughAlteredWelcome([](control::Welcome&) {}).ok());
  const std::vector<std::pair<std::string, std::function<void(control::Welcome&)>>> alterations = {
      {"num_trainers", [](control::Welcome& w) { w.set_num_trainers(2); }},
      {"num_rollouts", [](control::Welcome& w) { w.set_num_rollouts(5); }},
      {"max_frame_bytes", [](control::Welcome& w) { w.set_max_frame_bytes(1 << 10); }},
      {"heartbeat_interval_ms", [](control::Welcome& w) { w.set_heartbeat_interval_ms(1000); }},
      {"silence_limit_ms", [](control::Welcome& w) { w.set_silence_limit_ms(600000); }},
  };
  for (const auto& [field, alter] : alterations) {
    const absl::Status status = ConnectThroughAlteredWelcome(alter);
    EXPECT_TRUE(absl::IsUnauthenticated(status)) << field << ": " << status;
    ExpectNoSecret(status);
  }
}

// Runs last in this file (gtest keeps declaration order).
TEST(ZzSecretTest, NoErrorMessageContainsTheSecret) {
  absl::MutexLock lock(&messages_mu);
  EXPECT_GT(Messages().size(), 10u);
  for (const std::string& m : Messages()) {
    EXPECT_THAT(m, AllOf(Not(HasSubstr(kSecret)), Not(HasSubstr(kWrongSecret))));
  }
}

}  // namespace
}  // namespace wsync
