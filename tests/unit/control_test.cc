// Control plane: framing, HMAC and secrets, the client's checks of the coordinator, and that no
// error message of this binary's tests contains the secret (control_coordinator_test.cc: the
// coordinator with client threads in one process).

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

using control_testing::ExpectNoSecret;
using control_testing::Header;
using control_testing::kReplyWait;
using control_testing::kWrongSecret;
using control_testing::Messages;
using control_testing::MessagesMutex;
using control_testing::Seen;
using control_testing::SendRaw;

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

// Runs last in this binary: gtest keeps declaration order, and this file is linked after
// control_coordinator_test.cc (tests/unit/CMakeLists.txt).
TEST(ZzSecretTest, NoErrorMessageContainsTheSecret) {
  absl::MutexLock lock(&MessagesMutex());
  EXPECT_GT(Messages().size(), 10u);
  for (const std::string& m : Messages()) {
    EXPECT_THAT(m, AllOf(Not(HasSubstr(kSecret)), Not(HasSubstr(kWrongSecret))));
  }
}

}  // namespace
}  // namespace wsync
