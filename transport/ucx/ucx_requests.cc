// UcxTransportImpl (ucx_impl.h): waiting, completion, cancelling, abort and progress.

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "transport/ucx/ucx_impl.h"
#include "transport/ucx/ucx_stale.h"

namespace wsync::ucx_internal {

absl::StatusOr<bool> UcxTransportImpl::Test(RequestId request) {
  absl::MutexLock lock(&drive_mu_);
  if (abort_requested_.load(std::memory_order_acquire)) AbortNow();
  Progress();
  auto it = slots_.find(request);
  if (it == slots_.end()) return UnknownRequest(request);
  if (!it->second->done) return false;
  absl::Status status = std::move(it->second->status);
  slots_.erase(it);
  if (!status.ok()) return status;
  return true;
}

void UcxTransportImpl::ProgressInFlight() {
  absl::MutexLock lock(&drive_mu_);
  if (abort_requested_.load(std::memory_order_acquire)) AbortNow();
  Progress();
}

absl::Status UcxTransportImpl::WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) {
  absl::MutexLock lock(&drive_mu_);
  std::vector<Slot*> waited;
  absl::flat_hash_set<RequestId> seen;
  absl::Status unknown;
  for (RequestId id : requests) {
    if (!seen.insert(id).second) continue;
    auto it = slots_.find(id);
    if (it == slots_.end()) {
      if (unknown.ok()) unknown = UnknownRequest(id);
    } else {
      waited.push_back(it->second.get());
    }
  }
  if (!unknown.ok()) {
    CancelAndDrain(waited, absl::CancelledError("ucx: cancelled by a WaitAll with an unknown id"),
                   /*close_all=*/false);
    for (Slot* s : waited) slots_.erase(s->id);
    return unknown;
  }

  absl::Status failure;  // The first request that failed while waiting.
  bool timed_out = false;
  absl::Time active = absl::Now();  // When progress last did something.
  for (;;) {
    if (abort_requested_.load(std::memory_order_acquire)) AbortNow();
    if (Progress() > 0) active = absl::Now();
    bool all_done = true;
    for (Slot* s : waited) {
      if (!s->done) {
        all_done = false;
      } else if (!s->status.ok() && failure.ok()) {
        failure = s->status;
      }
    }
    if (all_done || !failure.ok()) break;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    if (now - active >= options_.idle_spin) Sleep(deadline, options_.max_sleep);
  }

  std::vector<std::string> missed;
  if (!failure.ok()) {
    const absl::Status collateral = absl::CancelledError(
        absl::StrCat("ucx: cancelled after another request failed: ", failure.message()));
    CancelAndDrain(waited, collateral, /*close_all=*/false);
  } else if (timed_out) {
    std::vector<Slot*> pending;
    for (Slot* s : waited) {
      if (!s->done) pending.push_back(s);
    }
    CancelAndDrain(pending,
                   absl::DeadlineExceededError(absl::StrCat("ucx: process ", options_.process,
                                                            ": request missed its deadline")),
                   /*close_all=*/false);
    for (Slot* s : pending) {
      if (s->status.code() == absl::StatusCode::kDeadlineExceeded) {
        missed.push_back(Describe(*s));
      } else if (!s->status.ok() && failure.ok()) {
        failure = s->status;
      }
    }
  }
  for (Slot* s : waited) slots_.erase(s->id);
  if (!failure.ok()) return failure;
  if (!missed.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("ucx: process ", options_.process, ": ", missed.size(),
                     " requests missed the deadline: ", absl::StrJoin(missed, "; ")));
  }
  return absl::OkStatus();
}

absl::Status UcxTransportImpl::WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                                       std::vector<size_t>* finished) {
  absl::MutexLock lock(&drive_mu_);
  absl::Time active = absl::Now();  // When progress last did something.
  for (;;) {
    if (abort_requested_.load(std::memory_order_acquire)) AbortNow();
    if (Progress() > 0) active = absl::Now();
    absl::Status failure;
    bool any = false;
    for (size_t i = 0; i < requests.size() && failure.ok(); ++i) {
      auto it = slots_.find(requests[i]);
      if (it == slots_.end()) {
        failure = UnknownRequest(requests[i]);
      } else if (it->second->done) {
        failure = std::move(it->second->status);
        slots_.erase(it);
      } else {
        continue;
      }
      finished->push_back(i);
      any = true;
    }
    if (any || requests.empty()) return failure;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("ucx: process ", options_.process,
                                                      ": none of ", requests.size(),
                                                      " requests finished by the deadline"));
    }
    if (now - active >= options_.idle_spin) Sleep(deadline, options_.max_sleep);
  }
}

int64_t UcxTransportImpl::DiscardStaleMessages(uint64_t sync_id) {
  absl::MutexLock lock(&drive_mu_);
  if (abort_requested_.load(std::memory_order_acquire)) return 0;
  Progress();
  auto progress = [this] {
    drive_mu_.AssertHeld();
    return Progress();
  };
  auto stop = [this] { return abort_requested_.load(std::memory_order_acquire); };
  const DrainBounds bounds{.deadline = absl::Now() + kStaleDrainTime,
                           .max_messages = kMaxStaleDrained,
                           .progress = progress,
                           .stop = stop};
  return ucx_internal::DiscardStaleMessages(worker_, sync_id, absl::MakeSpan(discard_scratch_),
                                            bounds);
}

void UcxTransportImpl::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (!abort_requested_.load(std::memory_order_relaxed)) {
      std::string why(reason.message());
      if (why.empty()) why = reason.ok() ? "aborted" : absl::StatusCodeToString(reason.code());
      abort_status_ =
          absl::AbortedError(absl::StrCat("ucx: process ", options_.process, " aborted: ", why));
      abort_requested_.store(true, std::memory_order_release);
    }
  }
  if (worker_ != nullptr) ucp_worker_signal(worker_);  // Wakes a WaitAll sleeping in poll().
  absl::MutexLock lock(&drive_mu_);
  AbortNow();
}

void UcxTransportImpl::PeerLost(int32_t peer, const absl::Status& reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    lost_peers_.push_back(LostPeer{peer, std::string(reason.message()), IsCoordinatorLoss(reason)});
    lost_requested_.store(true, std::memory_order_release);
  }
  if (worker_ != nullptr) ucp_worker_signal(worker_);  // Wakes a WaitAll sleeping in poll().
}

void UcxTransportImpl::TakeLostPeers() {
  if (!lost_requested_.load(std::memory_order_acquire)) return;
  std::vector<LostPeer> lost;
  {
    absl::MutexLock lock(&abort_mu_);
    lost.swap(lost_peers_);
    lost_requested_.store(false, std::memory_order_release);
  }
  for (const LostPeer& report : lost) {
    const int32_t process = report.process;
    if (process < 0 || static_cast<size_t>(process) >= peers_.size()) continue;
    Peer& peer = *peers_[process];
    if (!peer.failure.ok()) continue;
    peer.failure = absl::UnavailableError(
        report.coordinator_loss ? absl::StrCat("ucx: messages with process ", process,
                                               " stopped because ", report.reason)
                                : absl::StrCat("ucx: peer process ", process, " is gone (",
                                               report.reason, "); ConnectPeers connects it again"));
    peer.failure_pending = true;
    failures_pending_ = true;
  }
}

void UcxTransportImpl::OnSendDone(void* /*request*/, ucs_status_t status, void* user_data) {
  Slot* s = static_cast<Slot*>(user_data);
  s->owner->Complete(*s, status, nullptr);
}

void UcxTransportImpl::OnReceiveDone(void* /*request*/, ucs_status_t status,
                                     const ucp_tag_recv_info_t* info, void* user_data) {
  Slot* s = static_cast<Slot*>(user_data);
  s->owner->Complete(*s, status, info);
}

void UcxTransportImpl::OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  Peer* peer = static_cast<Peer*>(arg);
  if (peer->ep != ep || !peer->failure.ok()) return;
  peer->failure = absl::UnavailableError(absl::StrCat("ucx: peer process ", peer->process,
                                                      " failed (", ucs_status_string(status),
                                                      "); ConnectPeers connects it again"));
  peer->failure_pending = true;
  peer->owner->failures_pending_ = true;
}

absl::Status UcxTransportImpl::CheckAbort() {
  if (!abort_requested_.load(std::memory_order_acquire)) return absl::OkStatus();
  AbortNow();
  absl::MutexLock lock(&abort_mu_);
  return abort_status_;
}

void UcxTransportImpl::AbortNow() {
  if (abort_done_ || !abort_requested_.load(std::memory_order_acquire)) return;
  abort_done_ = true;
  absl::Status reason;
  {
    absl::MutexLock lock(&abort_mu_);
    reason = abort_status_;
  }
  CancelAndDrain(PendingSlots(), reason, /*close_all=*/true);
}

std::vector<Slot*> UcxTransportImpl::PendingSlots() {
  std::vector<Slot*> pending;
  for (auto& [id, slot] : slots_) {
    if (!slot->done) pending.push_back(slot.get());
  }
  return pending;
}

void UcxTransportImpl::Complete(Slot& s, ucs_status_t status, const ucp_tag_recv_info_t* info) {
  if (s.done) return;
  s.done = true;
  if (s.request != nullptr) {
    ucp_request_free(s.request);
    s.request = nullptr;
  }
  if (s.registration != 0) {
    auto it = registrations_.find(s.registration);
    if (it != registrations_.end()) --it->second.users;
  }
  const std::string head = absl::StrCat("ucx: process ", options_.process, ": ", Describe(s));
  if (status == UCS_OK) {
    if (s.kind == Kind::kReceive && info != nullptr &&
        static_cast<int64_t>(info->length) != s.bytes) {
      s.status = absl::InvalidArgumentError(
          absl::StrCat(head, ": size mismatch: the message has ", info->length,
                       " bytes, the receive expects ", s.bytes, " bytes"));
    } else {
      s.status = absl::OkStatus();
    }
  } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    const bool known = info != nullptr && static_cast<int64_t>(info->length) > s.bytes;
    s.status = absl::InvalidArgumentError(
        absl::StrCat(head, ": size mismatch: the message has ",
                     known ? absl::StrCat(info->length) : absl::StrCat("more than ", s.bytes),
                     " bytes, the receive expects ", s.bytes, " bytes"));
  } else if (!s.cancel_reason.ok()) {
    s.status = absl::Status(s.cancel_reason.code(),
                            absl::StrCat(s.cancel_reason.message(), " [", Describe(s), "]"));
  } else {
    s.status = FromUcs(status, head);
  }
}

void UcxTransportImpl::Abandon(Slot& s, const absl::Status& reason, absl::string_view why) {
  if (s.done) return;
  ucp_request_free(s.request);
  s.request = nullptr;
  s.done = true;
  s.status = absl::Status(reason.code(), absl::StrCat(reason.message(), " [", Describe(s), "; ",
                                                      why, "; its memory may still be read]"));
}

void UcxTransportImpl::CancelAndDrain(const std::vector<Slot*>& slots, const absl::Status& reason,
                                      bool close_all) {
  absl::flat_hash_set<int32_t> close;
  for (Slot* s : slots) {
    if (s->done) continue;
    if (s->cancel_reason.ok()) s->cancel_reason = reason;
    if (s->kind == Kind::kReceive) {
      ucp_request_cancel(worker_, s->request);
    } else {
      close.insert(s->peer);
    }
  }
  for (auto& peer : peers_) {
    if (close_all || close.contains(peer->process)) {
      CloseEndpoint(*peer, absl::CancelledError(
                               absl::StrCat("ucx: the endpoint to process ", peer->process,
                                            " was closed to cancel a send: ", reason.message())));
    }
  }
  const absl::Time until = absl::Now() + options_.drain_timeout;
  for (;;) {
    const bool all_done =
        std::all_of(slots.begin(), slots.end(), [](const Slot* s) { return s->done; });
    if (all_done) break;
    if (absl::Now() >= until) {
      const std::string why = absl::StrCat("UCX did not finish it within ",
                                           absl::FormatDuration(options_.drain_timeout));
      for (Slot* s : slots) Abandon(*s, reason, why);
      break;
    }
    if (Progress() == 0) Sleep(until, absl::Microseconds(100));
  }
}

void UcxTransportImpl::CloseEndpoint(Peer& peer, const absl::Status& reason) {
  if (peer.ep == nullptr) return;
  for (auto& [id, slot] : slots_) {
    if (!slot->done && slot->kind == Kind::kSend && slot->peer == peer.process &&
        slot->cancel_reason.ok()) {
      slot->cancel_reason = reason;
    }
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucp_ep_h ep = peer.ep;
  peer.ep = nullptr;  // Before the call: callbacks inside it see the endpoint as gone.
  void* r = ucp_ep_close_nbx(ep, &param);
  if (r != nullptr && UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  if (peer.peer_mode) return;
  // UCX 1.13 completes the sends of a force-closed endpoint only in UCP_ERR_HANDLING_MODE_PEER;
  // the others would never finish, so they are released now.
  for (auto& [id, slot] : slots_) {
    if (!slot->done && slot->kind == Kind::kSend && slot->peer == peer.process) {
      Abandon(*slot, slot->cancel_reason,
              "its endpoint has no error handling, so UCX cannot cancel it");
    }
  }
}

void UcxTransportImpl::HandleFailures() {
  if (!failures_pending_) return;
  failures_pending_ = false;
  for (auto& peer : peers_) {
    if (!peer->failure_pending) continue;
    peer->failure_pending = false;
    CloseEndpoint(*peer, peer->failure);
    std::vector<Slot*> receives;
    for (auto& [id, slot] : slots_) {
      if (!slot->done && slot->kind == Kind::kReceive && slot->peer == peer->process) {
        if (slot->cancel_reason.ok()) slot->cancel_reason = peer->failure;
        receives.push_back(slot.get());
      }
    }
    for (Slot* s : receives) ucp_request_cancel(worker_, s->request);
  }
}

void UcxTransportImpl::FailExitedPeers() {
  constexpr absl::Duration kExitedPeerCheckPeriod = absl::Milliseconds(250);
  const absl::Time now = absl::Now();
  if (now - exited_peers_checked_ < kExitedPeerCheckPeriod) return;
  exited_peers_checked_ = now;
  if (pid_namespace_ == 0) return;
  for (auto& peer : peers_) {
    if (peer->ep == nullptr || !peer->failure.ok() || peer->process == options_.process ||
        peer->pid <= 0 || peer->pid_namespace != pid_namespace_) {
      continue;
    }
    if (!ProcessHasExited(peer->pid)) continue;
    peer->failure = absl::UnavailableError(
        absl::StrCat("ucx: peer process ", peer->process, " (pid ", peer->pid,
                     ") has exited; ConnectPeers connects it again"));
    peer->failure_pending = true;
    failures_pending_ = true;
  }
}

unsigned UcxTransportImpl::Progress() {
  // Before UCX runs anything queued for them (a resumed process may find its peers gone).
  TakeLostPeers();
  FailExitedPeers();
  HandleFailures();
  unsigned total = 0;
  for (int i = 0; i < kProgressBurst; ++i) {
    const unsigned n = ucp_worker_progress(worker_);
    total += n;
    if (n == 0) break;
  }
  TakeLostPeers();
  HandleFailures();
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i]);
      closing_[i] = closing_.back();
      closing_.pop_back();
    } else {
      ++i;
    }
  }
  return total;
}

void UcxTransportImpl::Sleep(absl::Time until, absl::Duration cap) {
  if (cap <= absl::ZeroDuration()) cap = options_.max_sleep;
  const absl::Duration left = std::min(until - absl::Now(), cap);
  if (left <= absl::ZeroDuration()) return;
  if (efd_ < 0) {
    absl::SleepFor(std::min(left, absl::Microseconds(50)));
    return;
  }
  const ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return;  // Events are pending: progress again.
  if (st != UCS_OK) {
    absl::SleepFor(std::min(left, absl::Microseconds(50)));
    return;
  }
  if (abort_requested_.load(std::memory_order_acquire) ||
      lost_requested_.load(std::memory_order_acquire)) {
    return;
  }
  pollfd pfd{efd_, POLLIN, 0};
  const int ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(left + absl::Microseconds(999))));
  poll(&pfd, 1, ms);
}

}  // namespace wsync::ucx_internal
