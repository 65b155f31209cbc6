// ControlClient's I/O thread (client.h): the only thread that touches the connection once Connect
// returned. It writes the frames the calls queued, reads and routes the coordinator's frames,
// heartbeats, watches the coordinator's silence and fails the waiting calls when the connection
// ends.

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "control/client.h"
#include "control/sync_progress_wire.h"

namespace wsync {
namespace {

constexpr size_t kFramesPerTurn = 64;

// A message without its leading "control: " (it goes after the client's own prefix).
absl::string_view Unprefixed(absl::string_view message) {
  absl::ConsumePrefix(&message, "control: ");
  return message;
}

// The connection failed under a read or a write (closed, reset, a frame that failed
// authentication or did not parse): a call names it "<call>: lost the coordinator: <cause>".
std::string LostText(const absl::Status& cause) {
  return absl::StrCat("lost the coordinator: ", Unprefixed(cause.message()));
}

}  // namespace

absl::Status ControlClient::StartIo() {
  wake_fd_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return absl::InternalError(absl::StrCat(Prefix(), "eventfd failed"));
  // The exception firewall of the I/O thread: an exception closes the connection with it (every
  // call then fails with it), never the host process.
  io_ = std::thread([this] {
    try {
      IoLoop();
    } catch (...) {
      Close(StatusOfCurrentException(absl::StrCat(Prefix(), "I/O and heartbeat thread")));
      shutdown(fd_.get(), SHUT_RDWR);
      absl::MutexLock lock(&mu_);
      io_done_ = true;
      EndLocked(std::nullopt);
    }
  });
  return absl::OkStatus();
}

void ControlClient::WakeIo() {
  const uint64_t one = 1;
  if (wake_fd_.valid()) (void)!write(wake_fd_.get(), &one, sizeof(one));
}

void ControlClient::NotifyLocked() {
  ++events_;
  const uint64_t one = 1;
  for (const int fd : watchers_) (void)!write(fd, &one, sizeof(one));
}

void ControlClient::EndLocked(const std::optional<Ending>& ending) {
  if (ending.has_value() && !ending_.has_value() && close_reason_.ok() && broken_.ok()) {
    ending_ = ending;
  }
  // Each waiting call is named in the error of an Ending; the first (Join, else the lowest
  // number: the call that waited longest) becomes the client's error for every later call.
  const bool name_each = close_reason_.ok() && broken_.ok() && ending_.has_value();
  auto fail = [this, name_each](Call* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    call->status = name_each ? ending_->Named(call->name) : UnusableLocked(call->name);
    if (call->status.ok()) {  // Not expected: every way to end leaves a reason.
      call->status = absl::UnavailableError(
          absl::StrCat(call->name, "the connection to the coordinator ended"));
    }
    if (broken_.ok() && close_reason_.ok()) broken_ = call->status;
    call->done = true;
  };
  if (join_call_ != nullptr) fail(std::exchange(join_call_, nullptr));
  for (auto& [number, call] : calls_) fail(call);
  calls_.clear();
  NotifyLocked();
}

void ControlClient::IoLoop() {
  const absl::Time start = absl::Now();  // The Welcome just came.
  Beat beat{start, start + heartbeat_interval_};
  std::optional<Ending> ending;
  bool stopping = false;
  for (;;) {
    failpoint::Evaluate("keepalive_thread");
    {
      absl::MutexLock lock(&mu_);
      stopping = stop_;
      if (finish_) break;
    }
    ending = IoTurn(beat);
    if (ending.has_value()) break;
  }
  // Destruction: what the calls queued goes to the socket if it takes it now (never waits).
  if (stopping && !ending.has_value()) (void)Send();
  // The coordinator takes this process as lost at once, instead of after the silence limit.
  shutdown(fd_.get(), SHUT_RDWR);
  absl::MutexLock lock(&mu_);
  io_done_ = true;
  EndLocked(ending);
}

std::optional<ControlClient::Ending> ControlClient::IoTurn(Beat& beat) {
  if (std::optional<Ending> failed = Send()) return failed;
  const bool heartbeats = heartbeat_interval_ > absl::ZeroDuration();
  const absl::Time wake = heartbeats ? std::min(beat.next_beat, beat.heard_at + silence_limit_)
                                     : absl::InfiniteFuture();
  const short events = static_cast<short>(POLLIN | (writer_.empty() ? 0 : POLLOUT));
  pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {fd_.get(), events, 0}};
  const int ready = poll(fds, 2, PollTimeoutMs(wake));
  if (ready > 0 && fds[0].revents != 0) {
    uint64_t count = 0;
    (void)!read(wake_fd_.get(), &count, sizeof(count));
  }
  const absl::Time now = absl::Now();
  // Woken late, this thread (or its host) stalled: silence counts only time it was there to hear.
  // A silence check that was itself due by `wake` still fails below.
  if (now > wake) beat.heard_at += now - wake;
  if (ready > 0 && (fds[1].revents & ~POLLOUT) != 0) {
    beat.heard_at = now;  // Something arrived (or the end, which Receive reports).
    if (std::optional<Ending> failed = Receive()) return failed;
  }
  if (!heartbeats) return std::nullopt;
  if (now - beat.heard_at >= silence_limit_) {
    Close(absl::UnavailableError(absl::StrFormat(
        "%slost the coordinator: nothing arrived from it for %.1f s (the silence limit is %.1f s)",
        Prefix(), absl::ToDoubleSeconds(now - beat.heard_at),
        absl::ToDoubleSeconds(silence_limit_))));
    return std::nullopt;  // The next turn sees finish_.
  }
  if (now >= beat.next_beat) {
    QueueHeartbeat();
    beat.next_beat = now + heartbeat_interval_;
  }
  return std::nullopt;
}

void ControlClient::QueueHeartbeat() {
  // Bytes still queued tell the coordinator this process is alive once they go.
  if (!writer_.empty()) return;
  control::Frame frame;
  ProgressToProto(options_.progress, *frame.mutable_heartbeat());
  absl::StatusOr<std::shared_ptr<const OutgoingFrame>> encoded =
      PrepareFrame(frame, coordinator_max_frame_bytes_);
  if (encoded.ok()) writer_.Enqueue(*std::move(encoded));  // Flushed by the next turn's Send.
}

std::optional<ControlClient::Ending> ControlClient::Send() {
  std::deque<control::Frame> queued;
  {
    absl::MutexLock lock(&mu_);
    queued.swap(outbox_);
  }
  for (const control::Frame& frame : queued) {
    // The calls checked the size against the coordinator's cap: a failure here is internal.
    absl::StatusOr<std::shared_ptr<const OutgoingFrame>> encoded =
        PrepareFrame(frame, coordinator_max_frame_bytes_);
    if (!encoded.ok()) {
      return Ending{encoded.status().code(),
                    absl::StrCat("encoding a frame: ", Unprefixed(encoded.status().message()))};
    }
    writer_.Enqueue(*std::move(encoded));  // Sealed here, in the order of the queue.
  }
  // Never waits: what the socket does not take now goes when poll reports it writable.
  if (absl::StatusOr<bool> flushed = writer_.Flush(fd_.get()); !flushed.ok()) {
    return Ending{flushed.status().code(), LostText(flushed.status())};
  }
  return std::nullopt;
}

std::optional<ControlClient::Ending> ControlClient::Receive() {
  std::vector<control::Frame> frames;
  std::optional<Ending> failed;
  // At most kFramesPerTurn, so that a coordinator sending without pause cannot hold up this
  // process's frames and heartbeats (poll reports the rest at once).
  while (!failed.has_value() && frames.size() < kFramesPerTurn) {
    absl::StatusOr<bool> complete = reader_.ReadSome(fd_.get());
    if (!complete.ok()) {
      failed = Ending{complete.status().code(), LostText(complete.status())};
    } else if (!*complete) {
      break;
    } else if (absl::StatusOr<control::Frame> frame = reader_.TakeFrame(); frame.ok()) {
      frames.push_back(*std::move(frame));
    } else {
      failed = Ending{frame.status().code(), LostText(frame.status())};
    }
  }
  // The frames that came before a failure are routed first (a Reject before the close).
  absl::MutexLock lock(&mu_);
  for (control::Frame& frame : frames) {
    if (std::optional<Ending> ended = RouteLocked(frame)) return ended;
  }
  return failed;
}

std::optional<ControlClient::Ending> ControlClient::RouteLocked(control::Frame& frame) {
  if (frame.has_heartbeat()) return std::nullopt;  // Liveness only (counted as it arrived).
  if (frame.has_lost()) return RecordLossLocked(frame.lost());
  if (!joined_) return RouteBeforeRosterLocked(frame);
  if (frame.has_rendezvous_progress()) return std::nullopt;  // Stale once the roster came.
  if (frame.has_roster()) {  // A replacement joined: its new address, for the transport.
    absl::StatusOr<Roster> update = ReadRoster(*frame.mutable_roster());
    if (!update.ok()) return Ending{update.status().code(), std::string(update.status().message())};
    roster_update_ = *std::move(update);
    NotifyLocked();
    return std::nullopt;
  }
  if (frame.has_reject()) {
    const absl::Status refused = StatusFromWire(frame.reject().code(), frame.reject().reason());
    return Ending{refused.code(), absl::StrCat("the coordinator closed the connection: ",
                                               Unprefixed(refused.message()))};
  }
  if (!frame.has_result() || frame.result().number() >= next_number_) {
    return Ending{absl::StatusCode::kInternal,
                  "protocol error: unexpected frame from the coordinator"};
  }
  auto waiting = calls_.find(frame.result().number());
  if (waiting == calls_.end()) return std::nullopt;  // The late answer of a call that gave up.
  Call* call = waiting->second;
  calls_.erase(waiting);
  call->result = std::move(*frame.mutable_result());
  call->done = true;
  return std::nullopt;
}

std::optional<ControlClient::Ending> ControlClient::RouteBeforeRosterLocked(control::Frame& frame) {
  if (frame.has_rendezvous_progress()) {
    rendezvous_progress_ = std::move(*frame.mutable_rendezvous_progress());
    rendezvous_progress_at_ = absl::Now();
    return std::nullopt;
  }
  if (frame.has_reject()) {
    const absl::Status refused = StatusFromWire(frame.reject().code(), frame.reject().reason());
    if (join_call_ != nullptr) {  // The coordinator's answer to the Join: a refusal.
      if (broken_.ok() && close_reason_.ok()) {
        broken_ =
            absl::Status(refused.code(), absl::StrCat(Prefix(), Unprefixed(refused.message())));
      }
      join_call_->status = UnusableLocked(Prefix());
      join_call_->done = true;
      join_call_ = nullptr;
    }
    return Ending{refused.code(), absl::StrCat("the coordinator closed the connection: ",
                                               Unprefixed(refused.message()))};
  }
  if (!frame.has_roster() || join_call_ == nullptr) {
    return Ending{absl::StatusCode::kInternal,
                  "protocol error: expected the roster, got another frame"};
  }
  absl::StatusOr<Roster> roster = ReadRoster(*frame.mutable_roster());
  if (!roster.ok()) return Ending{roster.status().code(), std::string(roster.status().message())};
  joined_ = true;
  next_number_ = frame.roster().next_collective();
  join_call_->roster = *std::move(roster);
  join_call_->done = true;
  join_call_ = nullptr;
  return std::nullopt;
}

std::optional<ControlClient::Ending> ControlClient::RecordLossLocked(const control::Lost& lost) {
  if (lost.process() < 0 || lost.process() >= size() ||
      static_cast<int64_t>(lost.reason().size()) > kMaxReasonBytes) {
    return Ending{absl::StatusCode::kInternal, "protocol error: a loss notice out of range"};
  }
  losses_.push_back(LossNotice{lost.process(), lost.reason()});
  NotifyLocked();
  return std::nullopt;
}

}  // namespace wsync
