#ifndef WSYNC_TESTS_UNIT_CONTROL_PROXY_H_
#define WSYNC_TESTS_UNIT_CONTROL_PROXY_H_

// An on-path attacker for the control-channel tests: a TCP proxy between one client and the
// coordinator that holds no secret. It forwards whole frames (by their 4-byte length; it never
// needs the keys) and lets a hook replace each frame with any list of frames: the same (honest),
// none (held), several (replayed), altered ones, or frames captured elsewhere (spliced). Test
// code.

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "control/socket.h"
#include "gtest/gtest.h"

namespace wsync::control_testing {

enum class Direction { kToCoordinator = 0, kToClient = 1 };

// Frames before the channel is sealed: the Hello one way; the Challenge and the Welcome the other.
inline int64_t HandshakeFrames(Direction direction) {
  return direction == Direction::kToCoordinator ? 1 : 2;
}

class Proxy {
 public:
  // Given the direction, the frame's index in that direction (from 0, handshake included) and the
  // frame (header included), returns what to forward in its place. Runs on the proxy's thread.
  using Hook = std::function<std::vector<std::string>(Direction, int64_t, const std::string&)>;

  // Listens on a loopback port of its own (port()); the first connection to it is relayed to the
  // coordinator at `coordinator_port`.
  Proxy(int coordinator_port, Hook hook) : hook_(std::move(hook)) {
    absl::StatusOr<UniqueFd> listener = ListenTcp("127.0.0.1", 0, false, &port_);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    thread_ = std::thread([this, coordinator_port] { Run(coordinator_port); });
  }
  ~Proxy() {
    stop_.store(true);
    thread_.join();
  }
  int port() const { return port_; }

  // Every frame that arrived in `direction` so far, in order (what the hook was given).
  std::vector<std::string> Seen(Direction direction) const {
    absl::MutexLock lock(&mu_);
    return seen_[static_cast<int>(direction)];
  }
  // Waits until `count` frames arrived in `direction`; false after 10 s.
  bool WaitForFrames(Direction direction, size_t count) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return seen_[static_cast<int>(direction)].size() >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }

 private:
  struct Side {
    UniqueFd fd;
    std::string pending;  // Bytes read from this side, not yet a whole frame.
  };

  void Run(int coordinator_port) {
    if (PollOne(listener_.get(), POLLIN, absl::Now() + absl::Seconds(10)).ok()) {
      Side sides[2];
      sides[0].fd = UniqueFd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      absl::StatusOr<UniqueFd> coordinator =
          ConnectTcp("127.0.0.1", coordinator_port, absl::Now() + absl::Seconds(5));
      if (sides[0].fd.valid() && coordinator.ok()) {
        sides[1].fd = *std::move(coordinator);
        Relay(sides);
      }
    }
  }

  // sides[0]: the client; sides[1]: the coordinator. Until either end closes or the proxy stops.
  void Relay(Side* sides) {
    while (!stop_.load()) {
      pollfd fds[2] = {{sides[0].fd.get(), POLLIN, 0}, {sides[1].fd.get(), POLLIN, 0}};
      if (poll(fds, 2, 20) <= 0) continue;
      for (int from = 0; from < 2; ++from) {
        if (fds[from].revents == 0) continue;
        char buffer[1 << 16];
        const ssize_t got = recv(sides[from].fd.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
          // One end closed: so does the other (as an attacker that drops the connection would).
          shutdown(sides[1 - from].fd.get(), SHUT_RDWR);
          return;
        }
        if (got < 0) continue;
        sides[from].pending.append(buffer, static_cast<size_t>(got));
        const Direction direction = from == 0 ? Direction::kToCoordinator : Direction::kToClient;
        if (!Forward(direction, sides[from].pending, sides[1 - from].fd.get())) return;
      }
    }
  }

  // Passes every whole frame in `pending` through the hook to `to`. False when `to` failed.
  bool Forward(Direction direction, std::string& pending, int to) {
    for (;;) {
      if (pending.size() < 4) return true;
      const auto byte = [&](int i) {
        return static_cast<uint32_t>(static_cast<uint8_t>(pending[i]));
      };
      const size_t length = (byte(0) << 24) | (byte(1) << 16) | (byte(2) << 8) | byte(3);
      if (pending.size() < 4 + length) return true;
      const std::string frame = pending.substr(0, 4 + length);
      pending.erase(0, 4 + length);
      int64_t index;
      {
        absl::MutexLock lock(&mu_);
        std::vector<std::string>& seen = seen_[static_cast<int>(direction)];
        index = static_cast<int64_t>(seen.size());
        seen.push_back(frame);
      }
      for (const std::string& out : hook_(direction, index, frame)) {
        if (!SendAll(to, out)) return false;
      }
    }
  }

  static bool SendAll(int fd, const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
          PollOne(fd, POLLOUT, absl::Now() + absl::Seconds(5)).ok()) {
        continue;
      }
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  Hook hook_;
  UniqueFd listener_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::vector<std::string> seen_[2];
  std::thread thread_;
};

}  // namespace wsync::control_testing

#endif  // WSYNC_TESTS_UNIT_CONTROL_PROXY_H_
