// ControlClient (client.h): Connect and the handshake on the caller, then the calls, which queue
// their frames for the I/O thread (client_io.cc) and wait for their completion.

#include "control/client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "control/auth.h"
#include "control/channel_keys.h"
#include "control/rendezvous_progress.h"

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

// Counts a public call that may wait, for its whole run, so that destruction waits for it to
// return (the destructor fails it first).
class ControlClient::Waiter {
 public:
  explicit Waiter(ControlClient* client) : client_(client) {
    absl::MutexLock lock(&client_->mu_);
    ++client_->waiters_;
  }
  ~Waiter() {
    absl::MutexLock lock(&client_->mu_);
    --client_->waiters_;
  }
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

 private:
  ControlClient* const client_;
};

ControlClient::~ControlClient() {
  if (io_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;  // Before Close: the I/O thread hands what is queued to the socket first.
    }
    Close(absl::CancelledError(absl::StrCat(Prefix(), "the control client was destroyed")));
    io_.join();
  }
  {
    absl::MutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiters_ == 0; };
    mu_.Await(absl::Condition(&none));
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
      WSYNC_RETURN_IF_ERROR(client->StartIo());
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
  // Every later frame in either direction is sealed (the I/O thread starts after this).
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

absl::Status ControlClient::Ending::Named(absl::string_view name) const {
  return absl::Status(code, absl::StrCat(name, text));
}

absl::Status ControlClient::UnusableLocked(absl::string_view name) {
  if (!close_reason_.ok()) return close_reason_;
  if (broken_.ok() && ending_.has_value()) broken_ = ending_->Named(name);
  if (broken_.ok() && io_done_) {
    broken_ = absl::UnavailableError(absl::StrCat(name, "the connection to the coordinator ended"));
  }
  return broken_;
}

absl::Status ControlClient::BreakLocked(const absl::Status& cause) {
  if (broken_.ok()) broken_ = cause;
  finish_ = true;
  WakeIo();
  return UnusableLocked(Prefix());
}

absl::Status ControlClient::Break(const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  return BreakLocked(cause);
}

absl::StatusOr<Roster> ControlClient::Join(const JoinRequest& request, absl::Time deadline) {
  Call call;
  call.name = absl::StrCat(Prefix(), "waiting for the roster, ");
  control::Frame frame;
  control::Join* join = frame.mutable_join();
  join->set_manifest(request.manifest);
  join->set_address(request.address);
  join->set_metadata(request.metadata);
  const int64_t bytes = static_cast<int64_t>(frame.ByteSizeLong());
  Waiter waiter(this);
  absl::MutexLock lock(&mu_);
  WSYNC_RETURN_IF_ERROR(UnusableLocked(call.name));
  if (join_attempted_) {
    return absl::FailedPreconditionError(absl::StrCat(Prefix(), "Join may be called only once"));
  }
  join_attempted_ = true;
  if (bytes > coordinator_max_frame_bytes_) {
    return BreakLocked(
        absl::ResourceExhaustedError(absl::StrCat(Prefix(), "sending the join: the join (", bytes,
                                                  " bytes) exceeds the coordinator's frame cap of ",
                                                  coordinator_max_frame_bytes_, " bytes")));
  }
  outbox_.push_back(std::move(frame));
  join_call_ = &call;
  WakeIo();
  mu_.AwaitWithDeadline(absl::Condition(&call.done), deadline);
  if (!call.done) {
    join_call_ = nullptr;
    const std::string progress =
        rendezvous_progress_.has_value()
            ? absl::StrCat("; the coordinator reported ",
                           DescribeRendezvousProgress(*rendezvous_progress_,
                                                      absl::Now() - rendezvous_progress_at_))
            : "; the coordinator reported no rendezvous progress";
    return BreakLocked(absl::DeadlineExceededError(absl::StrCat(
        Prefix(), "waiting for the roster: no frame arrived before the deadline", progress)));
  }
  if (!call.status.ok()) return call.status;
  return std::move(*call.roster);
}

std::optional<Roster> ControlClient::TakeRosterUpdate() {
  absl::MutexLock lock(&mu_);
  return std::exchange(roster_update_, std::nullopt);
}

bool ControlClient::HasRosterUpdate() {
  absl::MutexLock lock(&mu_);
  return roster_update_.has_value();
}

absl::StatusOr<control::Result> ControlClient::Collective(control::Contribute contribute,
                                                          absl::Time deadline) {
  const absl::string_view kind = CollectiveName(contribute.kind());
  Call call;
  absl::MutexLock lock(&mu_);
  if (!close_reason_.ok()) return close_reason_;
  if (!joined_) {
    return absl::FailedPreconditionError(absl::StrCat(Prefix(), kind, " before a successful Join"));
  }
  const uint64_t number = next_number_++;
  call.name = absl::StrCat(Prefix(), kind, " #", number, ": ");
  WSYNC_RETURN_IF_ERROR(UnusableLocked(call.name));
  contribute.set_number(number);
  const absl::Duration remaining = std::max(deadline - absl::Now(), absl::ZeroDuration());
  const absl::Duration margin = std::min(remaining / 10, kMaxMargin);
  contribute.set_timeout_ms(absl::ToInt64Milliseconds(remaining - margin));
  control::Frame frame;
  *frame.mutable_contribute() = std::move(contribute);
  absl::Status local;  // Set when this process fails its own contribution.
  if (static_cast<int64_t>(frame.ByteSizeLong()) > coordinator_max_frame_bytes_) {
    local = absl::ResourceExhaustedError(absl::StrCat(
        call.name, "the contribution (", frame.ByteSizeLong(),
        " bytes) exceeds the coordinator's frame cap of ", coordinator_max_frame_bytes_, " bytes"));
    // Tell the others, so that their round fails at once instead of at their deadline.
    control::Contribute* failed = frame.mutable_contribute();
    failed->clear_payload();
    failed->set_failed(true);
    failed->set_reason(TruncateText(Strip(local.message()), kMaxReasonBytes));
  }
  if (absl::Status fp = failpoint::Check("control"); !fp.ok()) {
    return BreakLocked(Wrap(fp, call.name));
  }
  outbox_.push_back(std::move(frame));
  WakeIo();
  if (!local.ok()) return local;  // Its Result, when it comes, is dropped.
  calls_[number] = &call;
  mu_.AwaitWithDeadline(absl::Condition(&call.done), deadline);
  if (!call.done) {
    // The frame may still be on its way (it goes out before any later one); a late answer is
    // dropped.
    calls_.erase(number);
    return absl::DeadlineExceededError(
        absl::StrCat(call.name, "no answer from the coordinator before the deadline"));
  }
  if (!call.status.ok()) return call.status;
  if (call.result.code() != 0) {
    return StatusFromWire(call.result.code(), absl::StrCat(Prefix(), call.result.message()));
  }
  return std::move(call.result);
}

absl::StatusOr<std::vector<std::string>> ControlClient::AllGather(absl::string_view payload,
                                                                  absl::Time deadline) {
  Waiter waiter(this);
  control::Contribute c;
  c.set_kind(control::COLLECTIVE_ALL_GATHER);
  c.set_payload(std::string(payload));
  WSYNC_ASSIGN_OR_RETURN(control::Result result, Collective(std::move(c), deadline));
  if (result.payloads_size() != size()) {
    return Break(absl::InternalError(absl::StrCat(Prefix(), "protocol error: AllGather returned ",
                                                  result.payloads_size(), " payloads")));
  }
  std::vector<std::string> all;
  all.reserve(size());
  for (std::string& p : *result.mutable_payloads()) all.push_back(std::move(p));
  return all;
}

absl::StatusOr<std::string> ControlClient::Broadcast(int32_t root, absl::string_view payload,
                                                     absl::Time deadline) {
  Waiter waiter(this);
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
    return Break(absl::InternalError(absl::StrCat(Prefix(), "protocol error: Broadcast returned ",
                                                  result.payloads_size(), " payloads")));
  }
  return std::move(*result.mutable_payloads(0));
}

absl::Status ControlClient::Barrier(absl::Time deadline) {
  Waiter waiter(this);
  control::Contribute c;
  c.set_kind(control::COLLECTIVE_BARRIER);
  return Collective(std::move(c), deadline).status();
}

absl::Status ControlClient::Decide(bool ok, absl::string_view reason, absl::Time deadline) {
  Waiter waiter(this);
  control::Contribute c;
  c.set_kind(control::COLLECTIVE_DECIDE);
  c.set_ok(ok);
  if (!ok) c.set_reason(TruncateText(reason, kMaxReasonBytes));
  return Collective(std::move(c), deadline).status();
}

size_t ControlClient::loss_count() const {
  absl::MutexLock lock(&mu_);
  return losses_.size();
}

std::vector<LossNotice> ControlClient::LossesSince(size_t first) const {
  absl::MutexLock lock(&mu_);
  if (first >= losses_.size()) return {};
  return std::vector<LossNotice>(losses_.begin() + static_cast<ptrdiff_t>(first), losses_.end());
}

absl::Status ControlClient::WatchLosses(absl::Time until, int wake_fd) {
  Waiter waiter(this);
  absl::MutexLock lock(&mu_);
  WSYNC_RETURN_IF_ERROR(UnusableLocked(Prefix()));
  const uint64_t seen = events_;
  auto happened = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_ != seen; };
  UniqueFd notice(wake_fd >= 0 ? eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) : -1);
  if (!notice.valid()) {
    // No wake_fd to watch (or no descriptor left for the notice: wake_fd is then looked at every
    // 10 ms).
    const absl::Time slice =
        wake_fd >= 0 ? std::min(until, absl::Now() + absl::Milliseconds(10)) : until;
    mu_.AwaitWithDeadline(absl::Condition(&happened), slice);
    return UnusableLocked(Prefix());
  }
  // NotifyLocked writes to every registered notice, under mu_: no event after `seen` is missed.
  watchers_.push_back(notice.get());
  mu_.Unlock();
  pollfd fds[2] = {{notice.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
  (void)poll(fds, 2, PollTimeoutMs(until));
  mu_.Lock();
  watchers_.erase(std::find(watchers_.begin(), watchers_.end(), notice.get()));
  return UnusableLocked(Prefix());
}

void ControlClient::Abort(const absl::Status& reason) {
  Close(absl::AbortedError(
      absl::StrCat(Prefix(), "aborted: ", reason.ok() ? "aborted" : reason.message())));
}

void ControlClient::Close(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (!close_reason_.ok()) return;
  close_reason_ = reason;
  finish_ = true;
  EndLocked(std::nullopt);  // Every waiting call fails with the reason now.
  WakeIo();
}

}  // namespace wsync
