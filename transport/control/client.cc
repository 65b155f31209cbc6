#include "transport/control/client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "transport/control/auth.h"
#include "transport/control/channel_keys.h"
#include "transport/control/rendezvous_progress.h"
#include "transport/control/sync_progress_wire.h"

namespace wsync {
namespace {

// Frames before the Welcome are small; a coordinator may not make a client hold more.
constexpr int64_t kHandshakeFrameBytes = int64_t{64} << 10;
// The coordinator gives up on a round this much before the caller's deadline (at most), so that
// its answer, which names the missing processes, arrives before the caller stops waiting.
constexpr absl::Duration kMaxMargin = absl::Milliseconds(250);

absl::string_view Strip(absl::string_view message) {
  absl::ConsumePrefix(&message, "control: ");
  return message;
}

// `status` with `context` put before its message (minus a leading "control: ").
absl::Status Wrap(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, Strip(status.message())));
}

}  // namespace

ControlClient::~ControlClient() {
  if (keepalive_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_.get(), &one, sizeof(one));
    keepalive_.join();
  }
  WipeSecret(options_.secret);
}

std::string ControlClient::Prefix() const {
  if (process_ >= 0) {
    return absl::StrCat(
        "control: ", DescribeProcess(process_, options_.role, options_.rank, options_.node_id),
        ": ");
  }
  return absl::StrCat("control: ", ControlRoleName(options_.role), " rank ", options_.rank,
                      " of job ", options_.job_id, " (coordinator ", options_.coordinator_host, ":",
                      options_.coordinator_port, "): ");
}

absl::StatusOr<std::unique_ptr<ControlClient>> ControlClient::Connect(
    ControlClientOptions options) {
  auto invalid = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("control: client options: ", what));
  };
  if (options.node_id.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) return invalid("no node id and no host name");
    options.node_id = host;
  }
  if (absl::Status ok = CheckIdentifier("job id", options.job_id); !ok.ok()) {
    return invalid(ok.message());
  }
  if (absl::Status ok = CheckIdentifier("node id", options.node_id); !ok.ok()) {
    return invalid(ok.message());
  }
  if (absl::Status ok = CheckSecret(options.secret); !ok.ok()) return invalid(ok.message());
  if (options.role != ControlRole::kTrainer && options.role != ControlRole::kRollout) {
    return invalid("bad role");
  }
  if (options.rank < 0) return invalid(absl::StrCat("negative rank ", options.rank));
  if (options.connect_timeout <= absl::ZeroDuration()) return invalid("connect_timeout <= 0");
  WSYNC_RETURN_IF_ERROR(CheckFrameCap(options.max_frame_bytes));

  std::unique_ptr<ControlClient> client(new ControlClient());
  client->options_ = std::move(options);
  const ControlClientOptions& o = client->options_;
  const absl::Time deadline = absl::Now() + o.connect_timeout;
  absl::Duration backoff = absl::Milliseconds(20);
  for (;;) {
    absl::StatusOr<UniqueFd> fd = ConnectTcp(o.coordinator_host, o.coordinator_port, deadline);
    if (!fd.ok()) return Wrap(fd.status(), client->Prefix());
    client->fd_ = *std::move(fd);
    client->reader_ = FrameReader(kHandshakeFrameBytes);
    client->writer_ = FrameWriter();
    bool retry = false;
    absl::Status handshake = client->Handshake(deadline, &retry);
    if (handshake.ok()) {
      // Needed only for the handshake: wiped now rather than at destruction.
      WipeSecret(client->options_.secret);
      if (client->heartbeat_interval_ > absl::ZeroDuration()) {
        client->stop_fd_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        client->notice_fd_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        if (!client->stop_fd_.valid() || !client->notice_fd_.valid()) {
          return absl::InternalError(absl::StrCat(client->Prefix(), "eventfd failed"));
        }
        // The exception firewall of the heartbeat thread: an exception closes the connection
        // with it (every call then fails with it), never the host process.
        client->keepalive_ = std::thread([c = client.get()] {
          try {
            c->KeepAlive();
          } catch (...) {
            c->Close(StatusOfCurrentException(absl::StrCat(c->Prefix(), "heartbeat thread")));
          }
        });
      }
      return client;
    }
    client->fd_.Reset();
    const absl::Time now = absl::Now();
    if (!retry || now >= deadline) return handshake;
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

absl::Status ControlClient::Handshake(absl::Time deadline, bool* retry) {
  const int fd = fd_.get();
  absl::StatusOr<control::Frame> frame = ReadFrame(fd, reader_, deadline);
  if (!frame.ok()) {
    // A coordinator that closes before its challenge is busy or restarting: worth another try.
    *retry = absl::IsUnavailable(frame.status());
    return Wrap(frame.status(), absl::StrCat(Prefix(), "no challenge from the coordinator: "));
  }
  if (frame->has_reject()) {
    const absl::Status refused = StatusFromWire(frame->reject().code(), frame->reject().reason());
    *retry = absl::IsResourceExhausted(refused);
    return Wrap(refused, absl::StrCat(Prefix(), "refused by the coordinator: "));
  }
  if (!frame->has_challenge() || frame->challenge().protocol_version() != kControlProtocolVersion ||
      frame->challenge().nonce().size() != kNonceBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "the coordinator did not send a challenge of protocol version ",
                     kControlProtocolVersion));
  }
  const std::string nonce = frame->challenge().nonce();
  WSYNC_ASSIGN_OR_RETURN(const std::string client_nonce, RandomBytes(kNonceBytes));

  control::Frame hello_frame;
  control::Hello* hello = hello_frame.mutable_hello();
  hello->set_protocol_version(kControlProtocolVersion);
  hello->set_job_id(options_.job_id);
  hello->set_role(RoleToProto(options_.role));
  hello->set_rank(options_.rank);
  hello->set_node_id(options_.node_id);
  hello->set_client_nonce(client_nonce);
  hello->set_heartbeats(options_.heartbeats);
  hello->set_rendezvous_progress(options_.rendezvous_progress);
  hello->set_mac(HelloMac(options_.secret, nonce, client_nonce, options_.job_id, options_.role,
                          options_.rank, options_.node_id));
  if (absl::Status sent = WriteFrame(fd, writer_, hello_frame, kHandshakeFrameBytes, deadline);
      !sent.ok()) {
    *retry = absl::IsUnavailable(sent);
    return Wrap(sent, absl::StrCat(Prefix(), "sending the hello: "));
  }

  frame = ReadFrame(fd, reader_, deadline);
  if (!frame.ok()) {
    // Closed before a Welcome (a coordinator under a flood of connections displaces pending ones):
    // nothing was established, so another try is safe.
    *retry = absl::IsUnavailable(frame.status());
    return Wrap(frame.status(), absl::StrCat(Prefix(), "no welcome: "));
  }
  if (frame->has_reject()) {
    const absl::Status refused = StatusFromWire(frame->reject().code(), frame->reject().reason());
    *retry = absl::IsResourceExhausted(refused);
    return Wrap(refused, absl::StrCat(Prefix(), "refused by the coordinator: "));
  }
  if (!frame->has_welcome()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "the coordinator answered the hello with an unexpected frame"));
  }
  const control::Welcome& welcome = frame->welcome();
  const std::string expected =
      WelcomeMac(options_.secret, client_nonce, nonce, options_.job_id, WelcomeFieldsOf(welcome));
  if (!ConstantTimeEquals(expected, welcome.mac())) {
    return absl::UnauthenticatedError(
        absl::StrCat(Prefix(), "the coordinator could not prove that it holds the job's secret"));
  }
  const int64_t trainers = welcome.num_trainers();
  const int64_t rollouts = welcome.num_rollouts();
  const int64_t count = options_.role == ControlRole::kTrainer ? trainers : rollouts;
  const int64_t interval_ms = welcome.heartbeat_interval_ms();
  const int64_t limit_ms = welcome.silence_limit_ms();
  const bool heartbeats_consistent = interval_ms == 0 ? limit_ms == 0
                                                      : options_.heartbeats && interval_ms > 0 &&
                                                            limit_ms >= 2 * interval_ms &&
                                                            limit_ms <= int64_t{86400000};
  if (trainers < 0 || rollouts < 0 || trainers + rollouts > kMaxControlProcesses ||
      options_.rank >= count ||
      welcome.process() != GlobalProcessId(options_.role, options_.rank, trainers) ||
      !CheckFrameCap(welcome.max_frame_bytes()).ok() || !heartbeats_consistent) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(), "the coordinator sent an inconsistent welcome"));
  }
  num_trainers_ = static_cast<int32_t>(trainers);
  num_rollouts_ = static_cast<int32_t>(rollouts);
  coordinator_max_frame_bytes_ = welcome.max_frame_bytes();
  process_ = welcome.process();
  heartbeat_interval_ = absl::Milliseconds(interval_ms);
  silence_limit_ = absl::Milliseconds(limit_ms);
  reader_.set_max_frame_bytes(options_.max_frame_bytes);
  reader_.set_progress_counter(&bytes_heard_);
  // Every later frame in either direction is sealed (the heartbeat thread starts after this).
  if (absl::Status sealed = SealChannel(ChannelSide::kClient, options_.secret, nonce, client_nonce,
                                        options_.job_id, process_,
                                        absl::StrCat("the coordinator ", options_.coordinator_host,
                                                     ":", options_.coordinator_port),
                                        reader_, writer_);
      !sealed.ok()) {
    return Wrap(sealed, Prefix());
  }
  return absl::OkStatus();
}

absl::Status ControlClient::Broken(const absl::Status& cause) {
  if (closed_.load()) {
    absl::MutexLock lock(&close_mu_);
    return close_reason_;
  }
  if (broken_.ok()) {
    broken_ = cause;
    // A forged, replayed or reordered frame: the stream can no longer be trusted, so the
    // connection ends now (the coordinator then takes this process as lost).
    if (absl::IsUnauthenticated(cause) && fd_.valid()) shutdown(fd_.get(), SHUT_RDWR);
  }
  return broken_;
}

absl::StatusOr<Roster> ControlClient::Join(const JoinRequest& request, absl::Time deadline) {
  absl::MutexLock io(&io_mu_);
  if (closed_.load() || !broken_.ok()) return Broken(broken_);
  if (join_attempted_) {
    return absl::FailedPreconditionError(absl::StrCat(Prefix(), "Join may be called only once"));
  }
  join_attempted_ = true;
  control::Frame frame;
  control::Join* join = frame.mutable_join();
  join->set_manifest(request.manifest);
  join->set_address(request.address);
  join->set_metadata(request.metadata);
  const int fd = fd_.get();
  absl::Status sent;
  {
    absl::MutexLock write(&write_mu_);
    sent = WriteFrame(fd, writer_, frame, coordinator_max_frame_bytes_, deadline);
  }
  if (!sent.ok()) {
    // As below: a connection that failed under the write means the coordinator is gone.
    const bool lost = !absl::IsDeadlineExceeded(sent);
    return Broken(Wrap(sent, absl::StrCat(Prefix(), "sending the join",
                                          lost ? ", lost the coordinator: " : ": ")));
  }
  frame.Clear();
  for (;;) {
    absl::StatusOr<control::Frame> got = ReadFrame(fd, reader_, deadline);
    if (!got.ok()) {
      // A closed or broken connection means the coordinator is gone; a timeout does not.
      const bool lost = !absl::IsDeadlineExceeded(got.status());
      std::string progress;
      if (!lost) {
        progress =
            rendezvous_progress_.has_value()
                ? absl::StrCat("; the coordinator reported ",
                               DescribeRendezvousProgress(*rendezvous_progress_,
                                                          absl::Now() - rendezvous_progress_at_))
                : "; the coordinator reported no rendezvous progress";
      }
      const absl::Status failed =
          Wrap(got.status(), absl::StrCat(Prefix(), "waiting for the roster",
                                          lost ? ", lost the coordinator: " : ": "));
      return Broken(absl::Status(failed.code(), absl::StrCat(failed.message(), progress)));
    }
    if (got->has_rendezvous_progress()) {
      rendezvous_progress_ = std::move(*got->mutable_rendezvous_progress());
      rendezvous_progress_at_ = absl::Now();
      continue;
    }
    if (got->has_reject()) {
      return Broken(Wrap(StatusFromWire(got->reject().code(), got->reject().reason()), Prefix()));
    }
    if (got->has_heartbeat()) continue;
    if (got->has_lost()) {  // A replacement may hear of another loss before its roster.
      WSYNC_RETURN_IF_ERROR(RecordLoss(got->lost()));
      continue;
    }
    if (!got->has_roster()) {
      return Broken(absl::InternalError(
          absl::StrCat(Prefix(), "protocol error: expected the roster, got another frame")));
    }
    WSYNC_ASSIGN_OR_RETURN(Roster roster, ReadRoster(*got->mutable_roster()));
    next_number_ = got->roster().next_collective();
    joined_ = true;
    return roster;
  }
}

std::optional<Roster> ControlClient::TakeRosterUpdate() {
  absl::MutexLock io(&io_mu_);
  std::optional<Roster> update = std::move(roster_update_);
  roster_update_.reset();
  return update;
}

bool ControlClient::HasRosterUpdate() {
  absl::MutexLock io(&io_mu_);
  return roster_update_.has_value();
}

absl::StatusOr<control::Result> ControlClient::Collective(control::Contribute contribute,
                                                          absl::Time deadline) {
  const absl::string_view kind = CollectiveName(contribute.kind());
  if (closed_.load()) return Broken(broken_);
  if (!joined_) {
    return absl::FailedPreconditionError(absl::StrCat(Prefix(), kind, " before a successful Join"));
  }
  const uint64_t number = next_number_++;
  if (!broken_.ok()) return broken_;
  const std::string name = absl::StrCat(Prefix(), kind, " #", number, ": ");
  contribute.set_number(number);
  const absl::Duration remaining = std::max(deadline - absl::Now(), absl::ZeroDuration());
  const absl::Duration margin = std::min(remaining / 10, kMaxMargin);
  contribute.set_timeout_ms(absl::ToInt64Milliseconds(remaining - margin));
  control::Frame frame;
  *frame.mutable_contribute() = std::move(contribute);
  absl::Status local;  // Set when this process fails its own contribution.
  if (static_cast<int64_t>(frame.ByteSizeLong()) > coordinator_max_frame_bytes_) {
    local = absl::ResourceExhaustedError(absl::StrCat(
        name, "the contribution (", frame.ByteSizeLong(),
        " bytes) exceeds the coordinator's frame cap of ", coordinator_max_frame_bytes_, " bytes"));
    // Tell the others, so that their round fails at once instead of at their deadline.
    control::Contribute* failed = frame.mutable_contribute();
    failed->clear_payload();
    failed->set_failed(true);
    failed->set_reason(TruncateText(Strip(local.message()), kMaxReasonBytes));
  }
  const int fd = fd_.get();
  if (absl::Status fp = failpoint::Check("control"); !fp.ok()) return Broken(Wrap(fp, name));
  absl::Status sent;
  {
    absl::MutexLock write(&write_mu_);
    sent = WriteFrame(fd, writer_, frame, coordinator_max_frame_bytes_, deadline);
  }
  if (!sent.ok()) {
    // On a deadline the unsent rest stays queued and goes out first on the next call.
    if (absl::IsDeadlineExceeded(sent) && !closed_.load()) return Wrap(sent, name);
    // The connection failed under the write (reset, or closed by the coordinator's death): named
    // like a failed read, whichever of the two notices first.
    return Broken(Wrap(sent, absl::StrCat(name, "lost the coordinator: ")));
  }
  if (!local.ok()) return local;
  for (;;) {
    absl::StatusOr<control::Frame> got = ReadFrame(fd, reader_, deadline);
    if (!got.ok()) {
      if (absl::IsDeadlineExceeded(got.status()) && !closed_.load()) {
        return absl::DeadlineExceededError(
            absl::StrCat(name, "no answer from the coordinator before the deadline"));
      }
      return Broken(Wrap(got.status(), absl::StrCat(name, "lost the coordinator: ")));
    }
    if (got->has_reject()) {
      return Broken(Wrap(StatusFromWire(got->reject().code(), got->reject().reason()),
                         absl::StrCat(name, "the coordinator closed the connection: ")));
    }
    if (got->has_heartbeat() || got->has_rendezvous_progress()) continue;
    if (got->has_lost()) {
      if (absl::Status recorded = RecordLoss(got->lost()); !recorded.ok()) return recorded;
      continue;
    }
    if (got->has_roster()) {  // A replacement joined: its new address, for the transport.
      absl::StatusOr<Roster> update = ReadRoster(*got->mutable_roster());
      if (!update.ok()) return Broken(update.status());
      roster_update_ = *std::move(update);
      continue;
    }
    if (!got->has_result() || got->result().number() > number) {
      return Broken(absl::InternalError(
          absl::StrCat(name, "protocol error: unexpected frame from the coordinator")));
    }
    if (got->result().number() < number) continue;  // The late answer of an earlier call.
    control::Result& result = *got->mutable_result();
    if (result.code() != 0) {
      return StatusFromWire(result.code(), absl::StrCat(Prefix(), result.message()));
    }
    return std::move(result);
  }
}

absl::StatusOr<std::vector<std::string>> ControlClient::AllGather(absl::string_view payload,
                                                                  absl::Time deadline) {
  absl::MutexLock io(&io_mu_);
  control::Contribute c;
  c.set_kind(control::COLLECTIVE_ALL_GATHER);
  c.set_payload(std::string(payload));
  WSYNC_ASSIGN_OR_RETURN(control::Result result, Collective(std::move(c), deadline));
  if (result.payloads_size() != size()) {
    return Broken(absl::InternalError(absl::StrCat(Prefix(), "protocol error: AllGather returned ",
                                                   result.payloads_size(), " payloads")));
  }
  std::vector<std::string> all;
  all.reserve(size());
  for (std::string& p : *result.mutable_payloads()) all.push_back(std::move(p));
  return all;
}

absl::StatusOr<std::string> ControlClient::Broadcast(int32_t root, absl::string_view payload,
                                                     absl::Time deadline) {
  absl::MutexLock io(&io_mu_);
  control::Contribute c;
  c.set_kind(control::COLLECTIVE_BROADCAST);
  if (root < 0 || root >= size()) {
    // Still uses its number, and fails the round for the others with the reason.
    c.set_root(0);
    c.set_failed(true);
    c.set_reason(absl::StrCat("Broadcast root ", root, " out of range [0, ", size(), ")"));
    (void)Collective(std::move(c), deadline);
    return absl::InvalidArgumentError(
        absl::StrCat(Prefix(), "Broadcast root ", root, " out of range [0, ", size(), ")"));
  }
  c.set_root(root);
  if (root == process_) c.set_payload(std::string(payload));
  WSYNC_ASSIGN_OR_RETURN(control::Result result, Collective(std::move(c), deadline));
  if (result.payloads_size() != 1) {
    return Broken(absl::InternalError(absl::StrCat(Prefix(), "protocol error: Broadcast returned ",
                                                   result.payloads_size(), " payloads")));
  }
  return std::move(*result.mutable_payloads(0));
}

absl::Status ControlClient::Barrier(absl::Time deadline) {
  absl::MutexLock io(&io_mu_);
  control::Contribute c;
  c.set_kind(control::COLLECTIVE_BARRIER);
  return Collective(std::move(c), deadline).status();
}

absl::Status ControlClient::Decide(bool ok, absl::string_view reason, absl::Time deadline) {
  absl::MutexLock io(&io_mu_);
  control::Contribute c;
  c.set_kind(control::COLLECTIVE_DECIDE);
  c.set_ok(ok);
  if (!ok) c.set_reason(TruncateText(reason, kMaxReasonBytes));
  return Collective(std::move(c), deadline).status();
}

size_t ControlClient::loss_count() const {
  absl::MutexLock lock(&loss_mu_);
  return losses_.size();
}

std::vector<LossNotice> ControlClient::LossesSince(size_t first) const {
  absl::MutexLock lock(&loss_mu_);
  if (first >= losses_.size()) return {};
  return std::vector<LossNotice>(losses_.begin() + static_cast<ptrdiff_t>(first), losses_.end());
}

absl::Status ControlClient::RecordLoss(const control::Lost& lost) {
  if (lost.process() < 0 || lost.process() >= size() ||
      static_cast<int64_t>(lost.reason().size()) > kMaxReasonBytes) {
    return Broken(
        absl::InternalError(absl::StrCat(Prefix(), "protocol error: a loss notice out of range")));
  }
  {
    absl::MutexLock lock(&loss_mu_);
    losses_.push_back(LossNotice{lost.process(), lost.reason()});
  }
  const uint64_t one = 1;
  if (notice_fd_.valid()) (void)!write(notice_fd_.get(), &one, sizeof(one));
  return absl::OkStatus();
}

absl::Status ControlClient::WatchLosses(absl::Time until, int wake_fd) {
  if (closed_.load()) {
    absl::MutexLock lock(&close_mu_);
    return close_reason_;
  }
  // Negative descriptors (no heartbeat thread, no wake_fd) are ignored by poll.
  pollfd fds[3] = {{fd_.get(), POLLIN, 0}, {notice_fd_.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
  const int ready = poll(fds, 3, PollTimeoutMs(until));
  if (fds[1].revents != 0) {  // The heartbeat thread recorded a notice: the caller looks now.
    uint64_t count = 0;
    (void)!read(notice_fd_.get(), &count, sizeof(count));
    return absl::OkStatus();
  }
  if (ready <= 0 || fds[0].revents == 0 || fds[2].revents != 0) {
    return absl::OkStatus();  // Nothing came (or EINTR), or the caller was woken.
  }
  if (!io_mu_.TryLock()) {
    // A call is reading the connection and records what came; look again shortly.
    absl::SleepFor(absl::Milliseconds(2));
    return absl::OkStatus();
  }
  absl::Status status = joined_ ? ReadUnasked() : absl::OkStatus();
  io_mu_.Unlock();
  return status;
}

absl::Status ControlClient::ReadUnasked() {
  if (closed_.load() || !broken_.ok()) return Broken(broken_);
  for (;;) {
    absl::StatusOr<bool> complete = reader_.ReadSome(fd_.get());
    if (!complete.ok()) {
      return Broken(Wrap(complete.status(), absl::StrCat(Prefix(), "lost the coordinator: ")));
    }
    if (!*complete) return absl::OkStatus();
    absl::StatusOr<control::Frame> frame = reader_.TakeFrame();
    if (!frame.ok()) return Broken(Wrap(frame.status(), Prefix()));
    if (frame->has_heartbeat() || frame->has_rendezvous_progress()) {
      // Liveness only (counted as it arrived); progress is stale once the roster came.
    } else if (frame->has_lost()) {
      WSYNC_RETURN_IF_ERROR(RecordLoss(frame->lost()));
    } else if (frame->has_roster()) {
      absl::StatusOr<Roster> update = ReadRoster(*frame->mutable_roster());
      if (!update.ok()) return update.status();
      roster_update_ = *std::move(update);
    } else if (frame->has_reject()) {
      return Broken(Wrap(StatusFromWire(frame->reject().code(), frame->reject().reason()),
                         absl::StrCat(Prefix(), "the coordinator closed the connection: ")));
    } else if (!frame->has_result() || frame->result().number() >= next_number_) {
      return Broken(absl::InternalError(
          absl::StrCat(Prefix(), "protocol error: unexpected frame from the coordinator")));
    }  // Else the late answer of an earlier call: dropped, as a call would.
  }
}

void ControlClient::Abort(const absl::Status& reason) {
  Close(absl::AbortedError(
      absl::StrCat(Prefix(), "aborted: ", reason.ok() ? "aborted" : reason.message())));
}

void ControlClient::Close(const absl::Status& reason) {
  {
    absl::MutexLock lock(&close_mu_);
    if (closed_.load()) return;
    close_reason_ = reason;
    closed_.store(true);
  }
  // Wakes a call blocked in poll; the descriptor itself is closed only by the destructor.
  if (fd_.valid()) shutdown(fd_.get(), SHUT_RDWR);
}

void ControlClient::SendHeartbeat() {
  // A call writing a frame holds the lock: its bytes tell the coordinator this process is alive.
  if (!write_mu_.TryLock()) return;
  if (writer_.empty()) {
    control::Frame frame;
    ProgressToProto(options_.progress, *frame.mutable_heartbeat());
    auto encoded = PrepareFrame(frame, coordinator_max_frame_bytes_);
    if (encoded.ok()) writer_.Enqueue(*std::move(encoded));  // Sealed here, under write_mu_.
  }
  // Never waits: what the socket does not take now goes with the next heartbeat or call; a
  // failed connection shows on the reading side.
  (void)writer_.Flush(fd_.get());
  write_mu_.Unlock();
}

void ControlClient::KeepAlive() {
  absl::Time heard_at = absl::Now();  // The Welcome just came.
  int64_t heard_bytes = bytes_heard_.load();
  absl::Time next_beat = heard_at + heartbeat_interval_;
  bool poll_connection = true;
  while (!closed_.load()) {
    failpoint::Evaluate("keepalive_thread");
    pollfd fds[2] = {{stop_fd_.get(), POLLIN, 0}, {poll_connection ? fd_.get() : -1, POLLIN, 0}};
    const absl::Time wake = std::min(next_beat, heard_at + silence_limit_);
    const int ready = poll(fds, 2, PollTimeoutMs(wake));
    if (ready > 0 && fds[0].revents != 0) return;  // The destructor.
    const absl::Time now = absl::Now();
    // Woken late, this thread (or its host) stalled: silence counts only time it was there to
    // hear. A silence check that was itself due by `wake` still fails below.
    if (now > wake) heard_at += now - wake;
    poll_connection = true;
    if (ready > 0 && fds[1].revents != 0) {
      heard_at = now;  // Something arrived (or the end, which the read below reports).
      if (io_mu_.TryLock()) {
        const absl::Status read = ReadUnasked();
        io_mu_.Unlock();
        if (!read.ok()) {
          // The connection is unusable (the calls report why): close it, so that the coordinator
          // takes this process as lost now instead of after the silence limit.
          shutdown(fd_.get(), SHUT_RDWR);
          return;
        }
      } else {
        poll_connection = false;  // A call holds the connection and reads; look at the next beat.
      }
    }
    if (const int64_t bytes = bytes_heard_.load(); bytes != heard_bytes) {
      heard_bytes = bytes;
      heard_at = now;
    }
    if (now - heard_at >= silence_limit_) {
      Close(absl::UnavailableError(absl::StrFormat(
          "%slost the coordinator: nothing arrived from it for %.1f s (the silence limit is "
          "%.1f s)",
          Prefix(), absl::ToDoubleSeconds(now - heard_at), absl::ToDoubleSeconds(silence_limit_))));
      return;
    }
    if (now >= next_beat) {
      SendHeartbeat();
      next_beat = now + heartbeat_interval_;
    }
  }
}

}  // namespace wsync
