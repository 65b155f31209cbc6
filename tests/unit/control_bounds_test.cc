// Work an input can make the coordinator do is bounded (issue 26): a flood of silent connections
// from loopback does not keep a real job from connecting, joining and running collectives; a
// process that contributes rounds ahead without waiting, or makes the coordinator hold more payload
// bytes than its cap, is refused. A member that does not read what the coordinator sends is lost
// once its queue would pass max_queued_bytes_per_connection or it takes nothing for
// write_stall_timeout, and the coordinator's queued bytes stay under that cap plus one frame;
// heartbeats of tens of MiB (unknown fields in their progress) leave a few bytes of progress.
//
// The bugs these tests catch: with only a total limit on pending handshakes (refusing new
// connections once it is reached), ~100 silent connections a second kept every slot taken and the
// job's processes refused until their deadline; contributions were held for up to 256 open rounds
// of up to 64 MiB each per process.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/status_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::kSecret;
using control_testing::MakeHello;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::Raw;
using ::testing::HasSubstr;

// Opens silent loopback connections at `per_second` (keeping up to `held` open, the oldest closed
// first), until stopped: 40 times the rate (26 a second) that kept every pending slot of the
// coordinator taken before. With `sources`, from 127.0.0.2, 127.0.0.3, ... (that many, in turn,
// bound before the connect) instead of the default source address.
class Flood {
 public:
  Flood(int port, int per_second, int held, int sources = 0) {
    thread_ = std::thread([this, port, per_second, held, sources] {
      std::deque<UniqueFd> open;
      const absl::Time start = absl::Now();
      while (!stop_.load()) {
        const int64_t due =
            static_cast<int64_t>(absl::ToDoubleSeconds(absl::Now() - start) * per_second);
        if (opened_.load() >= due) {
          absl::SleepFor(absl::Milliseconds(1));
          continue;
        }
        absl::StatusOr<UniqueFd> fd =
            sources == 0 ? ConnectTcp("127.0.0.1", port, absl::Now() + absl::Milliseconds(200))
                         : ConnectFrom(2 + opened_.load() % sources, port);
        opened_.fetch_add(1);
        if (fd.ok()) {
          connected_.fetch_add(1);
          open.push_back(*std::move(fd));
        }
        while (static_cast<int>(open.size()) > held) open.pop_front();
      }
    });
  }
  ~Flood() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  int64_t opened() const { return opened_.load(); }
  int64_t connected() const { return connected_.load(); }

 private:
  // A connection to 127.0.0.1:`port` from 127.0.0.`host`.
  static absl::StatusOr<UniqueFd> ConnectFrom(int64_t host, int port) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK - 1 + static_cast<uint32_t>(host));
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      return absl::UnavailableError("bind");
    }
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      return absl::UnavailableError("connect");
    }
    return fd;
  }

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> opened_{0};
  std::atomic<int64_t> connected_{0};
  std::thread thread_;
};

// Process `id` of Options(2, 1) (trainers 0 and 1, rollout 2): connects within `connect_timeout`
// and joins. Null after a failed check.
std::unique_ptr<ControlClient> ConnectAndJoin(int port, int id, absl::Duration connect_timeout) {
  const bool trainer = id < 2;
  ControlClientOptions o = ClientOptions(
      port, trainer ? ControlRole::kTrainer : ControlRole::kRollout, trainer ? id : 0);
  o.connect_timeout = connect_timeout;
  absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(o);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  JoinRequest request{trainer ? "t" : "r", absl::StrCat("address-", id), "metadata"};
  absl::StatusOr<Roster> roster = (*client)->Join(request, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(roster.ok()) << roster.status();
  return roster.ok() ? *std::move(client) : nullptr;
}

TEST(CoordinatorBoundsTest, AFloodOfSilentConnectionsDoesNotKeepARealJobOut) {
  // Silent connections time out only after 10 s: the job (8 s to connect) gets in by displacing
  // them, not by waiting for them to expire.
  CoordinatorOptions options = Options(2, 1);
  options.handshake_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Coordinator>> started = Coordinator::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Coordinator& coordinator = **started;
  // Every flood connection stays open for the whole test where the descriptor limit allows (the
  // soft limit raised to the hard one): none of them frees a slot by going away.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, 65536);
  setrlimit(RLIMIT_NOFILE, &files);
  getrlimit(RLIMIT_NOFILE, &files);
  const int held = static_cast<int>(std::min<rlim_t>(9000, files.rlim_cur / 2 - 200));
  Flood flood(coordinator.port(), 1000, held);
  // Let the flood take every pending slot first.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (flood.opened() < 1000 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_GE(flood.opened(), 300) << "the flood did not get going";

  // The real job: three processes connect, join and run collectives while the flood goes on.
  std::vector<std::unique_ptr<ControlClient>> clients(3);
  Parallel(3, [&](int id) {
    std::unique_ptr<ControlClient> client =
        ConnectAndJoin(coordinator.port(), id, absl::Seconds(8));
    ASSERT_NE(client, nullptr);
    for (int round = 0; round < 5; ++round) {
      absl::StatusOr<std::vector<std::string>> all =
          client->AllGather(absl::StrCat(id, "/", round), absl::Now() + absl::Seconds(10));
      ASSERT_TRUE(all.ok()) << all.status();
      EXPECT_EQ((*all)[2], absl::StrCat("2/", round));
    }
    clients[id] = std::move(client);
  });
  const int64_t opened = flood.opened();
  flood.Stop();
  const CoordinatorCounters counters = coordinator.counters();
  EXPECT_EQ(counters.joined, 3);
  // The flood's connections were displaced (or timed out), never the job's.
  EXPECT_GT(counters.Refused(RefusalReason::kTooManyConnections), 0) << opened << " opened";
  EXPECT_EQ(counters.Refused(RefusalReason::kAuthenticationFailed), 0);
}

// The limits scaled down (16 pending connections, 4 a source, a grace of 10 s) so that a flood
// of 60 connections a second from 8 source addresses keeps every pending slot younger than the
// grace for the whole test, as a few thousand a second do with the defaults: the job (from
// 127.0.0.1, 6 s to connect) still gets in, by displacing the largest share. The bug this
// catches: with per-source limits and only the oldest past the grace displaced, every connection
// of the job was refused until its deadline.
TEST(CoordinatorBoundsTest, AFloodFromEightSourceAddressesDoesNotKeepARealJobOut) {
  CoordinatorOptions options = Options(2, 1);
  options.max_pending_connections = 16;
  options.max_pending_per_source = 4;
  options.pending_grace = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Coordinator>> started = Coordinator::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Coordinator& coordinator = **started;
  Flood flood(coordinator.port(), 60, 1000, 8);
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (flood.connected() < 24 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_GE(flood.connected(), 24) << "the flood did not get going: " << flood.opened();

  Parallel(3, [&](int id) {
    EXPECT_NE(ConnectAndJoin(coordinator.port(), id, absl::Seconds(6)), nullptr);
  });
  const int64_t connected = flood.connected();
  flood.Stop();
  const CoordinatorCounters counters = coordinator.counters();
  EXPECT_EQ(counters.joined, 3);
  EXPECT_GT(counters.Refused(RefusalReason::kTooManyConnections), 0) << connected << " flooded";
}

TEST(CoordinatorBoundsTest, OneSourceDisplacesOnlyItsOwnPendingConnections) {
  CoordinatorOptions options = Options(1, 0);
  options.max_pending_per_source = 3;
  options.pending_grace = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<Coordinator>> started = Coordinator::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  const int port = (*started)->port();
  std::vector<std::unique_ptr<Raw>> raws;
  for (int i = 0; i < 4; ++i) {
    raws.push_back(std::make_unique<Raw>(port));
    ASSERT_TRUE(raws.back()->Read().ok());  // The Challenge: accepted in turn.
  }
  // The fourth displaced the first, which is closed at once (no Reject: it said nothing).
  absl::StatusOr<control::Frame> first = raws[0]->Read(absl::Seconds(3));
  EXPECT_FALSE(first.ok());
  EXPECT_EQ((*started)->counters().Refused(RefusalReason::kTooManyConnections), 1);
  // The newest can still complete its handshake.
  absl::StatusOr<control::Frame> challenge;
  Raw good(port);
  challenge = good.Read();
  ASSERT_TRUE(challenge.ok() && challenge->has_challenge());
  absl::StatusOr<std::string> hello = EncodeFrame(
      MakeHello(kSecret, challenge->challenge().nonce(), ControlRole::kTrainer, 0), 1 << 20);
  ASSERT_TRUE(hello.ok());
  FrameWriter writer;
  writer.EnqueueUnsealed(std::make_shared<const std::string>(*hello));
  ASSERT_TRUE(FlushFrames(good.fd.get(), writer, absl::Now() + absl::Seconds(5)).ok());
  absl::StatusOr<control::Frame> welcome = good.Read();
  ASSERT_TRUE(welcome.ok() && welcome->has_welcome()) << welcome.status();
}

// A raw trainer rank 0 of a 2-trainer job, welcomed and joined, with a real trainer rank 1 that
// joined too (so that the roster goes out and collectives are open).
struct RawMember {
  explicit RawMember(CoordinatorOptions options) {
    absl::StatusOr<std::unique_ptr<Coordinator>> started = Coordinator::Start(std::move(options));
    EXPECT_TRUE(started.ok()) << started.status();
    coordinator = *std::move(started);
    raw = std::make_unique<Raw>(coordinator->port());
    absl::StatusOr<control::Frame> challenge = raw->Read();
    EXPECT_TRUE(challenge.ok() && challenge->has_challenge());
    EXPECT_TRUE(
        raw->Write(MakeHello(kSecret, challenge->challenge().nonce(), ControlRole::kTrainer, 0))
            .ok());
    absl::StatusOr<control::Frame> welcome = raw->Read();
    EXPECT_TRUE(welcome.ok() && welcome->has_welcome()) << welcome.status();
    EXPECT_TRUE(raw->SealAsClient(challenge->challenge().nonce(), 0).ok());
    control::Frame join;
    join.mutable_join()->set_manifest("t");
    join.mutable_join()->set_address("a");
    EXPECT_TRUE(raw->Write(join).ok());
    std::thread other([&] {
      absl::StatusOr<std::unique_ptr<ControlClient>> c =
          ControlClient::Connect(ClientOptions(coordinator->port(), ControlRole::kTrainer, 1));
      EXPECT_TRUE(c.ok()) << c.status();
      EXPECT_TRUE((*c)->Join(JoinRequest{"t", "b", ""}, absl::Now() + absl::Seconds(5)).ok());
      peer = *std::move(c);
    });
    other.join();
    absl::StatusOr<control::Frame> roster = raw->Read();
    EXPECT_TRUE(roster.ok() && roster->has_roster()) << roster.status();
  }
  // Contribution #number of an AllGather with `payload`, not waiting for its result.
  void Contribute(uint64_t number, std::string payload) {
    EXPECT_TRUE(TryContribute(number, std::move(payload)).ok());
  }
  // Contribute, returning whether the frame went out (the coordinator may have closed it).
  absl::Status TryContribute(uint64_t number, std::string payload) {
    control::Frame frame;
    control::Contribute* c = frame.mutable_contribute();
    c->set_number(number);
    c->set_kind(control::COLLECTIVE_ALL_GATHER);
    c->set_timeout_ms(60000);
    c->set_payload(std::move(payload));
    return raw->Write(frame);
  }
  // The Reject that ends the connection (skipping heartbeats).
  absl::Status Refusal() {
    while (true) {
      absl::StatusOr<control::Frame> frame = raw->Read(absl::Seconds(5));
      if (!frame.ok()) return frame.status();
      if (frame->has_reject()) {
        return absl::Status(static_cast<absl::StatusCode>(frame->reject().code()),
                            frame->reject().reason());
      }
    }
  }

  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<Raw> raw;
  std::unique_ptr<ControlClient> peer;
};

TEST(CoordinatorBoundsTest, ContributionsFarAheadAreRefused) {
  CoordinatorOptions options = Options(2, 0);
  options.max_rounds_ahead = 4;
  RawMember member(options);
  for (uint64_t n = 0; n < 5; ++n) member.Contribute(n, "x");  // Trainer 1 contributes none.
  const absl::Status refused = member.Refusal();
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("would leave 5 contributions unanswered (at most 4)"));
  EXPECT_EQ(member.coordinator->counters().Refused(RefusalReason::kTooFarAhead), 1);
}

TEST(CoordinatorBoundsTest, PayloadBytesHeldPerProcessAreCapped) {
  CoordinatorOptions options = Options(2, 0);
  options.max_held_bytes_per_process = 10000;
  RawMember member(options);
  member.Contribute(0, std::string(6000, 'a'));
  member.Contribute(1, std::string(6000, 'b'));  // 12000 held: over the cap.
  const absl::Status refused = member.Refusal();
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("holding 12000 payload bytes (at most 10000)"));
}

// Rounds of 1 MiB AllGather payloads between `member`'s raw process 0, which never reads, and its
// real peer, with `pause` between rounds, until the peer's round fails (its error) or 100 rounds.
absl::Status RoundsUntilThePeerFails(RawMember& member, absl::Duration pause) {
  for (uint64_t n = 0; n < 100; ++n) {
    member.TryContribute(n, std::string(1 << 20, 'r')).IgnoreError();  // Lost: the peer says.
    absl::StatusOr<std::vector<std::string>> all =
        member.peer->AllGather(std::string(1 << 20, 'p'), absl::Now() + absl::Seconds(20));
    if (!all.ok()) return all.status();
    absl::SleepFor(pause);
  }
  return absl::OkStatus();
}

TEST(CoordinatorBoundsTest, AMemberThatNeverReadsIsLostOnceItsQueueIsFull) {
  CoordinatorOptions options = Options(2, 0);
  options.max_frame_bytes = 4 << 20;
  options.max_queued_bytes_per_connection = 8 << 20;
  RawMember member(options);
  const absl::Status failed = RoundsUntilThePeerFails(member, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("process 0 (trainer rank 0"));
  EXPECT_THAT(failed.message(), HasSubstr("did not read what the coordinator sent"));
  EXPECT_THAT(failed.message(), HasSubstr("would exceed the cap of 8388608"));
  // The stated bound: one connection's cap, plus the one result queued to the peer that reads.
  const CoordinatorCounters counters = member.coordinator->counters();
  EXPECT_GT(counters.peak_queued_bytes, 2 << 20);
  EXPECT_LE(counters.peak_queued_bytes,
            options.max_queued_bytes_per_connection + options.max_frame_bytes);
}

TEST(CoordinatorBoundsTest, AMemberThatStopsReadingIsLostAfterTheWriteStallTimeout) {
  CoordinatorOptions options = Options(2, 0);
  options.max_frame_bytes = 4 << 20;
  options.max_queued_bytes_per_connection = 512 << 20;
  options.write_stall_timeout = absl::Seconds(1);
  RawMember member(options);
  const absl::Status failed = RoundsUntilThePeerFails(member, absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("process 0 (trainer rank 0"));
  EXPECT_THAT(failed.message(), HasSubstr("did not read what the coordinator sent: took none of"));
}

TEST(CoordinatorBoundsTest, HugeHeartbeatsLeaveOnlyTheirKnownProgressFields) {
  RawMember member(Options(2, 0));
  // A progress report with 48 MiB of a field this coordinator does not know, three times.
  control::SyncProgress known;
  known.set_version(7);
  known.set_bytes_done(5);
  std::string bytes = known.SerializeAsString();
  const std::string padding(48 << 20, 'u');
  bytes += '\xa2';  // Field 100, length-delimited: varint 802.
  bytes += '\x06';
  uint64_t length = padding.size();
  for (; length >= 0x80; length >>= 7) bytes += static_cast<char>((length & 0x7f) | 0x80);
  bytes += static_cast<char>(length);
  bytes += padding;
  control::Frame heartbeat;
  ASSERT_TRUE(heartbeat.mutable_heartbeat()->mutable_progress()->ParseFromString(bytes));
  ASSERT_GT(heartbeat.ByteSizeLong(), padding.size());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(member.raw->Write(heartbeat).ok());
  StatusQuery query;
  query.port = member.coordinator->port();
  query.job_id = control_testing::kJob;
  query.secret = kSecret;
  control::JobStatusBody body;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up) {
    query.deadline = absl::Now() + absl::Seconds(5);
    absl::StatusOr<control::JobStatusBody> got = QueryJobStatus(query);
    ASSERT_TRUE(got.ok()) << got.status();
    body = *std::move(got);
    if (body.processes_size() > 0 && body.processes(0).progress().version() == 7) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GT(body.processes_size(), 0);
  EXPECT_EQ(body.processes(0).progress().version(), 7);
  EXPECT_EQ(body.processes(0).progress().bytes_done(), 5);
  EXPECT_LT(body.processes(0).progress().ByteSizeLong(), 64u);
  EXPECT_LT(body.ByteSizeLong(), 64u << 10);
  EXPECT_LT(member.coordinator->counters().peak_queued_bytes, 8 << 20);
}

TEST(CoordinatorBoundsTest, RefusesZeroLimits) {
  CoordinatorOptions options = Options(1, 0);
  options.max_pending_per_source = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(options).status()));
  options = Options(1, 0);
  options.max_rounds_ahead = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(options).status()));
  options = Options(1, 0);
  options.max_held_bytes_per_process = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(options).status()));
  options = Options(1, 0);
  options.max_queued_bytes_per_connection = options.max_frame_bytes;  // No room for the tag.
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(options).status()));
  options = Options(1, 0);
  options.write_stall_timeout = absl::ZeroDuration();
  EXPECT_TRUE(absl::IsInvalidArgument(Coordinator::Start(options).status()));
}

}  // namespace
}  // namespace wsync
