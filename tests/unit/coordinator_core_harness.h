#ifndef WSYNC_TESTS_UNIT_COORDINATOR_CORE_HARNESS_H_
#define WSYNC_TESTS_UNIT_COORDINATOR_CORE_HARNESS_H_

// Drives a CoordinatorCore (control/coordinator_core.h) without sockets for
// coordinator_core_test: a fake clock, connections that are ids, and per connection the frames the
// core queued to it (decoded; no sealing, which is the driver's) and how it was closed. Clients
// are played by the test with the real handshake MACs (auth.h). Test code.

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "control/auth.h"
#include "control/control.pb.h"
#include "control/coordinator_core.h"
#include "control/framing.h"
#include "control/protocol.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"

namespace wsync::core_testing {

using control_testing::kJob;
using control_testing::kSecret;
// Any fixed origin: the core reads no clock.
inline const absl::Time kStart = absl::FromUnixSeconds(1700000000);

// control_job.h's options (10 s handshake and rendezvous timeouts) for a job of 1..max_trainers
// trainers and 0..max_rollouts rollouts.
inline CoordinatorOptions RandomOptions(std::mt19937& rng, int32_t max_trainers,
                                        int32_t max_rollouts) {
  return control_testing::Options(1 + static_cast<int32_t>(rng() % max_trainers),
                                  static_cast<int32_t>(rng() % (max_rollouts + 1)));
}

// What the core did to one connection, in order.
struct PeerView {
  std::string nonce;                  // Of its Challenge.
  std::vector<control::Frame> inbox;  // Every frame queued to it (heartbeats included).
  bool sealed = false;
  bool closed = false;   // kClose: after its queued frames.
  bool dropped = false;  // kDrop: at once.
  std::optional<RefusalReason> refusal;
  std::string why;
  int32_t process = -1;  // From the Welcome.

  // Frames of `kind` in the inbox.
  std::vector<control::Frame> Of(control::Frame::KindCase kind) const {
    std::vector<control::Frame> out;
    for (const control::Frame& f : inbox) {
      if (f.kind_case() == kind) out.push_back(f);
    }
    return out;
  }
  bool ended() const { return closed || dropped; }
};

class Harness {
 public:
  explicit Harness(CoordinatorOptions options) : core(std::move(options), kStart) {}

  // Accepts a connection from `peer`; the core answers with a Challenge (or refuses it).
  ConnectionId Open(absl::string_view peer = "10.0.0.1:5000") {
    const ConnectionId id = next_id_++;
    std::string nonce(kNonceBytes, '\0');
    for (int i = 0; i < kNonceBytes; ++i) nonce[i] = static_cast<char>(id * 31 + i);
    core.Opened(now, id, peer, nonce);
    Apply();
    const std::vector<control::Frame> challenges = peers[id].Of(control::Frame::kChallenge);
    if (!challenges.empty()) peers[id].nonce = challenges[0].challenge().nonce();
    return id;
  }

  // A frame from the peer of `id`: heard, then received.
  void Deliver(ConnectionId id, const control::Frame& frame) {
    core.Heard(now, id);
    core.Received(now, id, frame);
    Apply();
  }
  void Deliver(ConnectionId id, absl::StatusOr<control::Frame> frame) {
    core.Heard(now, id);
    core.Received(now, id, std::move(frame));
    Apply();
  }

  // A Hello for (role, rank) answering the Challenge of `id`, MAC'd with `secret`.
  control::Frame Hello(ConnectionId id, ControlRole role, int32_t rank,
                       absl::string_view secret = kSecret, absl::string_view job = kJob) {
    control::Frame frame;
    control::Hello* h = frame.mutable_hello();
    h->set_protocol_version(kControlProtocolVersion);
    h->set_job_id(std::string(job));
    h->set_role(RoleToProto(role));
    h->set_rank(rank);
    h->set_node_id(absl::StrCat("node-", rank));
    h->set_client_nonce(std::string(kNonceBytes, static_cast<char>('a' + id % 26)));
    h->set_mac(HelloMac(secret, peers[id].nonce, h->client_nonce(), job, role, rank, h->node_id()));
    h->set_heartbeats(true);
    h->set_rendezvous_progress(true);
    return frame;
  }

  // Connects and welcomes process (role, rank); returns its connection.
  ConnectionId Welcomed(ControlRole role, int32_t rank) {
    const ConnectionId id = Open(absl::StrCat("10.0.", rank, ".1:", 5000 + rank));
    Deliver(id, Hello(id, role, rank));
    EXPECT_EQ(peers[id].Of(control::Frame::kWelcome).size(), 1u);
    return id;
  }

  void Join(ConnectionId id, std::string manifest, std::string address) {
    control::Frame frame;
    frame.mutable_join()->set_manifest(std::move(manifest));
    frame.mutable_join()->set_address(std::move(address));
    Deliver(id, frame);
  }

  // Every process connected, welcomed and joined; connections by global process id.
  std::vector<ConnectionId> JoinAll() {
    std::vector<ConnectionId> ids;
    const CoordinatorOptions& o = core.options();
    for (int32_t p = 0; p < o.num_trainers + o.num_rollouts; ++p) {
      const bool trainer = p < o.num_trainers;
      ids.push_back(Welcomed(trainer ? ControlRole::kTrainer : ControlRole::kRollout,
                             trainer ? p : p - o.num_trainers));
    }
    for (size_t p = 0; p < ids.size(); ++p) Join(ids[p], "layout", absl::StrCat("addr-", p));
    return ids;
  }

  void Contribute(ConnectionId id, uint64_t number, std::string payload, int64_t timeout_ms = 60000,
                  int kind = control::COLLECTIVE_ALL_GATHER) {
    control::Frame frame;
    control::Contribute* c = frame.mutable_contribute();
    c->set_number(number);
    c->set_kind(static_cast<control::CollectiveKind>(kind));
    c->set_payload(std::move(payload));
    c->set_timeout_ms(timeout_ms);
    c->set_ok(true);
    Deliver(id, frame);
  }

  // The fake clock moves by `d`; the core's timers run.
  void Advance(absl::Duration d) {
    now += d;
    core.Tick(now);
    Apply();
  }

  void Apply() {
    for (CoordinatorAction& a : core.TakeActions()) {
      PeerView& p = peers[a.connection];
      EXPECT_FALSE(p.ended()) << "an action for connection " << a.connection << " after its end";
      switch (a.kind) {
        case CoordinatorAction::Kind::kSend:
        case CoordinatorAction::Kind::kHeartbeat: {
          absl::StatusOr<control::Frame> f = DecodeFrameBody(a.frame->body());
          EXPECT_TRUE(f.ok()) << f.status();
          if (f.ok()) p.inbox.push_back(*std::move(f));
          break;
        }
        case CoordinatorAction::Kind::kSeal:
          EXPECT_FALSE(p.sealed);
          p.sealed = true;
          p.process = a.process;
          EXPECT_EQ(a.nonce, p.nonce);
          break;
        case CoordinatorAction::Kind::kClose:
          p.closed = true;
          p.refusal = a.refusal;
          p.why = a.why;
          break;
        case CoordinatorAction::Kind::kDrop:
          p.dropped = true;
          p.why = a.why;
          break;
      }
    }
  }

  CoordinatorCore core;
  absl::Time now = kStart;
  std::map<ConnectionId, PeerView> peers;

 private:
  ConnectionId next_id_ = 1;
};

// The last Reject queued to a peer, as a status.
inline absl::Status RejectOf(const PeerView& p) {
  const std::vector<control::Frame> rejects = p.Of(control::Frame::kReject);
  if (rejects.empty()) return absl::OkStatus();
  return StatusFromWire(rejects.back().reject().code(), rejects.back().reject().reason());
}

}  // namespace wsync::core_testing

#endif  // WSYNC_TESTS_UNIT_COORDINATOR_CORE_HARNESS_H_
