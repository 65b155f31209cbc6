#include "transport/loopback/loopback.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "transport/loopback/loopback_state.h"

namespace wsync {
namespace loopback_internal {
namespace {

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<FabricState> state, int32_t process)
      : state_(std::move(state)), process_(process) {}

  // Cancels every outstanding request, waits for copies in progress into or out of this
  // process's memory, and frees the process for a new Connect.
  ~LoopbackTransport() override {
    FabricState& s = *state_;
    absl::MutexLock lock(&s.mu);
    ProcessState& ps = s.process(process_);
    std::vector<std::shared_ptr<Request>> all;
    for (const auto& [id, request] : ps.requests) all.push_back(request);
    CancelAndRelease(s, ps, all);
    ps.requests.clear();
    ps.transport_alive = false;
  }

  int32_t process() const override { return process_; }
  std::string name() const override { return "loopback"; }

  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override {
    if (kind == MemoryKind::kCuda) {
      return absl::UnimplementedError("loopback: only host memory can be registered, not cuda");
    }
    if (kind != MemoryKind::kHost) {
      return absl::InvalidArgumentError(
          absl::StrCat("loopback: invalid memory kind ", static_cast<int>(kind)));
    }
    if (bytes < 0 || (address == nullptr && bytes > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loopback: cannot register ", bytes, " bytes at ", AddressText(address)));
    }
    const RegistrationId id = next_registration_++;
    registrations_[id] = Registration{address, bytes};
    return id;
  }

  absl::Status DeregisterMemory(RegistrationId id) override {
    if (registrations_.erase(id) == 0) {
      return absl::NotFoundError(
          absl::StrCat("loopback: process ", process_, " has no registration with id ", id));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override {
    return Post(RequestKind::kSend, peer, tag, const_cast<void*>(data), bytes);
  }

  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override {
    return Post(RequestKind::kReceive, peer, tag, data, bytes);
  }

  absl::StatusOr<bool> Test(RequestId request) override {
    FabricState& s = *state_;
    absl::MutexLock lock(&s.mu);
    ProcessState& ps = s.process(process_);
    auto it = ps.requests.find(request);
    if (it == ps.requests.end()) return UnknownRequest(request);
    const Request& r = *it->second;
    if (r.state == RequestState::kDone) {
      ps.requests.erase(it);
      return true;
    }
    if (r.state == RequestState::kFailed) {
      absl::Status error = r.status;
      ps.requests.erase(it);
      return error;
    }
    return false;
  }

  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override {
    FabricState& s = *state_;
    absl::MutexLock lock(&s.mu);
    ProcessState& ps = s.process(process_);
    std::vector<std::shared_ptr<Request>> waited;
    absl::flat_hash_set<RequestId> seen;
    absl::Status unknown;
    for (RequestId id : requests) {
      if (!seen.insert(id).second) continue;
      auto it = ps.requests.find(id);
      if (it == ps.requests.end()) {
        if (unknown.ok()) unknown = UnknownRequest(id);
      } else {
        waited.push_back(it->second);
      }
    }
    if (!unknown.ok()) {
      CancelAndRelease(s, ps, waited);
      return unknown;
    }
    // Wait until every request is final, one failed, or the deadline passed.
    for (;;) {
      bool all_final = true;
      bool any_failed = false;
      for (const auto& r : waited) {
        any_failed |= r->state == RequestState::kFailed;
        all_final &= r->state == RequestState::kDone || r->state == RequestState::kFailed;
      }
      if (all_final || any_failed || absl::Now() >= deadline) break;
      ps.cv.WaitWithDeadline(&s.mu, deadline);
    }
    const std::vector<std::string> cancelled = CancelAndRelease(s, ps, waited);
    for (const auto& r : waited) {
      if (r->state == RequestState::kFailed && !r->cancelled) return r->status;
    }
    if (cancelled.empty()) return absl::OkStatus();
    constexpr size_t kListed = 16;
    std::string list = absl::StrJoin(cancelled.begin(),
                                     cancelled.begin() + std::min(cancelled.size(), kListed), "; ");
    if (cancelled.size() > kListed)
      absl::StrAppend(&list, "; and ", cancelled.size() - kListed, " more");
    return absl::DeadlineExceededError(
        absl::StrCat("loopback: process ", process_, " cancelled ", cancelled.size(), " of ",
                     waited.size(), " requests still pending at the deadline: ", list));
  }

  void Abort(const absl::Status& reason) override {
    FabricState& s = *state_;
    absl::MutexLock lock(&s.mu);
    ProcessState& ps = s.process(process_);
    if (ps.aborted) return;
    ps.aborted = true;
    ps.abort_reason = reason;
    FailInvolving(s, process_);
  }

  // A queued send of a stale sync addressed to this process is consumed without a copy: the send
  // completes (as a real network's would once the message left), nothing is written.
  int64_t DiscardStaleMessages(uint64_t sync_id) override {
    FabricState& s = *state_;
    absl::MutexLock lock(&s.mu);
    std::vector<MatchKey> stale;
    for (const auto& [key, queue] : s.queued_sends) {
      if (key.receiver == process_ && IsStaleTag(MessageTag{key.tag}, sync_id)) {
        stale.push_back(key);
      }
    }
    int64_t rejected = 0;
    for (const MatchKey& key : stale) {
      auto it = s.queued_sends.find(key);
      for (const std::shared_ptr<Request>& send : it->second) {
        send->state = RequestState::kDone;
        s.process(send->owner).cv.SignalAll();
        ++rejected;
      }
      s.queued_sends.erase(it);
    }
    return rejected;
  }

 private:
  struct Registration {
    void* address = nullptr;
    int64_t bytes = 0;
  };

  absl::Status UnknownRequest(RequestId id) const {
    return absl::NotFoundError(
        absl::StrCat("loopback: process ", process_, " has no outstanding request with id ", id));
  }

  absl::StatusOr<RequestId> Post(RequestKind kind, int32_t peer, MessageTag tag, void* data,
                                 int64_t bytes) {
    FabricState& s = *state_;
    if (!s.InRange(peer)) {
      return absl::InvalidArgumentError(absl::StrCat("loopback: process ", process_,
                                                     " cannot reach peer ", peer,
                                                     ": ids are in [0, ", s.size, ")"));
    }
    if (bytes < 0 || (data == nullptr && bytes > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loopback: bad buffer of ", bytes, " bytes at ", AddressText(data), " for peer ", peer));
    }
    std::shared_ptr<Request> send;
    std::shared_ptr<Request> receive;
    RequestId id = 0;
    {
      absl::MutexLock lock(&s.mu);
      WSYNC_RETURN_IF_ERROR(DownError(s, process_, /*as_peer=*/false));
      WSYNC_RETURN_IF_ERROR(DownError(s, peer, /*as_peer=*/true));
      ProcessState& ps = s.process(process_);
      auto request = std::make_shared<Request>();
      request->id = id = ps.next_request++;
      request->owner = process_;
      request->kind = kind;
      request->peer = peer;
      request->tag = tag;
      request->data = data;
      request->bytes = bytes;
      ps.requests[id] = request;
      if (kind == RequestKind::kSend) {
        if (ps.fail_send_countdown > 0 && --ps.fail_send_countdown == 0) {
          request->state = RequestState::kFailed;
          request->status = std::move(ps.fail_send_error);
          ps.fail_send_error = absl::OkStatus();
          return id;
        }
        if (ps.drop_to[peer]) {
          request->state = RequestState::kDropped;
          ++s.dropped_messages;
          return id;
        }
      }
      const MatchKey key = kind == RequestKind::kSend ? MatchKey{process_, peer, tag.value}
                                                      : MatchKey{peer, process_, tag.value};
      auto& opposite = kind == RequestKind::kSend ? s.queued_receives : s.queued_sends;
      auto it = opposite.find(key);
      if (it == opposite.end() && kind == RequestKind::kSend && s.eager_bytes > 0 &&
          bytes <= s.eager_bytes) {
        // Eager: the message leaves with a copy of its bytes and the send completes.
        auto message = std::make_shared<Request>(*request);
        message->id = 0;
        message->eager_bytes.assign(static_cast<const unsigned char*>(data),
                                    static_cast<const unsigned char*>(data) + bytes);
        message->data = message->eager_bytes.data();
        s.queued_sends[key].push_back(std::move(message));
        request->state = RequestState::kDone;
        return id;
      }
      if (it == opposite.end()) {
        request->state = RequestState::kQueued;
        (kind == RequestKind::kSend ? s.queued_sends : s.queued_receives)[key].push_back(request);
        return id;
      }
      std::shared_ptr<Request> other = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) opposite.erase(it);
      send = kind == RequestKind::kSend ? request : other;
      receive = kind == RequestKind::kSend ? other : request;
      if (send->bytes != receive->bytes) {
        const absl::Status error = absl::InvalidArgumentError(
            absl::StrCat("loopback: size mismatch for tag ", TagText(tag), " from process ",
                         send->owner, " to process ", receive->owner, ": the send has ",
                         send->bytes, " bytes, the receive expects ", receive->bytes, " bytes"));
        for (Request* r : {send.get(), receive.get()}) {
          r->state = RequestState::kFailed;
          r->status = error;
          s.process(r->owner).cv.SignalAll();
        }
        return id;
      }
      send->state = RequestState::kCopying;
      receive->state = RequestState::kCopying;
    }
    // Both requests are kCopying: no other thread touches them or releases their memory until
    // FinishCopy.
    if (bytes > 0) std::memcpy(receive->data, send->data, static_cast<size_t>(bytes));
    absl::MutexLock lock(&s.mu);
    FinishCopy(s, *send, *receive);
    return id;
  }

  const std::shared_ptr<FabricState> state_;
  const int32_t process_;
  // Touched only by the owning thread (transport.h), so not under the fabric's lock.
  RegistrationId next_registration_ = 1;
  absl::flat_hash_map<RegistrationId, Registration> registrations_;
};

class LoopbackGroup : public Group {
 public:
  LoopbackGroup(std::shared_ptr<FabricState> state, int32_t process)
      : state_(std::move(state)), process_(process) {}

  ~LoopbackGroup() override {
    absl::MutexLock lock(&state_->mu);
    state_->process(process_).group_alive = false;
  }

  int32_t process() const override { return process_; }
  int32_t size() const override { return state_->size; }

  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view payload,
                                                     absl::Time deadline) override {
    FabricState& s = *state_;
    absl::MutexLock lock(&s.mu);
    WSYNC_RETURN_IF_ERROR(DownError(s, process_, /*as_peer=*/false));
    ProcessState& ps = s.process(process_);
    const int64_t number = ps.next_collective++;
    std::unique_ptr<Round>& slot = s.rounds[number];
    if (slot == nullptr) {
      slot = std::make_unique<Round>();
      slot->payloads.resize(s.size);
    }
    Round* round = slot.get();  // Stable until the last process finishes the round.
    round->payloads[process_] = std::string(payload);
    ++round->contributed;
    s.group_cv.SignalAll();

    absl::StatusOr<std::vector<std::string>> result;
    for (;;) {
      if (round->contributed == s.size) {
        std::vector<std::string> all;
        all.reserve(s.size);
        for (const auto& p : round->payloads) all.push_back(*p);
        result = std::move(all);
        break;
      }
      if (absl::Status own = DownError(s, process_, false); !own.ok()) {
        result = own;
        break;
      }
      std::vector<int32_t> missing;
      std::vector<std::string> down;
      bool any_killed = false;
      for (int32_t q = 0; q < s.size; ++q) {
        if (round->payloads[q].has_value()) continue;
        missing.push_back(q);
        if (std::string why = DownText(s, q); !why.empty()) {
          any_killed |= s.process(q).killed;
          down.push_back(absl::StrCat("process ", q, " ", why));
        }
      }
      const std::string head =
          absl::StrCat("loopback: AllGather #", number, " of process ", process_, ": ");
      if (!down.empty()) {
        const std::string text =
            absl::StrCat(head, "missing contributions: ", absl::StrJoin(down, "; "));
        result = any_killed ? absl::UnavailableError(text) : absl::AbortedError(text);
        break;
      }
      if (absl::Now() >= deadline) {
        result = absl::DeadlineExceededError(
            absl::StrCat(head, "processes ", absl::StrJoin(missing, ", "),
                         " did not contribute before the deadline"));
        break;
      }
      s.group_cv.WaitWithDeadline(&s.mu, deadline);
    }
    if (++round->finished == s.size) s.rounds.erase(number);
    return result;
  }

 private:
  const std::shared_ptr<FabricState> state_;
  const int32_t process_;
};

}  // namespace
}  // namespace loopback_internal

using loopback_internal::FabricState;
using loopback_internal::ProcessState;

int64_t LoopbackCounters::BytesDelivered(int32_t from, int32_t to) const {
  if (from < 0 || to < 0 || from >= processes || to >= processes) return 0;
  return bytes[static_cast<size_t>(from) * processes + to];
}

int64_t LoopbackCounters::TotalBytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

LoopbackFabric::LoopbackFabric(int32_t processes, int64_t eager_bytes)
    : state_(std::make_shared<FabricState>(std::max<int32_t>(processes, 0), eager_bytes)) {}

LoopbackFabric::~LoopbackFabric() = default;

int32_t LoopbackFabric::size() const { return state_->size; }

namespace {

// Claims the transport or group slot of `process`: InvalidArgument out of range,
// FailedPrecondition when the slot is taken or the process killed.
absl::Status Claim(FabricState& s, int32_t process, bool ProcessState::*alive,
                   absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (!s.InRange(process)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loopback: process ", process, " out of range [0, ", s.size, ")"));
  }
  ProcessState& ps = s.process(process);
  if (ps.killed) {
    return absl::FailedPreconditionError(
        absl::StrCat("loopback: process ", process, " was killed"));
  }
  if (ps.*alive) {
    return absl::FailedPreconditionError(
        absl::StrCat("loopback: process ", process, " already has a live ", what));
  }
  ps.*alive = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> LoopbackFabric::Connect(int32_t process) {
  absl::MutexLock lock(&state_->mu);
  WSYNC_RETURN_IF_ERROR(Claim(*state_, process, &ProcessState::transport_alive, "transport"));
  ProcessState& ps = state_->process(process);
  ps.aborted = false;
  ps.abort_reason = absl::OkStatus();
  return std::unique_ptr<Transport>(new loopback_internal::LoopbackTransport(state_, process));
}

absl::StatusOr<std::unique_ptr<Group>> LoopbackFabric::MakeGroup(int32_t process) {
  absl::MutexLock lock(&state_->mu);
  WSYNC_RETURN_IF_ERROR(Claim(*state_, process, &ProcessState::group_alive, "group"));
  return std::unique_ptr<Group>(new loopback_internal::LoopbackGroup(state_, process));
}

void LoopbackFabric::Kill(int32_t process) {
  FabricState& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (!s.InRange(process) || s.process(process).killed) return;
  s.process(process).killed = true;
  loopback_internal::FailInvolving(s, process);
}

bool LoopbackFabric::IsKilled(int32_t process) const {
  absl::MutexLock lock(&state_->mu);
  return state_->InRange(process) && state_->process(process).killed;
}

LoopbackCounters LoopbackFabric::counters() const {
  const FabricState& s = *state_;
  absl::MutexLock lock(&s.mu);
  LoopbackCounters c;
  c.processes = s.size;
  c.bytes = s.delivered_bytes;
  c.messages = s.delivered_messages;
  c.largest_message_bytes = s.largest_message_bytes;
  c.dropped_messages = s.dropped_messages;
  return c;
}

void LoopbackFabric::ResetCounters() {
  FabricState& s = *state_;
  absl::MutexLock lock(&s.mu);
  std::fill(s.delivered_bytes.begin(), s.delivered_bytes.end(), 0);
  s.delivered_messages = 0;
  s.largest_message_bytes = 0;
  s.dropped_messages = 0;
}

void LoopbackFabric::SetDropMessages(int32_t from, int32_t to, bool drop) {
  FabricState& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (!s.InRange(from) || !s.InRange(to)) return;
  s.process(from).drop_to[to] = drop;
}

void LoopbackFabric::FailNthSend(int32_t process, int64_t n, absl::Status error) {
  FabricState& s = *state_;
  absl::MutexLock lock(&s.mu);
  if (!s.InRange(process)) return;
  ProcessState& ps = s.process(process);
  if (error.ok()) error = absl::InternalError("loopback: injected send failure");
  ps.fail_send_countdown = std::max<int64_t>(n, 0);
  ps.fail_send_error = n > 0 ? std::move(error) : absl::OkStatus();
}

int64_t LoopbackFabric::UnmatchedRequests() const {
  const FabricState& s = *state_;
  absl::MutexLock lock(&s.mu);
  int64_t n = 0;
  for (const auto& [key, queue] : s.queued_sends) n += static_cast<int64_t>(queue.size());
  for (const auto& [key, queue] : s.queued_receives) n += static_cast<int64_t>(queue.size());
  return n;
}

}  // namespace wsync
