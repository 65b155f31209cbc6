#include "transport/loopback/loopback_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace wsync {
namespace loopback_internal {

std::string TagText(MessageTag tag) { return absl::StrCat("0x", absl::Hex(tag.value)); }

std::string AddressText(const void* p) {
  return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(p)));
}

std::string Describe(const Request& r) {
  return absl::StrCat(r.kind == RequestKind::kSend ? "send to" : "receive from", " process ",
                      r.peer, " (tag ", TagText(r.tag), ", ", r.bytes, " bytes)");
}

// Why process `p` is down ("was killed", "aborted: <reason>"), or empty while it is up.
std::string DownText(FabricState& s, int32_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  const ProcessState& ps = s.process(p);
  if (ps.killed) return "was killed";
  if (!ps.aborted) return "";
  const absl::Status& reason = ps.abort_reason;
  if (!reason.message().empty()) return absl::StrCat("aborted: ", reason.message());
  if (!reason.ok()) return absl::StrCat("aborted: ", absl::StatusCodeToString(reason.code()));
  return "aborted";
}

// The error of a request involving process `p` while `p` is killed (Unavailable) or aborted
// (Aborted), or OK. `as_peer` words it for the other side of the request.
absl::Status DownError(FabricState& s, int32_t p, bool as_peer)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  const std::string why = DownText(s, p);
  if (why.empty()) return absl::OkStatus();
  const std::string text =
      absl::StrCat("loopback: ", as_peer ? "peer " : "", "process ", p, " ", why);
  return s.process(p).killed ? absl::UnavailableError(text) : absl::AbortedError(text);
}

RequestQueue& QueueOf(FabricState& s, const Request& r, MatchKey* key)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (r.kind == RequestKind::kSend) {
    *key = MatchKey{r.owner, r.peer, r.tag.value};
    return s.queued_sends[*key];
  }
  *key = MatchKey{r.peer, r.owner, r.tag.value};
  return s.queued_receives[*key];
}

void RemoveFromQueue(FabricState& s, const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  MatchKey key;
  RequestQueue& queue = QueueOf(s, r, &key);
  auto it = std::find_if(queue.begin(), queue.end(),
                         [&](const std::shared_ptr<Request>& q) { return q.get() == &r; });
  if (it != queue.end()) queue.erase(it);
  if (queue.empty()) {
    if (r.kind == RequestKind::kSend) {
      s.queued_sends.erase(key);
    } else {
      s.queued_receives.erase(key);
    }
  }
}

// Fails `r` with `error` unless it is final. A request being copied keeps its state and fails
// when the copy ends. Signals the owner.
void FailRequest(FabricState& s, Request& r, absl::Status error, bool cancelled)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  switch (r.state) {
    case RequestState::kQueued:
      RemoveFromQueue(s, r);
      [[fallthrough]];
    case RequestState::kDropped:
      r.state = RequestState::kFailed;
      r.status = std::move(error);
      r.cancelled = cancelled;
      break;
    case RequestState::kCopying:
      if (r.status.ok()) r.status = std::move(error);
      break;
    case RequestState::kDone:
    case RequestState::kFailed:
      return;
  }
  s.process(r.owner).cv.SignalAll();
}

// Fails every request of process `p` with its own error and every request of another process
// whose peer is `p` with the peer error; wakes every waiter. For Abort and Kill.
void FailInvolving(FabricState& s, int32_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  const absl::Status own = DownError(s, p, /*as_peer=*/false);
  const absl::Status peer = DownError(s, p, /*as_peer=*/true);
  for (int32_t q = 0; q < s.size; ++q) {
    for (auto& [id, request] : s.process(q).requests) {
      if (q == p) {
        FailRequest(s, *request, own, /*cancelled=*/false);
      } else if (request->peer == p) {
        FailRequest(s, *request, peer, /*cancelled=*/false);
      }
    }
    s.process(q).cv.SignalAll();
  }
  s.group_cv.SignalAll();
}

// Ends the copy of a matched pair: each request completes, or fails with the error it received
// while being copied. The bytes were delivered either way and are counted.
void FinishCopy(FabricState& s, Request& send, Request& receive)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  for (Request* r : {&send, &receive}) {
    r->state = r->status.ok() ? RequestState::kDone : RequestState::kFailed;
    s.process(r->owner).cv.SignalAll();
  }
  s.delivered_bytes[static_cast<size_t>(send.owner) * s.size + receive.owner] += send.bytes;
  ++s.delivered_messages;
  s.largest_message_bytes = std::max(s.largest_message_bytes, send.bytes);
}

// Cancels the in-flight requests among `requests` (which `ps` owns), waits for those being copied,
// and releases them all. Returns the descriptions of the requests it cancelled.
std::vector<std::string> CancelAndRelease(FabricState& s, ProcessState& ps,
                                          absl::Span<const std::shared_ptr<Request>> requests)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  std::vector<std::string> cancelled;
  for (const auto& r : requests) {
    if (r->state == RequestState::kQueued || r->state == RequestState::kDropped) {
      cancelled.push_back(Describe(*r));
      FailRequest(s, *r, absl::CancelledError("loopback: request cancelled"), /*cancelled=*/true);
    }
  }
  // A copy runs in another thread without the lock and never blocks, so this wait is short.
  auto copying = [&] {
    return std::any_of(requests.begin(), requests.end(),
                       [](const auto& r) { return r->state == RequestState::kCopying; });
  };
  while (copying()) ps.cv.Wait(&s.mu);
  for (const auto& r : requests) ps.requests.erase(r->id);
  return cancelled;
}

}  // namespace loopback_internal
}  // namespace wsync
