#ifndef WSYNC_TESTS_UNIT_CONTROL_JOB_H_
#define WSYNC_TESTS_UNIT_CONTROL_JOB_H_

// A coordinator and its connected, joined clients for the control-plane tests (control_test,
// control_rounds_test); every client thread-per-process through Parallel. Test code.

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "control/auth.h"
#include "control/channel_keys.h"
#include "control/client.h"
#include "control/coordinator.h"
#include "control/framing.h"
#include "control/protocol.h"
#include "control/socket.h"
#include "gtest/gtest.h"

namespace wsync::control_testing {

inline constexpr char kSecret[] = "correct-horse-battery-staple-42-0123";
inline constexpr char kJob[] = "job-1";
// For tests that wait for a silent connection's handshake to time out: short enough to wait for,
// long enough for the connections that do complete theirs on a loaded machine.
inline constexpr absl::Duration kShortHandshakeTimeout = absl::Seconds(2);

inline CoordinatorOptions Options(int32_t trainers, int32_t rollouts) {
  CoordinatorOptions o;
  o.job_id = kJob;
  o.secret = kSecret;
  o.num_trainers = trainers;
  o.num_rollouts = rollouts;
  // Every connection a test makes completes its handshake well within this, even under a
  // sanitizer on a loaded machine (300 ms did not: a raw connection was refused mid-test). Tests of
  // the handshake timeout set their own (kShortHandshakeTimeout).
  o.handshake_timeout = absl::Seconds(10);
  o.rendezvous_timeout = absl::Seconds(10);
  return o;
}

inline ControlClientOptions ClientOptions(int port, ControlRole role, int32_t rank) {
  ControlClientOptions o;
  o.coordinator_port = port;
  o.job_id = kJob;
  o.role = role;
  o.rank = rank;
  o.node_id = absl::StrCat("node-", role == ControlRole::kTrainer ? "t" : "r", rank / 2);
  o.secret = kSecret;
  o.connect_timeout = absl::Seconds(5);
  return o;
}

// Runs fn(i) on one thread per i in [0, n) and joins them.
inline void Parallel(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (auto& t : threads) t.join();
}

// A started coordinator with every process connected and joined.
struct Job {
  std::unique_ptr<Coordinator> coordinator;
  std::vector<std::unique_ptr<ControlClient>> clients;
  std::vector<Roster> rosters;
};

inline Job StartJob(int32_t trainers, int32_t rollouts, CoordinatorOptions options) {
  Job job;
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Start(std::move(options));
  EXPECT_TRUE(c.ok()) << c.status();
  job.coordinator = *std::move(c);
  const int world = trainers + rollouts;
  job.clients.resize(world);
  job.rosters.resize(world);
  Parallel(world, [&](int id) {
    const bool trainer = id < trainers;
    absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Connect(ClientOptions(
        job.coordinator->port(), trainer ? ControlRole::kTrainer : ControlRole::kRollout,
        trainer ? id : id - trainers));
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_EQ((*client)->process(), id);
    JoinRequest request;
    request.manifest = trainer ? "trainer-manifest" : "rollout-manifest";
    request.address = absl::StrCat("address-", id);
    request.metadata = "metadata";
    absl::StatusOr<Roster> roster = (*client)->Join(request, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(roster.ok()) << roster.status();
    job.rosters[id] = *std::move(roster);
    job.clients[id] = *std::move(client);
  });
  return job;
}

// The bytes of MakeHello's client nonce.
inline constexpr char kManualClientNonce = 'c';

// A Hello built by hand, for replays, bad fields and processes that go silent. `heartbeats`: it
// offers heartbeats (and then never sends any unless the test does).
inline control::Frame MakeHello(absl::string_view secret, absl::string_view nonce, ControlRole role,
                                int32_t rank, int role_value = 0, bool heartbeats = false) {
  control::Frame frame;
  control::Hello* h = frame.mutable_hello();
  h->set_protocol_version(kControlProtocolVersion);
  h->set_job_id(kJob);
  h->set_role(static_cast<control::Role>(role_value != 0 ? role_value : int(RoleToProto(role))));
  h->set_rank(rank);
  h->set_node_id("manual-node");
  const std::string client_nonce(kNonceBytes, kManualClientNonce);
  h->set_client_nonce(client_nonce);
  h->set_mac(HelloMac(secret, nonce, client_nonce, kJob, role, rank, "manual-node"));
  h->set_heartbeats(heartbeats);
  return frame;
}

// A raw connection to the coordinator, driven frame by frame.
struct Raw {
  explicit Raw(int port) {
    absl::StatusOr<UniqueFd> c = ConnectTcp("127.0.0.1", port, absl::Now() + absl::Seconds(2));
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) fd = *std::move(c);
  }
  absl::StatusOr<control::Frame> Read(absl::Duration wait = absl::Seconds(3)) {
    return ReadFrame(fd.get(), reader, absl::Now() + wait);
  }
  // Sends `frame` (sealed after SealAsClient).
  absl::Status Write(const control::Frame& frame) {
    return WriteFrame(fd.get(), writer, frame, kDefaultMaxFrameBytes,
                      absl::Now() + absl::Seconds(5));
  }
  // After the Welcome to a MakeHello (job secret kSecret) that answered the challenge `nonce` and
  // was welcomed as `process`: seals and opens every later frame, as a ControlClient does.
  absl::Status SealAsClient(absl::string_view nonce, int32_t process) {
    return SealChannel(ChannelSide::kClient, kSecret, nonce,
                       std::string(kNonceBytes, kManualClientNonce), kJob, process,
                       "the coordinator", reader, writer);
  }
  UniqueFd fd;
  FrameReader reader{kDefaultMaxFrameBytes};
  FrameWriter writer;
};

}  // namespace wsync::control_testing

#endif  // WSYNC_TESTS_UNIT_CONTROL_JOB_H_
