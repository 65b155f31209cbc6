#ifndef WSYNC_TESTS_UNIT_CONTROL_FAKE_COORDINATOR_H_
#define WSYNC_TESTS_UNIT_CONTROL_FAKE_COORDINATOR_H_

// A coordinator by hand, for client tests that need one that falls silent, resets or closes at a
// chosen moment (control_heartbeat_test, control_client_io_test). Test code.

#include <poll.h>
#include <sys/socket.h>

#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "control/auth.h"
#include "control/channel_keys.h"
#include "control/framing.h"
#include "control/protocol.h"
#include "control/socket.h"
#include "gtest/gtest.h"
#include "tests/unit/control_job.h"

namespace wsync::control_testing {

// The next frame on `fd` other than a heartbeat (a peer that offered heartbeats gets them).
inline absl::StatusOr<control::Frame> ReadSkippingHeartbeats(int fd, FrameReader& reader) {
  for (;;) {
    absl::StatusOr<control::Frame> frame = ReadFrame(fd, reader, absl::Now() + absl::Seconds(5));
    if (!frame.ok() || !frame->has_heartbeat()) return frame;
  }
}

// A coordinator by hand for one trainer (rank 0) of a job of one trainer and one rollout: accepts
// on `listener`, runs the handshake (heartbeats every `interval`, `silence_limit`, when the Hello
// offers them) and the rendezvous, and leaves the connection in `connection` once the roster was
// sent (invalid when a check failed). The rollout never connects; the roster names it.
inline void ServeUpToTheRoster(int listener, absl::Duration interval, absl::Duration silence_limit,
                               UniqueFd* connection, FrameReader* reader) {
  ASSERT_TRUE(PollOne(listener, POLLIN, absl::Now() + absl::Seconds(5)).ok());
  UniqueFd c(accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  ASSERT_TRUE(c.valid());
  const std::string nonce(kNonceBytes, 'n');
  FrameWriter writer;  // Seals every frame after the Welcome, as a coordinator does.
  auto write = [&](const control::Frame& frame) {
    return WriteFrame(c.get(), writer, frame, kDefaultMaxFrameBytes,
                      absl::Now() + absl::Seconds(5));
  };
  control::Frame frame;
  frame.mutable_challenge()->set_protocol_version(kControlProtocolVersion);
  frame.mutable_challenge()->set_nonce(nonce);
  ASSERT_TRUE(write(frame).ok());
  absl::StatusOr<control::Frame> hello = ReadSkippingHeartbeats(c.get(), *reader);
  ASSERT_TRUE(hello.ok() && hello->has_hello()) << hello.status();
  const bool heartbeats = hello->hello().heartbeats();
  frame.Clear();
  control::Welcome* welcome = frame.mutable_welcome();
  welcome->set_process(0);
  welcome->set_num_trainers(1);
  welcome->set_num_rollouts(1);
  welcome->set_max_frame_bytes(kDefaultMaxFrameBytes);
  if (heartbeats) {
    welcome->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(interval));
    welcome->set_silence_limit_ms(absl::ToInt64Milliseconds(silence_limit));
  }
  welcome->set_mac(
      WelcomeMac(kSecret, hello->hello().client_nonce(), nonce, kJob, WelcomeFieldsOf(*welcome)));
  ASSERT_TRUE(write(frame).ok());
  ASSERT_TRUE(SealChannel(ChannelSide::kCoordinator, kSecret, nonce, hello->hello().client_nonce(),
                          kJob, 0, "process 0", *reader, writer)
                  .ok());
  absl::StatusOr<control::Frame> join = ReadSkippingHeartbeats(c.get(), *reader);
  ASSERT_TRUE(join.ok() && join->has_join()) << join.status();
  frame.Clear();
  control::Roster* roster = frame.mutable_roster();
  roster->set_num_trainers(1);
  roster->set_num_rollouts(1);
  roster->add_blobs("manifest");
  for (int32_t id = 0; id < 2; ++id) {
    control::RosterEntry* entry = roster->add_processes();
    entry->set_process(id);
    entry->set_role(id == 0 ? control::ROLE_TRAINER : control::ROLE_ROLLOUT);
    entry->set_node_id(id == 0 ? hello->hello().node_id() : "node-r0");
  }
  ASSERT_TRUE(write(frame).ok());
  *connection = std::move(c);
}

}  // namespace wsync::control_testing

#endif  // WSYNC_TESTS_UNIT_CONTROL_FAKE_COORDINATOR_H_
