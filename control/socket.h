#ifndef WSYNC_CONTROL_SOCKET_H_
#define WSYNC_CONTROL_SOCKET_H_

// Small POSIX TCP helpers for the control plane: an owning descriptor, listening on a literal
// address, connecting with a deadline, and poll with a deadline. Every descriptor made here is
// non-blocking and close-on-exec. Thread-safe (no shared state).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace wsync {

// Owns one file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.Release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

absl::Status SetNonBlocking(int fd);
// TCP_NODELAY: control messages are small and latency-bound. Ignored for non-TCP sockets.
void SetNoDelay(int fd);

// True for the wildcard addresses "0.0.0.0" and "::" (any spelling inet_pton accepts).
bool IsAnyAddress(absl::string_view address);

// A listening TCP socket on the literal IPv4 or IPv6 `address` (no name lookup) and `port` (0 picks
// a free one). Wildcard addresses are refused (PermissionDenied) unless `allow_any_address`.
// `*bound_port` receives the port actually bound.
absl::StatusOr<UniqueFd> ListenTcp(absl::string_view address, int port, bool allow_any_address,
                                   int* bound_port);

// A connected TCP socket to `host` (a literal address or a name) and `port`. Refused or
// unreachable connections are retried with a short backoff until `deadline`; then
// DeadlineExceeded names the address and the last error. Name resolution uses getaddrinfo, whose
// own resolver timeouts apply before the deadline is checked.
absl::StatusOr<UniqueFd> ConnectTcp(absl::string_view host, int port, absl::Time deadline);

// "1.2.3.4:5678" or "[::1]:5678" for the peer of a connected socket; "unknown peer" on failure.
std::string PeerAddress(int fd);

// Milliseconds to pass to poll() to wait until `deadline`: 0 once it passed, rounded up,
// at most one minute (callers loop), -1 for an infinite deadline.
int PollTimeoutMs(absl::Time deadline);

// Waits until `fd` reports one of `events` (or an error or hang-up, which the following read or
// write then reports). DeadlineExceeded once `deadline` passes.
absl::Status PollOne(int fd, short events, absl::Time deadline);

}  // namespace wsync

#endif  // WSYNC_CONTROL_SOCKET_H_
