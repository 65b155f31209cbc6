// The coordinator's poll loop: owns the listening socket, every connection's socket, reader and
// writer, and the clock, and drives the protocol core (coordinator_core.h) with what they report.
// Everything about who is admitted, when rounds complete and who is lost is the core's.

#include "control/coordinator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/status.h"
#include "control/auth.h"
#include "control/channel_keys.h"
#include "control/coordinator_core.h"
#include "control/protocol.h"
#include "control/socket.h"

namespace wsync {
namespace {

constexpr int kMaxFramesPerTurn = 8;  // Per connection and poll turn, for fairness.
constexpr int kMaxAcceptsPerTurn = 64;
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);  // After EMFILE and the like.

}  // namespace

// Everything below runs on the serving thread, except RequestStop, counters and
// rendezvous_status (any thread).
class Coordinator::Impl {
 public:
  Impl(CoordinatorOptions options, UniqueFd listen_fd, UniqueFd wake_fd)
      : listen_fd_(std::move(listen_fd)),
        wake_fd_(std::move(wake_fd)),
        core_(std::move(options), absl::Now()) {}

  void Run();
  // Closes every connection (best-effort Reject). Also the serving thread's exception firewall.
  void Shutdown();
  void RequestStop() {
    stop_.store(true);
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof(one));
  }
  CoordinatorCounters counters() const {
    CoordinatorCounters counters = core_.counters();
    counters.queued_bytes = queued_bytes_.load(std::memory_order_relaxed);
    counters.peak_queued_bytes = peak_queued_bytes_.load(std::memory_order_relaxed);
    return counters;
  }
  absl::Status rendezvous_status() const { return core_.rendezvous_status(); }

 private:
  // One accepted connection's I/O. The core knows it by its id.
  struct Link {
    Link(UniqueFd socket, int64_t cap) : fd(std::move(socket)), reader(cap) {}
    UniqueFd fd;
    FrameReader reader;
    FrameWriter writer;
    bool closing = false;  // Reads stop; closed once the writer drains or at close_deadline.
    absl::Time close_deadline = absl::InfiniteFuture();
    bool gone = false;  // Closed at the end of this turn; nothing more is written.
    // While the writer holds bytes: when the peer last took some (or the first were queued).
    absl::Time last_taken = absl::InfiniteFuture();
  };

  void AcceptAll(absl::Time now);
  void ReadFrom(ConnectionId id, Link& link, absl::Time now);
  // Carries out what the core asked for since the last call, and what that caused in turn.
  void Apply();
  void Apply(CoordinatorAction& action);
  // Queues `frame` on the link, or ends the connection when its queue would exceed the cap.
  void Enqueue(ConnectionId id, Link& link, std::shared_ptr<const OutgoingFrame> frame);
  // Ends the connection of a peer that does not read: nothing more is written to it.
  void EndForNotReading(ConnectionId id, Link& link, absl::string_view why);
  // Adds `delta` to the bytes queued to all connections.
  void CountQueued(int64_t delta);
  void FlushAll();
  void Sweep(absl::Time now);
  absl::Time NextDeadline() const;

  const UniqueFd listen_fd_;
  const UniqueFd wake_fd_;
  std::atomic<bool> stop_{false};
  CoordinatorCore core_;
  std::map<ConnectionId, Link> links_;  // Oldest first.
  ConnectionId next_id_ = 1;
  absl::Time accept_paused_until_ = absl::InfinitePast();
  std::atomic<int64_t> queued_bytes_{0};  // Written by the serving thread only.
  std::atomic<int64_t> peak_queued_bytes_{0};
};

void Coordinator::Impl::Run() {
  std::vector<pollfd> fds;
  std::vector<std::pair<ConnectionId, Link*>> polled;
  while (!stop_.load()) {
    failpoint::Evaluate("coordinator_thread");
    const absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until_;
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
    for (auto& [id, link] : links_) {
      short events = link.closing ? 0 : POLLIN;
      if (!link.writer.empty()) events |= POLLOUT;
      fds.push_back({link.fd.get(), events, 0});
      polled.emplace_back(id, &link);
    }
    absl::Time wake = NextDeadline();
    if (!accepting) wake = std::min(wake, accept_paused_until_);
    const int ready = poll(fds.data(), fds.size(), PollTimeoutMs(wake));
    if (stop_.load()) break;
    if (ready < 0 && errno != EINTR) absl::SleepFor(absl::Milliseconds(10));
    const absl::Time after = absl::Now();
    if (wake != absl::InfiniteFuture() && after > wake) core_.Stalled(after - wake);
    if (ready > 0) {
      if (fds[1].revents & POLLIN) AcceptAll(after);
      for (size_t i = 0; i < polled.size(); ++i) {
        auto [id, link] = polled[i];
        const short revents = fds[i + 2].revents;
        if (link->gone) continue;
        if (!link->closing && (revents & (POLLIN | POLLHUP | POLLERR))) ReadFrom(id, *link, after);
        if (link->closing && !(revents & POLLOUT) && (revents & (POLLHUP | POLLERR))) {
          link->gone = true;
        }
      }
    }
    core_.Tick(absl::Now());
    Apply();
    FlushAll();
    Sweep(absl::Now());
  }
  Shutdown();
}

absl::Time Coordinator::Impl::NextDeadline() const {
  absl::Time next = core_.NextDeadline();
  for (const auto& [id, link] : links_) {
    if (link.closing) next = std::min(next, link.close_deadline);
    if (!link.gone && !link.writer.empty()) {
      next = std::min(next, link.last_taken + core_.options().write_stall_timeout);
    }
  }
  return next;
}

void Coordinator::Impl::AcceptAll(absl::Time now) {
  for (int i = 0; i < kMaxAcceptsPerTurn; ++i) {
    UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until_ = now + kAcceptPause;
      }
      return;
    }
    SetNoDelay(fd.get());
    const std::string peer = PeerAddress(fd.get());
    const ConnectionId id = next_id_++;
    links_.try_emplace(id, std::move(fd), core_.options().max_handshake_frame_bytes);
    core_.Opened(now, id, peer, RandomBytes(kNonceBytes));
    Apply();
  }
}

void Coordinator::Impl::ReadFrom(ConnectionId id, Link& link, absl::Time now) {
  core_.Heard(now, id);  // Bytes (or the end) arrived: either way the peer is not silent.
  for (int i = 0; i < kMaxFramesPerTurn && !link.closing && !link.gone; ++i) {
    absl::StatusOr<bool> complete = link.reader.ReadSome(link.fd.get());
    if (!complete.ok()) {
      core_.ReadFailed(now, id, complete.status());
    } else if (!*complete) {
      if (link.reader.mid_frame()) core_.PartialFrame(now, id);
    } else {
      core_.Received(now, id, link.reader.TakeFrame());
    }
    Apply();
    if (!complete.ok() || !*complete) return;
  }
}

void Coordinator::Impl::Apply() {
  for (std::vector<CoordinatorAction> actions = core_.TakeActions(); !actions.empty();
       actions = core_.TakeActions()) {
    for (CoordinatorAction& action : actions) Apply(action);
  }
}

void Coordinator::Impl::Apply(CoordinatorAction& action) {
  auto it = links_.find(action.connection);
  if (it == links_.end() || it->second.gone) return;
  Link& link = it->second;
  switch (action.kind) {
    case CoordinatorAction::Kind::kSend:
      Enqueue(action.connection, link, std::move(action.frame));
      break;
    case CoordinatorAction::Kind::kHeartbeat:
      if (link.writer.empty()) Enqueue(action.connection, link, std::move(action.frame));
      break;
    case CoordinatorAction::Kind::kSeal: {
      const CoordinatorOptions& options = core_.options();
      link.reader.set_max_frame_bytes(options.max_frame_bytes);
      if (absl::Status sealed = SealChannel(ChannelSide::kCoordinator, options.secret, action.nonce,
                                            action.client_nonce, options.job_id, action.process,
                                            action.peer, link.reader, link.writer);
          !sealed.ok()) {
        link.gone = true;
        core_.Closed(action.connection, sealed.message());  // Its actions: Apply's next pass.
      }
      break;
    }
    case CoordinatorAction::Kind::kClose:
      link.closing = true;
      link.close_deadline = action.deadline;
      break;
    case CoordinatorAction::Kind::kDrop:
      link.gone = true;
      break;
  }
}

void Coordinator::Impl::Enqueue(ConnectionId id, Link& link,
                                std::shared_ptr<const OutgoingFrame> frame) {
  if (frame == nullptr) return;
  const int64_t cap = core_.options().max_queued_bytes_per_connection;
  const int64_t before = link.writer.pending_bytes();
  const int64_t adds =
      static_cast<int64_t>(frame->encoded.size()) + (link.writer.sealing() ? kFrameTagBytes : 0);
  if (before + adds > cap) {
    return EndForNotReading(id, link,
                            absl::StrCat("did not read what the coordinator sent: ", before,
                                         " bytes still queued to it and ", adds,
                                         " more would exceed the cap of ", cap));
  }
  if (link.writer.empty()) link.last_taken = absl::Now();
  link.writer.Enqueue(std::move(frame));
  CountQueued(link.writer.pending_bytes() - before);
}

void Coordinator::Impl::EndForNotReading(ConnectionId id, Link& link, absl::string_view why) {
  link.gone = true;
  core_.Closed(id, why);  // Its actions: the next pass of Apply.
}

void Coordinator::Impl::CountQueued(int64_t delta) {
  const int64_t now = queued_bytes_.load(std::memory_order_relaxed) + delta;
  queued_bytes_.store(now, std::memory_order_relaxed);
  if (now > peak_queued_bytes_.load(std::memory_order_relaxed)) {
    peak_queued_bytes_.store(now, std::memory_order_relaxed);
  }
}

void Coordinator::Impl::FlushAll() {
  const absl::Duration stall_limit = core_.options().write_stall_timeout;
  for (auto& [id, link] : links_) {
    if (link.gone || link.writer.empty()) continue;
    const int64_t before = link.writer.pending_bytes();
    absl::StatusOr<bool> done = link.writer.Flush(link.fd.get());
    CountQueued(link.writer.pending_bytes() - before);
    const absl::Time now = absl::Now();
    if (!done.ok()) {
      link.gone = true;
      core_.Closed(id, "connection lost while sending");
    } else if (link.writer.pending_bytes() < before) {
      link.last_taken = now;
    } else if (!link.closing && now - link.last_taken >= stall_limit) {
      EndForNotReading(
          id, link,
          absl::StrCat("did not read what the coordinator sent: took none of the ", before,
                       " bytes queued to it for ", absl::FormatDuration(now - link.last_taken)));
    }
  }
  Apply();  // What the losses caused goes out in the next turn.
}

void Coordinator::Impl::Sweep(absl::Time now) {
  for (auto it = links_.begin(); it != links_.end();) {
    Link& link = it->second;
    if (!link.gone && !(link.closing && (link.writer.empty() || now >= link.close_deadline))) {
      ++it;
      continue;
    }
    core_.Closed(it->first, "closed");  // Already forgotten by the core in every known path.
    if (!link.gone) {
      // Discard what the peer sent and we did not read (bounded, never waiting): closing with
      // unread input would reset the connection and could destroy the Reject before it is read.
      char sink[4096];
      for (int i = 0; i < 16 && recv(link.fd.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
      }
      shutdown(link.fd.get(), SHUT_WR);
    }
    CountQueued(-link.writer.pending_bytes());
    it = links_.erase(it);  // The descriptor closes with the link.
  }
  Apply();
}

void Coordinator::Impl::Shutdown() {
  core_.Shutdown();
  Apply();
  for (auto& [id, link] : links_) {
    if (!link.gone) (void)link.writer.Flush(link.fd.get());  // Best effort, never waits.
  }
  links_.clear();
  queued_bytes_.store(0, std::memory_order_relaxed);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(CoordinatorOptions options) {
  auto invalid = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("control: coordinator options: ", what));
  };
  if (absl::Status ok = CheckIdentifier("job id", options.job_id); !ok.ok()) {
    return invalid(ok.message());
  }
  if (absl::Status ok = CheckIdentifier("coordinator id", options.coordinator_id); !ok.ok()) {
    return invalid(ok.message());
  }
  if (absl::Status ok = CheckSecret(options.secret); !ok.ok()) return invalid(ok.message());
  const int64_t world = int64_t{options.num_trainers} + options.num_rollouts;
  if (options.num_trainers < 0 || options.num_rollouts < 0 || world < 1 ||
      world > kMaxControlProcesses) {
    return invalid(absl::StrCat("the job needs 1 to ", kMaxControlProcesses, " processes; got ",
                                options.num_trainers, " trainers and ", options.num_rollouts,
                                " rollouts"));
  }
  WSYNC_RETURN_IF_ERROR(CheckFrameCap(options.max_frame_bytes));
  if (options.max_handshake_frame_bytes < 1024 ||
      options.max_handshake_frame_bytes > options.max_frame_bytes) {
    return invalid("max_handshake_frame_bytes must be within [1024, max_frame_bytes]");
  }
  if (options.handshake_timeout <= absl::ZeroDuration() ||
      options.rendezvous_timeout <= absl::ZeroDuration() ||
      options.frame_timeout <= absl::ZeroDuration() ||
      options.close_timeout <= absl::ZeroDuration()) {
    return invalid("timeouts must be positive");
  }
  if (options.heartbeat_interval < absl::ZeroDuration() ||
      (options.heartbeat_interval > absl::ZeroDuration() &&
       (options.heartbeat_interval < absl::Milliseconds(1) ||
        options.silence_limit < 2 * options.heartbeat_interval))) {
    return invalid(
        "heartbeat_interval must be 0 (no heartbeats) or at least 1 ms, and silence_limit at "
        "least twice heartbeat_interval");
  }
  if (options.max_queued_bytes_per_connection == 0) {
    options.max_queued_bytes_per_connection = 2 * options.max_frame_bytes;
  }
  if (options.max_queued_bytes_per_connection < options.max_frame_bytes + kMaxFrameOverheadBytes ||
      options.write_stall_timeout <= absl::ZeroDuration()) {
    return invalid(
        "max_queued_bytes_per_connection must be 0 or at least max_frame_bytes plus "
        "kMaxFrameOverheadBytes, and write_stall_timeout positive");
  }
  if (options.max_pending_connections < 1 || options.max_pending_per_source < 1 ||
      options.max_open_rounds < 1 || options.max_rounds_ahead < 1 ||
      options.max_held_bytes_per_process < 1 || options.pending_grace < absl::ZeroDuration()) {
    return invalid(
        "max_pending_connections, max_pending_per_source, max_open_rounds, max_rounds_ahead and "
        "max_held_bytes_per_process must be at least 1");
  }
  int port = 0;
  WSYNC_ASSIGN_OR_RETURN(UniqueFd listen_fd, ListenTcp(options.address, options.port,
                                                       options.allow_any_address, &port));
  UniqueFd wake_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd.valid()) return absl::InternalError("control: eventfd failed");
  std::unique_ptr<Coordinator> coordinator(new Coordinator());
  coordinator->port_ = port;
  coordinator->address_ = options.address;
  coordinator->impl_ =
      std::make_unique<Impl>(std::move(options), std::move(listen_fd), std::move(wake_fd));
  absl::MutexLock lock(&coordinator->stop_mu_);
  // The exception firewall of the serving thread: an exception ends serving as Stop would (every
  // connection gets a best-effort Reject and closes), so clients fail with "lost the coordinator"
  // instead of the host process terminating.
  coordinator->thread_ = std::thread([impl = coordinator->impl_.get()] {
    try {
      impl->Run();
    } catch (...) {
      const absl::Status failed = StatusOfCurrentException("wsync coordinator thread");
      WSYNC_LOG(kFault, kError, failed.ToString());
      try {
        impl->Shutdown();
      } catch (...) {
      }
    }
  });
  return coordinator;
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Stop() {
  absl::MutexLock lock(&stop_mu_);
  if (!thread_.joinable()) return;
  impl_->RequestStop();
  thread_.join();
}

CoordinatorCounters Coordinator::counters() const { return impl_->counters(); }

absl::Status Coordinator::rendezvous_status() const { return impl_->rendezvous_status(); }

}  // namespace wsync
