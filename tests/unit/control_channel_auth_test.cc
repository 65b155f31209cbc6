// The control channel after the handshake (issue 26): every frame in either direction is sealed
// with its connection's key for that direction and its sequence number (framing.h, frame_seal.h,
// channel_keys.h), so an on-path attacker without the secret cannot replay a frame, reorder two,
// splice in one sealed for another connection, or alter one byte of a body or tag. Each attack
// runs against a real coordinator and real clients over loopback, through a proxy that holds no
// secret (control_proxy.h); the attacked process's call fails with Unauthenticated naming the peer
// whose frame failed, and the rest of the job (an honest process behind a proxy of its own, and the
// attacked rank joining again) still completes its rendezvous and collectives.
//
// The bug these tests catch: before protocol 3 only the handshake carried proofs; each attack below
// then went unnoticed (checked by hand on the code before the fix: every case failed, the attacked
// Join waiting for its deadline instead of failing with Unauthenticated).

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"
#include "tests/unit/control_proxy.h"

namespace wsync {
namespace {

using control_testing::ClientOptions;
using control_testing::Direction;
using control_testing::HandshakeFrames;
using control_testing::kSecret;
using control_testing::MakeHello;
using control_testing::Options;
using control_testing::Parallel;
using control_testing::Proxy;
using control_testing::Raw;
using ::testing::HasSubstr;

constexpr size_t kTagBytes = 32;  // frame_seal.h: kFrameTagBytes.

enum class Attack { kReplay, kReorder, kSplice, kFlipBody, kFlipTag };

struct Case {
  Direction direction;
  Attack attack;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  static const char* const kAttacks[] = {"Replay", "Reorder", "Splice", "FlipBody", "FlipTag"};
  return absl::StrCat(
      kAttacks[static_cast<int>(info.param.attack)],
      info.param.direction == Direction::kToCoordinator ? "ToCoordinator" : "ToClient");
}

// Whether a frame (header included) is a Heartbeat, sealed or not: the attacks pick heartbeats,
// whose bodies are all alike, so that only the sequence number or the key tells them apart.
bool IsHeartbeat(const std::string& frame) {
  const std::string body = frame.substr(4);
  control::Frame parsed;
  if (body.size() >= kTagBytes &&
      parsed.ParseFromArray(body.data(), static_cast<int>(body.size() - kTagBytes)) &&
      parsed.has_heartbeat()) {
    return true;
  }
  parsed.Clear();
  return parsed.ParseFromArray(body.data(), static_cast<int>(body.size())) &&
         parsed.has_heartbeat();
}

// The attacker's hook: forwards everything, except that the attack is done once on the heartbeats
// of its direction after the handshake.
class Attacker {
 public:
  Attacker(Case attack, const Proxy* donor) : case_(attack), donor_(donor) {}

  std::vector<std::string> operator()(Direction direction, int64_t index, std::string frame) {
    if (direction != case_.direction || done_ || index < HandshakeFrames(direction) ||
        !IsHeartbeat(frame)) {
      return {frame};
    }
    const int64_t beat = beats_++;
    switch (case_.attack) {
      case Attack::kReplay:  // The first heartbeat, captured, is sent again after the second.
        if (beat == 0) {
          captured_ = frame;
          return {frame};
        }
        done_ = true;
        return {frame, captured_};
      case Attack::kReorder:  // The first two heartbeats, swapped.
        if (beat == 0) {
          captured_ = frame;
          return {};
        }
        done_ = true;
        return {frame, captured_};
      case Attack::kSplice: {  // The donor connection's frame of the same sequence number.
        done_ = true;
        EXPECT_TRUE(donor_->WaitForFrames(direction, static_cast<size_t>(index) + 1));
        const std::vector<std::string> seen = donor_->Seen(direction);
        if (static_cast<size_t>(index) >= seen.size()) return {frame};
        return {seen[static_cast<size_t>(index)]};
      }
      case Attack::kFlipBody:
        done_ = true;
        frame[4] = static_cast<char>(frame[4] ^ 0x01);
        return {frame};
      case Attack::kFlipTag:
        done_ = true;
        frame.back() = static_cast<char>(frame.back() ^ 0x01);
        return {frame};
    }
    return {frame};
  }

 private:
  const Case case_;
  const Proxy* const donor_;
  bool done_ = false;
  int64_t beats_ = 0;
  std::string captured_;
};

std::vector<std::string> Honest(Direction, int64_t, const std::string& frame) { return {frame}; }

// Connects, retrying while the coordinator still holds the rank of a connection it has not seen
// close yet (AlreadyExists).
std::unique_ptr<ControlClient> ConnectRetrying(const ControlClientOptions& options) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (;;) {
    absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(options);
    if (client.ok()) return *std::move(client);
    if (!absl::IsAlreadyExists(client.status()) || absl::Now() >= deadline) {
      ADD_FAILURE() << client.status();
      return nullptr;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

class ControlChannelAuthTest : public ::testing::TestWithParam<Case> {};

// Trainer 0 (honest, behind a proxy of its own: the donor of spliced frames) joins; rollout 0
// (process 2) joins through the attacker and is refused; trainer 1 and a new rollout 0 join
// directly, and all three run collectives.
TEST_P(ControlChannelAuthTest, AnAttackedFrameIsRefusedAndTheHonestJobStillSyncs) {
  const Case c = GetParam();
  CoordinatorOptions options = Options(2, 1);
  options.heartbeat_interval = absl::Milliseconds(20);
  options.silence_limit = absl::Seconds(10);
  options.rendezvous_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = (*coordinator)->port();

  std::vector<std::unique_ptr<ControlClient>> clients(3);
  std::vector<Roster> rosters(3);
  Proxy donor_proxy(port, Honest);
  std::thread donor([&] {
    ControlClientOptions o = ClientOptions(donor_proxy.port(), ControlRole::kTrainer, 0);
    o.rendezvous_progress = false;  // Heartbeats only, until the roster.
    absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<Roster> roster = (*client)->Join(JoinRequest{"trainer-manifest", "donor", ""},
                                                    absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(roster.ok()) << roster.status();
    rosters[0] = *std::move(roster);
    clients[0] = *std::move(client);
  });
  // A few sealed frames each way, for the splice.
  ASSERT_TRUE(donor_proxy.WaitForFrames(Direction::kToClient, 6));
  ASSERT_TRUE(donor_proxy.WaitForFrames(Direction::kToCoordinator, 5));

  Attacker attacker(c, &donor_proxy);
  {
    Proxy victim_proxy(port, [&](Direction d, int64_t i, const std::string& frame) {
      return attacker(d, i, frame);
    });
    ControlClientOptions o = ClientOptions(victim_proxy.port(), ControlRole::kRollout, 0);
    o.rendezvous_progress = false;
    absl::StatusOr<std::unique_ptr<ControlClient>> victim = ControlClient::Connect(o);
    ASSERT_TRUE(victim.ok()) << victim.status();
    const absl::Status joined =
        (*victim)
            ->Join(JoinRequest{"rollout-manifest", "victim", ""}, absl::Now() + absl::Seconds(8))
            .status();
    EXPECT_TRUE(absl::IsUnauthenticated(joined)) << joined;
    std::printf("%s\n", std::string(joined.message()).c_str());
    EXPECT_THAT(joined.message(),
                HasSubstr("failed authentication: forged, replayed or reordered"));
    if (c.direction == Direction::kToClient) {
      // The sealed frames to the client before the roster are heartbeats, numbered from 0: the
      // replay is the third frame received (after the first two), every other attack the first.
      const int expected_number = c.attack == Attack::kReplay ? 2 : 0;
      EXPECT_THAT(joined.message(),
                  HasSubstr(absl::StrCat("control frame ", expected_number,
                                         " from the coordinator 127.0.0.1:", victim_proxy.port(),
                                         " failed authentication")));
    } else {
      EXPECT_THAT(joined.message(), HasSubstr("from process 2 (rollout rank 0, node node-r0)"));
      EXPECT_EQ((*coordinator)->counters().Refused(RefusalReason::kAuthenticationFailed), 1);
    }
  }  // The victim and its proxy are gone.

  Parallel(2, [&](int i) {
    const int id = i + 1;  // Trainer 1, then rollout 0 again.
    const bool trainer = id == 1;
    std::unique_ptr<ControlClient> client = ConnectRetrying(ClientOptions(
        port, trainer ? ControlRole::kTrainer : ControlRole::kRollout, trainer ? 1 : 0));
    ASSERT_NE(client, nullptr);
    absl::StatusOr<Roster> roster =
        client->Join(JoinRequest{trainer ? "trainer-manifest" : "rollout-manifest",
                                 absl::StrCat("address-", id), ""},
                     absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(roster.ok()) << roster.status();
    rosters[id] = *std::move(roster);
    clients[id] = std::move(client);
  });
  donor.join();
  for (int id = 0; id < 3; ++id) ASSERT_NE(clients[id], nullptr) << id;
  EXPECT_EQ(rosters[0].processes[2].address, "address-2");
  Parallel(3, [&](int id) {
    for (int round = 0; round < 3; ++round) {
      absl::StatusOr<std::vector<std::string>> all =
          clients[id]->AllGather(absl::StrCat(id, "@", round), absl::Now() + absl::Seconds(30));
      ASSERT_TRUE(all.ok()) << all.status();
      EXPECT_EQ(*all,
                (std::vector<std::string>{absl::StrCat(0, "@", round), absl::StrCat(1, "@", round),
                                          absl::StrCat(2, "@", round)}));
    }
    EXPECT_TRUE(clients[id]->Barrier(absl::Now() + absl::Seconds(30)).ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Attacks, ControlChannelAuthTest,
                         ::testing::Values(Case{Direction::kToCoordinator, Attack::kReplay},
                                           Case{Direction::kToCoordinator, Attack::kReorder},
                                           Case{Direction::kToCoordinator, Attack::kSplice},
                                           Case{Direction::kToCoordinator, Attack::kFlipBody},
                                           Case{Direction::kToCoordinator, Attack::kFlipTag},
                                           Case{Direction::kToClient, Attack::kReplay},
                                           Case{Direction::kToClient, Attack::kReorder},
                                           Case{Direction::kToClient, Attack::kSplice},
                                           Case{Direction::kToClient, Attack::kFlipBody},
                                           Case{Direction::kToClient, Attack::kFlipTag}),
                         CaseName);

bool IsContribute(const std::string& frame) {
  const std::string body = frame.substr(4);
  control::Frame parsed;
  return body.size() >= kTagBytes &&
         parsed.ParseFromArray(body.data(), static_cast<int>(body.size() - kTagBytes)) &&
         parsed.has_contribute();
}

// After the rendezvous, trainer 1's first contribution is replayed to the coordinator. The
// coordinator refuses the connection and handles trainer 1 as lost: trainer 0 is told at once,
// naming it and why, and its collective fails naming it; a replacement joins and the job syncs.
TEST(ControlChannelAfterRendezvousTest, AReplayedContributionLosesTheProcessAndTheJobRecovers) {
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Start(Options(2, 0));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = (*coordinator)->port();
  bool replayed = false;
  Proxy proxy(port, [&](Direction d, int64_t, const std::string& frame) {
    if (d != Direction::kToCoordinator || replayed || !IsContribute(frame)) {
      return std::vector<std::string>{frame};
    }
    replayed = true;
    return std::vector<std::string>{frame, frame};
  });
  std::vector<std::unique_ptr<ControlClient>> clients(2);
  Parallel(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(
        ClientOptions(rank == 0 ? port : proxy.port(), ControlRole::kTrainer, rank));
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)
                    ->Join(JoinRequest{"trainer-manifest", absl::StrCat("address-", rank), ""},
                           absl::Now() + absl::Seconds(10))
                    .ok());
    clients[rank] = *std::move(client);
  });
  ASSERT_NE(clients[0], nullptr);
  ASSERT_NE(clients[1], nullptr);

  const absl::Status attacked =
      clients[1]->AllGather("one", absl::Now() + absl::Seconds(10)).status();
  EXPECT_TRUE(absl::IsUnauthenticated(attacked)) << attacked;
  EXPECT_THAT(attacked.message(), HasSubstr("from process 1 (trainer rank 1, node node-t0) failed "
                                            "authentication: forged, replayed or reordered"));
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (clients[0]->loss_count() == 0 && absl::Now() < give_up) {
    ASSERT_TRUE(clients[0]->WatchLosses(absl::Now() + absl::Milliseconds(100), -1).ok());
  }
  const std::vector<LossNotice> notices = clients[0]->LossesSince(0);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].process, 1);
  EXPECT_THAT(notices[0].reason, HasSubstr("process 1 (trainer rank 1, node node-t0) was lost: "
                                           "refused: control frame "));
  EXPECT_THAT(notices[0].reason, HasSubstr("failed authentication"));
  const absl::Status failed =
      clients[0]->AllGather("zero", absl::Now() + absl::Seconds(10)).status();
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("process 1 (trainer rank 1"));
  EXPECT_EQ((*coordinator)->counters().Refused(RefusalReason::kAuthenticationFailed), 1);
  EXPECT_EQ((*coordinator)->counters().lost, 1);

  clients[1] = ConnectRetrying(ClientOptions(port, ControlRole::kTrainer, 1));
  ASSERT_NE(clients[1], nullptr);
  absl::StatusOr<Roster> roster = clients[1]->Join(
      JoinRequest{"trainer-manifest", "address-1-new", ""}, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(roster.ok()) << roster.status();
  EXPECT_EQ(roster->epoch, 1u);
  Parallel(2, [&](int rank) {
    absl::StatusOr<std::vector<std::string>> all =
        clients[rank]->AllGather(absl::StrCat("again", rank), absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(*all, (std::vector<std::string>{"again0", "again1"}));
  });
}

// A peer of protocol version 2 (no sealed frames) is refused by its version, saying which.
TEST(ControlChannelVersionTest, AVersion2HelloIsRefusedByVersion) {
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Start(Options(1, 0));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  Raw raw((*coordinator)->port());
  absl::StatusOr<control::Frame> challenge = raw.Read();
  ASSERT_TRUE(challenge.ok() && challenge->has_challenge()) << challenge.status();
  control::Frame hello =
      MakeHello(kSecret, challenge->challenge().nonce(), ControlRole::kTrainer, 0);
  hello.mutable_hello()->set_protocol_version(2);
  ASSERT_TRUE(raw.Write(hello).ok());
  absl::StatusOr<control::Frame> reject = raw.Read();
  ASSERT_TRUE(reject.ok() && reject->has_reject()) << reject.status();
  EXPECT_THAT(reject->reject().reason(),
              HasSubstr("protocol version 2 is not supported; the coordinator speaks version 3"));
  EXPECT_EQ((*coordinator)->counters().Refused(RefusalReason::kProtocolVersion), 1);
}

}  // namespace
}  // namespace wsync
