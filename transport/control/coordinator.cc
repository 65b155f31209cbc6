#include "transport/control/coordinator.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/failpoint.h"
#include "common/status.h"
#include "transport/control/auth.h"
#include "transport/control/channel_keys.h"
#include "transport/control/coordinator_impl.h"
#include "transport/control/protocol.h"
#include "transport/control/socket.h"

namespace wsync {
namespace {

using coordinator_internal::ListOf;

constexpr int kMaxFramesPerTurn = 8;  // Per connection and poll turn, for fairness.
constexpr int kMaxAcceptsPerTurn = 64;
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);  // After EMFILE and the like.

std::string Millis(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d), "ms"); }

// The source of a peer address ("10.0.0.1:4242", "[::1]:4242"): the address without the port.
std::string SourceOf(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

// Who a Hello says it is, before its MAC is checked: "rollout rank 1" (", node n" when the node
// id is well formed); empty when the role is not one.
std::string ClaimOf(const control::Hello& hello) {
  const std::optional<ControlRole> role = RoleFromProto(hello.role());
  if (!role.has_value()) return "";
  return absl::StrCat(ControlRoleName(*role), " rank ", hello.rank(),
                      CheckIdentifier("node id", hello.node_id()).ok()
                          ? absl::StrCat(", node ", hello.node_id())
                          : "");
}

}  // namespace

void Coordinator::Impl::Run() {
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  while (!stop_.load()) {
    failpoint::Evaluate("coordinator_thread");
    const absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until_;
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
    for (const auto& c : connections_) {
      short events = c->closing ? 0 : POLLIN;
      if (!c->writer.empty()) events |= POLLOUT;
      fds.push_back({c->fd.get(), events, 0});
      polled.push_back(c.get());
    }
    absl::Time wake = NextDeadline();
    if (!accepting) wake = std::min(wake, accept_paused_until_);
    const int ready = poll(fds.data(), fds.size(), PollTimeoutMs(wake));
    if (stop_.load()) break;
    if (ready < 0 && errno != EINTR) absl::SleepFor(absl::Milliseconds(10));
    const absl::Time after = absl::Now();
    if (wake != absl::InfiniteFuture() && after > wake) DiscountOwnStall(after - wake);
    if (ready > 0) {
      if (fds[1].revents & POLLIN) AcceptAll(after);
      for (size_t i = 0; i < polled.size(); ++i) {
        Connection& c = *polled[i];
        const short revents = fds[i + 2].revents;
        if (c.gone) continue;
        if (!c.closing && (revents & (POLLIN | POLLHUP | POLLERR))) ReadFrom(c, after);
        if (c.closing && !(revents & POLLOUT) && (revents & (POLLHUP | POLLERR))) c.gone = true;
      }
    }
    HandleTimers(absl::Now());
    FlushAll();
    Sweep(absl::Now());
  }
  Shutdown();
}

absl::Time Coordinator::Impl::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  if (!rendezvous_done_ && !rendezvous_failed_)
    next = std::min(rendezvous_deadline_, NextProgress());
  if (!expiries_.empty()) next = std::min(next, std::get<0>(*expiries_.begin()));
  for (const auto& c : connections_) {
    if (c->closing) {
      next = std::min(next, c->close_deadline);
    } else if (c->phase == Phase::kHandshake) {
      next = std::min(next, c->handshake_deadline);
    } else {
      next = std::min(next, c->frame_deadline);
      if (c->heartbeats) {
        next = std::min({next, c->next_heartbeat, c->last_heard + options_.silence_limit});
      }
    }
  }
  return next;
}

void Coordinator::Impl::HandleTimers(absl::Time now) {
  for (const auto& c : connections_) {
    if (c->closing || c->gone) continue;
    if (c->phase == Phase::kHandshake && now >= c->handshake_deadline) {
      Refuse(*c, RefusalReason::kHandshakeTimeout,
             absl::DeadlineExceededError(absl::StrCat("control: handshake not completed within ",
                                                      Millis(options_.handshake_timeout))),
             now);
    } else if (c->phase != Phase::kHandshake && now >= c->frame_deadline) {
      Refuse(*c, RefusalReason::kFrameTimeout,
             absl::DeadlineExceededError(absl::StrCat("control: a frame was not completed within ",
                                                      Millis(options_.frame_timeout))),
             now);
    } else if (c->heartbeats) {
      KeepAlive(*c, now);
    }
  }
  if (!rendezvous_done_ && !rendezvous_failed_ && now >= rendezvous_deadline_) {
    const std::vector<std::string> missing = MissingProcesses();
    FailRendezvous(absl::DeadlineExceededError(absl::StrCat(
                       "control: rendezvous failed: ", missing.size(), " of ", world_,
                       " processes did not join within ", Millis(options_.rendezvous_timeout),
                       ": missing ", ListOf(missing), RefusalsText(now))),
                   now);
  }
  ReportProgress(now);
  while (!expiries_.empty() && std::get<0>(*expiries_.begin()) <= now) {
    const auto [when, number, id] = *expiries_.begin();
    ExpireContributor(number, id);  // Removes the entry.
  }
}

void Coordinator::Impl::DiscountOwnStall(absl::Duration late) {
  // The peers' bytes of that time, if any, are read in this turn before any silence is judged; a
  // check that was itself due by `wake` still fails the peer in this turn (now - last_heard stays
  // at least silence_limit).
  for (const auto& c : connections_) {
    if (c->heartbeats && c->last_heard != absl::InfiniteFuture()) c->last_heard += late;
  }
}

void Coordinator::Impl::KeepAlive(Connection& c, absl::Time now) {
  const absl::Duration silent = now - c.last_heard;
  if (silent >= options_.silence_limit) {
    {
      absl::MutexLock lock(&mu_);
      ++counters_.silent;
    }
    // A frozen host's connection never closes: close it as if it had, so that its process is lost
    // the same way (and, should it wake up, it learns why instead of talking on as if in the job).
    SendReject(c,
               absl::UnavailableError(absl::StrFormat(
                   "control: nothing arrived from this process for %.1f s (the silence limit "
                   "is %.1f s); the coordinator took it as lost",
                   absl::ToDoubleSeconds(silent), absl::ToDoubleSeconds(options_.silence_limit))));
    c.closing = true;
    c.close_deadline = now + options_.close_timeout;
    Detach(c, absl::StrFormat("silent for %.1f s (no frame, not even a heartbeat)%s",
                              absl::ToDoubleSeconds(silent), LastProgressNote(c.process)));
    return;
  }
  if (now >= c.next_heartbeat) {
    // Anything queued already tells the peer that the coordinator is alive.
    if (c.writer.empty()) {
      control::Frame frame;
      frame.mutable_heartbeat();
      Send(c, frame);
    }
    c.next_heartbeat = now + options_.heartbeat_interval;
  }
}

void Coordinator::Impl::AcceptAll(absl::Time now) {
  // Pending connections (accepted, not yet welcomed) in accept order, and their count per source.
  std::deque<Connection*> pending;
  absl::flat_hash_map<std::string, int32_t> per_source;
  for (const auto& c : connections_) {
    if (!c->closing && !c->gone && c->phase == Phase::kHandshake) {
      pending.push_back(c.get());
      ++per_source[c->source];
    }
  }
  // Closes the oldest pending connection of `source` (any source when empty) that has been
  // pending for at least pending_grace, at once. False when there is none.
  auto displace = [&](const std::string& source) {
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      Connection* old = *it;
      if (old->closing || old->gone || (!source.empty() && old->source != source)) continue;
      if (now - old->accepted_at < options_.pending_grace) return false;  // The rest are younger.
      Count(RefusalReason::kTooManyConnections);
      Drop(*old, "displaced by newer connections");
      --per_source[old->source];
      pending.erase(it);
      return true;
    }
    return false;
  };
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
    {
      absl::MutexLock lock(&mu_);
      ++counters_.accepted;
    }
    auto owned = std::make_unique<Connection>(std::move(fd), options_.max_handshake_frame_bytes);
    Connection& c = *owned;
    connections_.push_back(std::move(owned));
    c.peer = PeerAddress(c.fd.get());
    c.source = SourceOf(c.peer);
    c.handshake_deadline = now + options_.handshake_timeout;
    if (rendezvous_failed_) {
      Refuse(c, RefusalReason::kRendezvousClosed,
             absl::FailedPreconditionError("control: the job's rendezvous failed"), now);
      continue;
    }
    c.accepted_at = now;
    // At a limit, the new connection displaces the oldest pending one past its grace, or, when all
    // are younger, is closed at once (no Reject to linger over: a client retries a connection
    // closed before its Challenge).
    if ((per_source[c.source] >= options_.max_pending_per_source && !displace(c.source)) ||
        (static_cast<int32_t>(pending.size()) >= options_.max_pending_connections &&
         !displace(""))) {
      Count(RefusalReason::kTooManyConnections);
      Drop(c, "too many pending connections");
      continue;
    }
    absl::StatusOr<std::string> nonce = RandomBytes(kNonceBytes);
    if (!nonce.ok()) {
      SendReject(c, nonce.status());
      Drop(c, "no nonce");
      continue;
    }
    pending.push_back(&c);
    ++per_source[c.source];
    c.nonce = *std::move(nonce);
    control::Frame frame;
    control::Challenge* challenge = frame.mutable_challenge();
    challenge->set_protocol_version(kControlProtocolVersion);
    challenge->set_nonce(c.nonce);
    challenge->set_coordinator_id(options_.coordinator_id);
    Send(c, frame);
  }
}

void Coordinator::Impl::ReadFrom(Connection& c, absl::Time now) {
  c.last_heard = now;  // Called when bytes (or the end) arrived: either way the peer is not silent.
  for (int i = 0; i < kMaxFramesPerTurn && !c.closing && !c.gone; ++i) {
    absl::StatusOr<bool> complete = c.reader.ReadSome(c.fd.get());
    if (!complete.ok()) {
      const absl::Status& error = complete.status();
      if (absl::IsResourceExhausted(error)) {
        Refuse(c, RefusalReason::kOversizedFrame, error, now);
      } else if (absl::IsDataLoss(error)) {
        Refuse(c, RefusalReason::kTruncatedFrame, error, now);
      } else {
        Drop(c, absl::IsUnavailable(error) ? "disconnected" : error.message());
      }
      return;
    }
    if (!*complete) {
      if (c.reader.mid_frame() && c.frame_deadline == absl::InfiniteFuture()) {
        c.frame_deadline = now + options_.frame_timeout;
      }
      return;
    }
    c.frame_deadline = absl::InfiniteFuture();
    absl::StatusOr<control::Frame> frame = c.reader.TakeFrame();
    if (!frame.ok()) {  // Forged, replayed or reordered (sealed), or malformed.
      Refuse(c,
             absl::IsUnauthenticated(frame.status()) ? RefusalReason::kAuthenticationFailed
                                                     : RefusalReason::kMalformedFrame,
             frame.status(), now);
      return;
    }
    OnFrame(c, *frame, now);
  }
}

void Coordinator::Impl::OnFrame(Connection& c, control::Frame& frame, absl::Time now) {
  const control::Frame::KindCase kind = frame.kind_case();
  if (c.phase != Phase::kHandshake && kind == control::Frame::kHeartbeat) {
    return NoteProgress(c, *frame.mutable_heartbeat());  // Liveness: ReadFrom. Any later state.
  }
  if (c.phase == Phase::kHandshake && kind == control::Frame::kHello) {
    HandleHello(c, frame.hello(), now);
  } else if (c.phase == Phase::kHandshake && kind == control::Frame::kStatusRequest) {
    HandleStatusRequest(c, frame.status_request(), now);
  } else if (c.phase == Phase::kWelcomed && kind == control::Frame::kJoin) {
    if (rendezvous_done_) {
      AdmitReplacement(c, *frame.mutable_join(), now);
    } else {
      HandleJoin(c, *frame.mutable_join());
    }
  } else if (c.phase == Phase::kJoined && rendezvous_done_ && kind == control::Frame::kContribute) {
    HandleContribute(c, *frame.mutable_contribute(), now);
  } else {
    Refuse(c, RefusalReason::kUnexpectedFrame,
           absl::FailedPreconditionError(absl::StrCat("control: unexpected frame (kind ",
                                                      static_cast<int>(kind), ") at this point")),
           now);
  }
}

void Coordinator::Impl::Send(Connection& c, const control::Frame& frame) {
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) {
    // Only a result can be this large, and results are checked first; fail the connection loudly.
    Drop(c, encoded.status().message());
    return;
  }
  c.writer.Enqueue(*std::move(encoded));
}

void Coordinator::Impl::SendReject(Connection& c, const absl::Status& status) {
  control::Frame frame;
  frame.mutable_reject()->set_code(static_cast<int32_t>(status.code()));
  frame.mutable_reject()->set_reason(TruncateText(status.message(), kMaxReasonBytes));
  Send(c, frame);
}

void Coordinator::Impl::Refuse(Connection& c, RefusalReason reason, const absl::Status& status,
                               absl::Time now) {
  Count(reason);
  NoteRefusal(c, status, now);
  SendReject(c, status);
  c.closing = true;
  c.close_deadline = now + options_.close_timeout;
  Detach(c, absl::StrCat("refused: ", status.message()));
}

void Coordinator::Impl::Drop(Connection& c, absl::string_view why) {
  c.gone = true;
  Detach(c, why);
}

void Coordinator::Impl::Detach(Connection& c, absl::string_view why) {
  if (c.process < 0) return;
  const int32_t id = c.process;
  Process& p = processes_[id];
  c.process = -1;
  p.connection = nullptr;
  if (rendezvous_done_) {
    p.lost = true;
    p.lost_reason = std::string(why);
    {
      absl::MutexLock lock(&mu_);
      ++counters_.lost;
    }
    NoticeLoss(id);
    OnProcessLost(id);
  } else if (p.joined) {
    // Before the roster a process may leave and its rank join again.
    p.joined = false;
    p.left = true;
    --joined_count_;
    progress_changed_ = true;
    std::string().swap(p.manifest);
    std::string().swap(p.address);
    std::string().swap(p.metadata);
  }
}

void Coordinator::Impl::NoticeLoss(int32_t id) {
  control::Frame frame;
  control::Lost* lost = frame.mutable_lost();
  lost->set_process(id);
  lost->set_reason(TruncateText(
      absl::StrCat(Describe(id), " was lost: ", processes_[id].lost_reason), kMaxReasonBytes));
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) return;  // A notice is small; the cap cannot refuse it.
  auto shared = *std::move(encoded);
  for (int32_t q = 0; q < world_; ++q) {
    const Connection* c = processes_[q].connection;
    if (q == id || c == nullptr || c->closing || c->gone || c->phase != Phase::kJoined) continue;
    processes_[q].connection->writer.Enqueue(shared);
  }
}

void Coordinator::Impl::FlushAll() {
  for (const auto& c : connections_) {
    if (c->gone || c->writer.empty()) continue;
    absl::StatusOr<bool> done = c->writer.Flush(c->fd.get());
    if (!done.ok()) Drop(*c, "connection lost while sending");
  }
}

void Coordinator::Impl::Sweep(absl::Time now) {
  std::erase_if(connections_, [&](const std::unique_ptr<Connection>& c) {
    if (!c->gone && !(c->closing && (c->writer.empty() || now >= c->close_deadline))) {
      return false;
    }
    Detach(*c, "closed");
    if (!c->gone) {
      // Discard what the peer sent and we did not read (bounded, never waiting): closing with
      // unread input would reset the connection and could destroy the Reject before it is read.
      char sink[4096];
      for (int i = 0; i < 16 && recv(c->fd.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
      }
      shutdown(c->fd.get(), SHUT_WR);
    }
    return true;  // The descriptor closes with the connection.
  });
}

void Coordinator::Impl::Shutdown() {
  for (const auto& c : connections_) {
    if (c->gone) continue;
    if (!c->closing) SendReject(*c, absl::UnavailableError("control: the coordinator stopped"));
    (void)c->writer.Flush(c->fd.get());  // Best effort, never waits.
  }
  connections_.clear();
}

void Coordinator::Impl::HandleHello(Connection& c, const control::Hello& hello, absl::Time now) {
  auto refuse = [&](RefusalReason reason, absl::Status status) { Refuse(c, reason, status, now); };
  c.claim = ClaimOf(hello);
  if (hello.protocol_version() != kControlProtocolVersion) {
    return refuse(
        RefusalReason::kProtocolVersion,
        absl::FailedPreconditionError(absl::StrCat(
            "control: protocol version ", hello.protocol_version(),
            " is not supported; the coordinator speaks version ", kControlProtocolVersion)));
  }
  const std::optional<ControlRole> role = RoleFromProto(hello.role());
  if (!role.has_value()) {
    return refuse(RefusalReason::kBadField, absl::InvalidArgumentError("control: bad role"));
  }
  absl::Status ids = CheckIdentifier("job id", hello.job_id());
  if (ids.ok()) ids = CheckIdentifier("node id", hello.node_id());
  if (!ids.ok()) {
    return refuse(RefusalReason::kBadField,
                  absl::InvalidArgumentError(absl::StrCat("control: ", ids.message())));
  }
  if (hello.client_nonce().size() != kNonceBytes || hello.mac().size() != kMacBytes) {
    return refuse(RefusalReason::kBadField,
                  absl::InvalidArgumentError("control: bad nonce or MAC length"));
  }
  const std::string expected = HelloMac(options_.secret, c.nonce, hello.client_nonce(),
                                        hello.job_id(), *role, hello.rank(), hello.node_id());
  if (!ConstantTimeEquals(expected, hello.mac())) {
    return refuse(RefusalReason::kAuthenticationFailed,
                  absl::UnauthenticatedError("control: authentication failed"));
  }
  // Authenticated from here on: the peer holds the secret, so details help the operator.
  if (hello.job_id() != options_.job_id) {
    return refuse(
        RefusalReason::kUnknownJob,
        absl::InvalidArgumentError(absl::StrCat("control: unknown job id '", hello.job_id(), "'")));
  }
  const int32_t count =
      *role == ControlRole::kTrainer ? options_.num_trainers : options_.num_rollouts;
  if (hello.rank() < 0 || hello.rank() >= count) {
    return refuse(RefusalReason::kRankOutOfRange,
                  absl::OutOfRangeError(absl::StrCat("control: ", ControlRoleName(*role), " rank ",
                                                     hello.rank(), " is out of range: the job has ",
                                                     count, " ", ControlRoleName(*role), "s")));
  }
  const int32_t id = GlobalProcessId(*role, hello.rank(), options_.num_trainers);
  Process& p = processes_[id];
  if (p.connection != nullptr) {
    return refuse(RefusalReason::kDuplicateRank,
                  absl::AlreadyExistsError(
                      absl::StrCat("control: ", ControlRoleName(*role), " rank ", hello.rank(),
                                   " has already joined (", Describe(id), ")")));
  }
  if (rendezvous_failed_ || (rendezvous_done_ && !p.lost)) {
    return refuse(RefusalReason::kRendezvousClosed,
                  absl::FailedPreconditionError(absl::StrCat(
                      "control: the job's rendezvous ", rendezvous_failed_ ? "failed" : "is over",
                      "; ", Describe(id), " cannot join")));
  }
  // After the rendezvous a lost process's rank may be taken by a replacement (AdmitReplacement).
  p.connection = &c;
  p.node_id = hello.node_id();
  c.process = id;
  c.phase = Phase::kWelcomed;
  c.handshake_deadline = absl::InfiniteFuture();
  c.reader.set_max_frame_bytes(options_.max_frame_bytes);
  c.heartbeats = hello.heartbeats() && options_.heartbeat_interval > absl::ZeroDuration();
  c.rendezvous_progress = hello.rendezvous_progress();
  if (c.heartbeats) {
    c.last_heard = now;
    c.next_heartbeat = now + options_.heartbeat_interval;
  }
  {
    absl::MutexLock lock(&mu_);
    ++counters_.welcomed;
  }
  control::Frame frame;
  control::Welcome* welcome = frame.mutable_welcome();
  welcome->set_process(id);
  welcome->set_num_trainers(options_.num_trainers);
  welcome->set_num_rollouts(options_.num_rollouts);
  welcome->set_max_frame_bytes(options_.max_frame_bytes);
  if (c.heartbeats) {
    welcome->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
    welcome->set_silence_limit_ms(absl::ToInt64Milliseconds(options_.silence_limit));
  }
  welcome->set_mac(WelcomeMac(options_.secret, hello.client_nonce(), c.nonce, options_.job_id,
                              WelcomeFieldsOf(*welcome)));
  Send(c, frame);  // The last unsealed frame: every later one in either direction is sealed.
  if (absl::Status sealed =
          SealChannel(ChannelSide::kCoordinator, options_.secret, c.nonce, hello.client_nonce(),
                      options_.job_id, id, Describe(id), c.reader, c.writer);
      !sealed.ok()) {
    Drop(c, sealed.message());
  }
}

void Coordinator::Impl::HandleJoin(Connection& c, control::Join& join) {
  Process& p = processes_[c.process];
  p.manifest = std::move(*join.mutable_manifest());
  p.address = std::move(*join.mutable_address());
  p.metadata = std::move(*join.mutable_metadata());
  p.joined = true;
  p.left = false;
  c.phase = Phase::kJoined;
  ++joined_count_;
  progress_changed_ = true;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.joined;
  }
  if (joined_count_ == world_) CompleteRendezvous();
}

void Coordinator::Impl::CompleteRendezvous() {
  control::Frame frame;
  control::Roster* roster = frame.mutable_roster();
  roster->set_num_trainers(options_.num_trainers);
  roster->set_num_rollouts(options_.num_rollouts);
  absl::flat_hash_map<absl::string_view, int32_t> blob_index;
  auto blob = [&](const std::string& bytes) {
    auto [it, inserted] = blob_index.try_emplace(bytes, roster->blobs_size());
    if (inserted) roster->add_blobs(bytes);
    return it->second;
  };
  for (int32_t id = 0; id < world_; ++id) {
    const Process& p = processes_[id];
    control::RosterEntry* entry = roster->add_processes();
    entry->set_process(id);
    entry->set_role(RoleToProto(p.role));
    entry->set_rank(p.rank);
    entry->set_node_id(p.node_id);
    entry->set_manifest(blob(p.manifest));
    entry->set_metadata(blob(p.metadata));
    entry->set_address(p.address);
  }
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) {
    FailRendezvous(absl::ResourceExhaustedError(
                       absl::StrCat("control: rendezvous failed: the roster (",
                                    frame.ByteSizeLong(), " bytes) exceeds the frame cap of ",
                                    options_.max_frame_bytes, " bytes; raise max_frame_bytes")),
                   absl::Now());
    return;
  }
  rendezvous_done_ = true;
  roster_ = *roster;
  {
    absl::MutexLock lock(&mu_);
    rendezvous_status_ = absl::OkStatus();
  }
  auto shared = *std::move(encoded);
  for (Process& p : processes_) {
    p.connection->writer.Enqueue(shared);
    std::string().swap(p.manifest);  // The roster holds them now.
    std::string().swap(p.address);
    std::string().swap(p.metadata);
  }
}

void Coordinator::Impl::AdmitReplacement(Connection& c, control::Join& join, absl::Time now) {
  const int32_t id = c.process;
  Process& p = processes_[id];
  control::RosterEntry& entry = *roster_.mutable_processes(id);
  if (join.manifest() != roster_.blobs(entry.manifest())) {
    return Refuse(c, RefusalReason::kBadField,
                  absl::InvalidArgumentError(absl::StrCat(
                      "control: ", Describe(id),
                      " cannot replace the lost process: its layout part differs from the one "
                      "the job was planned with")),
                  now);
  }
  // The job's next round: live processes never wait in a round while a process is lost (every
  // such round fails at once), so every existing round is below it and failed; the replacement
  // counts as having contributed to them, so that they can be released.
  uint64_t next = 0;
  for (int32_t q = 0; q < world_; ++q) {
    if (q != id && !processes_[q].lost) next = std::max(next, processes_[q].next_number);
  }
  std::vector<uint64_t> done;
  for (auto& [number, r] : rounds_) {
    if (r.contributed[id]) continue;
    r.contributed[id] = 1;
    r.answered[id] = 1;
    if (++r.count == world_) done.push_back(number);
  }
  for (uint64_t number : done) rounds_.erase(number);
  p.next_number = next;
  p.lost = false;
  p.lost_reason.clear();
  p.joined = true;
  c.phase = Phase::kJoined;
  entry.set_node_id(p.node_id);
  entry.set_address(std::move(*join.mutable_address()));
  roster_.set_epoch(roster_.epoch() + 1);
  roster_.set_next_collective(next);
  {
    absl::MutexLock lock(&mu_);
    ++counters_.joined;
    ++counters_.replaced;
  }
  auto encoded = PrepareFrame(
      [&] {
        control::Frame frame;
        *frame.mutable_roster() = roster_;
        return frame;
      }(),
      options_.max_frame_bytes);
  if (!encoded.ok()) return Drop(c, encoded.status().message());
  auto shared = *std::move(encoded);
  for (const Process& q : processes_) {
    if (q.connection != nullptr && !q.connection->closing && !q.connection->gone) {
      q.connection->writer.Enqueue(shared);
    }
  }
}

void Coordinator::Impl::FailRendezvous(const absl::Status& status, absl::Time now) {
  rendezvous_failed_ = true;
  {
    absl::MutexLock lock(&mu_);
    rendezvous_status_ = status;
  }
  for (const auto& c : connections_) {
    if (c->closing || c->gone) continue;
    SendReject(*c, status);
    c->closing = true;
    c->close_deadline = now + options_.close_timeout;
    Detach(*c, "rendezvous failed");
  }
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
      std::fprintf(stderr, "%s\n", failed.ToString().c_str());
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
