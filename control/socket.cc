#include "control/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wsync {
namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

// Parses a literal IPv4 or IPv6 address into `storage`; false when it is not a literal.
bool ParseLiteral(absl::string_view address, int port, sockaddr_storage* storage,
                  socklen_t* length) {
  const std::string text(address);
  std::memset(storage, 0, sizeof(*storage));
  auto* v4 = reinterpret_cast<sockaddr_in*>(storage);
  if (inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(storage);
  if (inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

std::string FormatAddress(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", ntohs(v4->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", ntohs(v6->sin6_port));
  }
  return "unknown peer";
}

// One non-blocking connect attempt; OK when connected, else the errno of the failure (or
// ETIMEDOUT when the deadline passed while connecting).
int ConnectOnce(const sockaddr* address, socklen_t length, absl::Time deadline, UniqueFd* out) {
  UniqueFd fd(socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  if (connect(fd.get(), address, length) != 0) {
    if (errno != EINPROGRESS) return errno;
    if (!PollOne(fd.get(), POLLOUT, deadline).ok()) return ETIMEDOUT;
    int error = 0;
    socklen_t error_length = sizeof(error);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &error_length) != 0) return errno;
    if (error != 0) return error;
  }
  SetNoDelay(fd.get());
  *out = std::move(fd);
  return 0;
}

}  // namespace

void UniqueFd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("control: fcntl(O_NONBLOCK): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool IsAnyAddress(absl::string_view address) {
  sockaddr_storage storage;
  socklen_t length = 0;
  if (!ParseLiteral(address, 0, &storage, &length)) return false;
  if (storage.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  const auto& v6 = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
  return IN6_IS_ADDR_UNSPECIFIED(&v6);
}

absl::StatusOr<UniqueFd> ListenTcp(absl::string_view address, int port, bool allow_any_address,
                                   int* bound_port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("control: port ", port, " out of range"));
  }
  sockaddr_storage storage;
  socklen_t length = 0;
  if (!ParseLiteral(address, port, &storage, &length)) {
    return absl::InvalidArgumentError(absl::StrCat("control: listen address '", address,
                                                   "' is not a literal IPv4 or IPv6 address"));
  }
  if (IsAnyAddress(address) && !allow_any_address) {
    return absl::PermissionDeniedError(
        absl::StrCat("control: refusing to listen on the wildcard address '", address,
                     "'; set allow_any_address to listen on every interface"));
  }
  UniqueFd fd(socket(storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("control: socket: ", ErrnoText(errno)));
  }
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&storage), length) != 0) {
    return absl::UnavailableError(
        absl::StrCat("control: bind to ", address, ":", port, ": ", ErrnoText(errno)));
  }
  if (listen(fd.get(), SOMAXCONN) != 0) {
    return absl::InternalError(absl::StrCat("control: listen: ", ErrnoText(errno)));
  }
  sockaddr_storage bound;
  socklen_t bound_length = sizeof(bound);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_length) != 0) {
    return absl::InternalError(absl::StrCat("control: getsockname: ", ErrnoText(errno)));
  }
  *bound_port = bound.ss_family == AF_INET
                    ? ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port)
                    : ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
  return fd;
}

absl::StatusOr<UniqueFd> ConnectTcp(absl::string_view host, int port, absl::Time deadline) {
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("control: port ", port, " out of range"));
  }
  const std::string where = absl::StrCat(host, ":", port);
  absl::Duration backoff = absl::Milliseconds(10);
  std::string last_error = "no attempt";
  for (;;) {
    addrinfo hints = {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string host_text(host);
    const std::string port_text = absl::StrCat(port);
    const int rc = getaddrinfo(host_text.c_str(), port_text.c_str(), &hints, &found);
    if (rc != 0) {
      last_error = gai_strerror(rc);
      if (rc != EAI_AGAIN) {
        return absl::InvalidArgumentError(
            absl::StrCat("control: cannot resolve ", where, ": ", last_error));
      }
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        UniqueFd fd;
        const int error = ConnectOnce(a->ai_addr, a->ai_addrlen, deadline, &fd);
        if (error == 0) {
          freeaddrinfo(found);
          return fd;
        }
        last_error = ErrnoText(error);
      }
      freeaddrinfo(found);
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("control: could not connect to ", where, " before the deadline: ", last_error));
}

std::string PeerAddress(int fd) {
  sockaddr_storage storage;
  socklen_t length = sizeof(storage);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
    return "unknown peer";
  }
  return FormatAddress(reinterpret_cast<const sockaddr*>(&storage));
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 60000));
}

absl::Status PollOne(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p = {fd, events, 0};
    const int timeout = PollTimeoutMs(deadline);
    const int rc = poll(&p, 1, timeout);
    if (rc > 0) return absl::OkStatus();
    if (rc < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("control: poll: ", ErrnoText(errno)));
    }
    if (rc == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError("control: deadline passed");
    }
  }
}

}  // namespace wsync
