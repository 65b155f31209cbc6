// The coordinator's protocol core: connections, timers, heartbeats and losses
// (coordinator_core.h). Handshake and rendezvous are in coordinator_admission.cc; rounds, progress
// and status in coordinator_rounds.cc, coordinator_progress.cc and coordinator_status.cc.

#include "control/coordinator_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "control/auth.h"

namespace wsync {
namespace {

using coordinator_internal::ListOf;

std::string Millis(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d), "ms"); }

// The source of a peer address ("10.0.0.1:4242", "[::1]:4242"): the address without the port.
std::string SourceOf(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

}  // namespace

CoordinatorCore::CoordinatorCore(CoordinatorOptions options, absl::Time start)
    : options_(std::move(options)),
      world_(options_.num_trainers + options_.num_rollouts),
      rendezvous_deadline_(start + options_.rendezvous_timeout) {
  processes_.resize(world_);
  for (int32_t id = 0; id < world_; ++id) {
    const bool trainer = id < options_.num_trainers;
    processes_[id].role = trainer ? ControlRole::kTrainer : ControlRole::kRollout;
    processes_[id].rank = trainer ? id : id - options_.num_trainers;
  }
}

CoordinatorCore::~CoordinatorCore() { WipeSecret(options_.secret); }

CoordinatorCounters CoordinatorCore::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

absl::Status CoordinatorCore::rendezvous_status() const {
  absl::MutexLock lock(&mu_);
  return rendezvous_status_;
}

std::vector<CoordinatorAction> CoordinatorCore::TakeActions() {
  std::vector<CoordinatorAction> taken;
  taken.swap(actions_);
  return taken;
}

CoordinatorCore::Connection* CoordinatorCore::Find(ConnectionId id) {
  auto it = connections_.find(id);
  return it == connections_.end() || !it->second.open ? nullptr : &it->second;
}

void CoordinatorCore::Reap() {
  if (!reap_) return;
  reap_ = false;
  std::erase_if(connections_, [](const auto& entry) { return !entry.second.open; });
}

void CoordinatorCore::Opened(absl::Time now, ConnectionId id, absl::string_view peer,
                             absl::StatusOr<std::string> nonce) {
  if (id == 0 || connections_.contains(id)) return;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.accepted;
  }
  Connection& c = connections_[id];
  c.id = id;
  c.peer = std::string(peer);
  c.source = SourceOf(c.peer);
  c.handshake_deadline = now + options_.handshake_timeout;
  if (rendezvous_failed_) {
    Refuse(c, RefusalReason::kRendezvousClosed,
           absl::FailedPreconditionError("control: the job's rendezvous failed"), now);
    return Reap();
  }
  c.accepted_at = now;
  // At a limit, the new connection displaces a pending one (see CoordinatorOptions), or, when
  // none may go, is closed at once (no Reject to linger over: a client retries a connection
  // closed before its Challenge).
  const auto from_source = pending_per_source_.find(c.source);
  const int32_t same_source = from_source == pending_per_source_.end() ? 0 : from_source->second;
  if ((same_source >= options_.max_pending_per_source && !Displace(c.source, now)) ||
      (static_cast<int32_t>(pending_.size()) >= options_.max_pending_connections &&
       !DisplaceLargestShare(same_source) && !Displace("", now))) {
    Count(RefusalReason::kTooManyConnections);
    Drop(c, "too many pending connections");
    return Reap();
  }
  if (!nonce.ok()) {
    SendReject(c, nonce.status());
    Drop(c, "no nonce");
    return Reap();
  }
  c.pending = true;
  pending_.insert(id);
  ++pending_per_source_[c.source];
  c.nonce = *std::move(nonce);
  control::Frame frame;
  control::Challenge* challenge = frame.mutable_challenge();
  challenge->set_protocol_version(kControlProtocolVersion);
  challenge->set_nonce(c.nonce);
  challenge->set_coordinator_id(options_.coordinator_id);
  Send(c, frame);
  Reap();
}

bool CoordinatorCore::Displace(const std::string& source, absl::Time now) {
  for (ConnectionId id : pending_) {
    Connection& old = connections_.at(id);
    if (!source.empty() && old.source != source) continue;
    if (now - old.accepted_at < options_.pending_grace) return false;  // The rest are younger.
    Count(RefusalReason::kTooManyConnections);
    Drop(old, "displaced by newer connections");  // Leaves pending_: the loop ends here.
    return true;
  }
  return false;
}

bool CoordinatorCore::DisplaceLargestShare(int32_t same_source) {
  int32_t most = 0;
  for (const auto& [source, count] : pending_per_source_) most = std::max(most, count);
  if (same_source >= most) return false;
  // The oldest connection of a largest share: the longest silent one of the sources most likely
  // to be flooding (a real process leaves pending_ within a round trip of its Challenge).
  for (ConnectionId id : pending_) {
    Connection& old = connections_.at(id);
    if (pending_per_source_.at(old.source) != most) continue;
    Count(RefusalReason::kTooManyConnections);
    Drop(old, "displaced by a source with fewer pending connections");
    return true;
  }
  return false;
}

void CoordinatorCore::Heard(absl::Time now, ConnectionId id) {
  if (Connection* c = Find(id)) c->last_heard = now;
}

void CoordinatorCore::PartialFrame(absl::Time now, ConnectionId id) {
  Connection* c = Find(id);
  if (c != nullptr && c->frame_deadline == absl::InfiniteFuture()) {
    c->frame_deadline = now + options_.frame_timeout;
  }
}

void CoordinatorCore::Received(absl::Time now, ConnectionId id,
                               absl::StatusOr<control::Frame> frame) {
  Connection* c = Find(id);
  if (c == nullptr) return;
  c->frame_deadline = absl::InfiniteFuture();
  if (!frame.ok()) {  // Forged, replayed or reordered (sealed), or malformed.
    Refuse(*c,
           absl::IsUnauthenticated(frame.status()) ? RefusalReason::kAuthenticationFailed
                                                   : RefusalReason::kMalformedFrame,
           frame.status(), now);
  } else {
    OnFrame(*c, *frame, now);
  }
  Reap();
}

void CoordinatorCore::ReadFailed(absl::Time now, ConnectionId id, const absl::Status& error) {
  Connection* c = Find(id);
  if (c == nullptr) return;
  if (absl::IsResourceExhausted(error)) {
    Refuse(*c, RefusalReason::kOversizedFrame, error, now);
  } else if (absl::IsDataLoss(error)) {
    Refuse(*c, RefusalReason::kTruncatedFrame, error, now);
  } else {
    Drop(*c, absl::IsUnavailable(error) ? "disconnected" : error.message());
  }
  Reap();
}

void CoordinatorCore::Closed(ConnectionId id, absl::string_view why) {
  Connection* c = Find(id);
  if (c == nullptr) return;
  Drop(*c, why);
  Reap();
}

void CoordinatorCore::OnFrame(Connection& c, control::Frame& frame, absl::Time now) {
  const control::Frame::KindCase kind = frame.kind_case();
  if (c.phase != Phase::kHandshake && kind == control::Frame::kHeartbeat) {
    return NoteProgress(c, *frame.mutable_heartbeat());  // Liveness: Heard. Any later state.
  }
  if (c.phase == Phase::kHandshake && kind == control::Frame::kHello) {
    HandleHello(c, frame.hello(), now);
  } else if (c.phase == Phase::kHandshake && kind == control::Frame::kStatusRequest) {
    HandleStatusRequest(c, frame.status_request(), now);
  } else if (c.phase == Phase::kWelcomed && kind == control::Frame::kJoin) {
    if (rendezvous_done_) {
      AdmitReplacement(c, *frame.mutable_join(), now);
    } else {
      HandleJoin(c, *frame.mutable_join(), now);
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

absl::Time CoordinatorCore::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  if (!rendezvous_done_ && !rendezvous_failed_) {
    next = std::min(rendezvous_deadline_, NextProgress());
  }
  if (!expiries_.empty()) next = std::min(next, std::get<0>(*expiries_.begin()));
  for (const auto& [id, c] : connections_) {
    if (c.phase == Phase::kHandshake) {
      next = std::min(next, c.handshake_deadline);
    } else {
      next = std::min(next, c.frame_deadline);
      if (c.heartbeats) {
        next = std::min({next, c.next_heartbeat, c.last_heard + options_.silence_limit});
      }
    }
  }
  return next;
}

void CoordinatorCore::Tick(absl::Time now) {
  for (auto& [id, c] : connections_) {
    if (!c.open) continue;
    if (c.phase == Phase::kHandshake && now >= c.handshake_deadline) {
      Refuse(c, RefusalReason::kHandshakeTimeout,
             absl::DeadlineExceededError(absl::StrCat("control: handshake not completed within ",
                                                      Millis(options_.handshake_timeout))),
             now);
    } else if (c.phase != Phase::kHandshake && now >= c.frame_deadline) {
      Refuse(c, RefusalReason::kFrameTimeout,
             absl::DeadlineExceededError(absl::StrCat("control: a frame was not completed within ",
                                                      Millis(options_.frame_timeout))),
             now);
    } else if (c.heartbeats) {
      KeepAlive(c, now);
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
  Reap();
}

void CoordinatorCore::Stalled(absl::Duration late) {
  // The peers' bytes of that time, if any, are heard before any silence is judged; a check that
  // was itself due by the deadline still fails the peer (now - last_heard stays at least
  // silence_limit).
  for (auto& [id, c] : connections_) {
    if (c.heartbeats && c.last_heard != absl::InfiniteFuture()) c.last_heard += late;
  }
}

void CoordinatorCore::KeepAlive(Connection& c, absl::Time now) {
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
    CloseAfterWrites(c, now, std::nullopt,
                     absl::StrFormat("silent for %.1f s (no frame, not even a heartbeat)%s",
                                     absl::ToDoubleSeconds(silent), LastProgressNote(c.process)));
    return;
  }
  if (now >= c.next_heartbeat) {
    control::Frame frame;
    frame.mutable_heartbeat();
    auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
    if (encoded.ok()) {  // An empty frame: the cap cannot refuse it.
      CoordinatorAction action;
      action.kind = CoordinatorAction::Kind::kHeartbeat;
      action.connection = c.id;
      action.frame = *std::move(encoded);
      actions_.push_back(std::move(action));
    }
    c.next_heartbeat = now + options_.heartbeat_interval;
  }
}

void CoordinatorCore::Send(Connection& c, const control::Frame& frame) {
  auto encoded = PrepareFrame(frame, options_.max_frame_bytes);
  if (!encoded.ok()) {
    // Only a result can be this large, and results are checked first; fail the connection loudly.
    Drop(c, encoded.status().message());
    return;
  }
  Enqueue(c, *std::move(encoded));
}

void CoordinatorCore::Enqueue(const Connection& c, std::shared_ptr<const OutgoingFrame> frame) {
  CoordinatorAction action;
  action.kind = CoordinatorAction::Kind::kSend;
  action.connection = c.id;
  action.frame = std::move(frame);
  actions_.push_back(std::move(action));
}

void CoordinatorCore::SendReject(Connection& c, const absl::Status& status) {
  control::Frame frame;
  frame.mutable_reject()->set_code(static_cast<int32_t>(status.code()));
  frame.mutable_reject()->set_reason(TruncateText(status.message(), kMaxReasonBytes));
  Send(c, frame);
}

void CoordinatorCore::Refuse(Connection& c, RefusalReason reason, const absl::Status& status,
                             absl::Time now) {
  Count(reason);
  WSYNC_LOG(kControl, kWarn, "coordinator: refused ", c.process >= 0 ? Describe(c.process) : c.peer,
            ": ", status.ToString());
  NoteRefusal(c, status, now);
  SendReject(c, status);
  CloseAfterWrites(c, now, reason, absl::StrCat("refused: ", status.message()));
}

void CoordinatorCore::CloseAfterWrites(Connection& c, absl::Time now,
                                       std::optional<RefusalReason> refusal,
                                       absl::string_view why) {
  CoordinatorAction action;
  action.kind = CoordinatorAction::Kind::kClose;
  action.deadline = now + options_.close_timeout;
  action.refusal = refusal;
  End(c, std::move(action), why);
}

void CoordinatorCore::Drop(Connection& c, absl::string_view why) {
  CoordinatorAction action;
  action.kind = CoordinatorAction::Kind::kDrop;
  End(c, std::move(action), why);
}

void CoordinatorCore::End(Connection& c, CoordinatorAction action, absl::string_view why) {
  if (!c.open) return;
  action.connection = c.id;
  action.why = std::string(why);
  actions_.push_back(std::move(action));
  c.open = false;
  reap_ = true;
  Unpend(c);
  Detach(c, why);
}

void CoordinatorCore::Unpend(Connection& c) {
  if (!c.pending) return;
  c.pending = false;
  pending_.erase(c.id);
  if (--pending_per_source_[c.source] <= 0) pending_per_source_.erase(c.source);
}

void CoordinatorCore::Detach(Connection& c, absl::string_view why) {
  if (c.process < 0) return;
  const int32_t id = c.process;
  Process& p = processes_[id];
  c.process = -1;
  p.connection = nullptr;
  if (rendezvous_done_) {
    p.lost = true;
    p.lost_reason = std::string(why);
    // With no collective open it is likely a process that finished (finalize); with one open, it
    // fails that collective for everyone.
    if (rounds_.empty()) {
      WSYNC_LOG(kControl, kInfo, "coordinator: ", Describe(id), " left: ", why);
    } else {
      WSYNC_LOG(kFault, kError, "coordinator: ", Describe(id), " lost: ", why, " (",
                log::Count(std::ssize(rounds_), "collective"), " open)");
    }
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

void CoordinatorCore::NoticeLoss(int32_t id) {
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
    if (q == id || c == nullptr || !c->open || c->phase != Phase::kJoined) continue;
    Enqueue(*c, shared);
  }
}

void CoordinatorCore::Shutdown() {
  for (auto& [id, c] : connections_) {
    if (c.open) SendReject(c, absl::UnavailableError("control: the coordinator stopped"));
  }
  connections_.clear();
  pending_.clear();
  pending_per_source_.clear();
  for (Process& p : processes_) p.connection = nullptr;
}

}  // namespace wsync
