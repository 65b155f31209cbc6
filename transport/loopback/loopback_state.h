#ifndef WSYNC_TRANSPORT_LOOPBACK_LOOPBACK_STATE_H_
#define WSYNC_TRANSPORT_LOOPBACK_LOOPBACK_STATE_H_

// The shared state of a LoopbackFabric (loopback.h) and the request bookkeeping its transports
// and groups share: matching queues, failing and cancelling requests. Private to this folder.
// Everything here is guarded by FabricState::mu, as the annotations say.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "transport/transport.h"

namespace wsync {
namespace loopback_internal {

// kQueued: waiting in a match queue. kDropped: a lost send, in no queue. kCopying: matched, the
// poster of the second request is copying without the lock. kDone / kFailed: final.
enum class RequestState : uint8_t { kQueued, kDropped, kCopying, kDone, kFailed };
enum class RequestKind : uint8_t { kSend, kReceive };

struct Request {
  RequestId id = 0;
  int32_t owner = 0;
  RequestKind kind = RequestKind::kSend;
  int32_t peer = 0;
  MessageTag tag;
  void* data = nullptr;  // Read only for sends; an eager message's points into eager_bytes.
  int64_t bytes = 0;
  // An eager message (LoopbackFabric's eager_bytes): the bytes its send copied when posted. Such a
  // message is owned by the fabric's queue alone, in no process's requests.
  std::vector<unsigned char> eager_bytes;
  RequestState state = RequestState::kQueued;
  bool cancelled = false;  // Failed by WaitAll's deadline or the Transport's destruction.
  // The error once kFailed; while kCopying, an error (abort, kill) to apply when the copy ends.
  absl::Status status;
};

// (sender, receiver, tag): the key requests match on.
struct MatchKey {
  int32_t sender = 0;
  int32_t receiver = 0;
  uint64_t tag = 0;
  friend bool operator==(const MatchKey& a, const MatchKey& b) {
    return a.sender == b.sender && a.receiver == b.receiver && a.tag == b.tag;
  }
  template <typename H>
  friend H AbslHashValue(H h, const MatchKey& k) {
    return H::combine(std::move(h), k.sender, k.receiver, k.tag);
  }
};

using RequestQueue = std::deque<std::shared_ptr<Request>>;

// The k-th collective of every process.
struct Round {
  std::vector<std::optional<std::string>> payloads;  // Indexed by process.
  int32_t contributed = 0;
  int32_t finished = 0;  // Processes that returned from this round, with success or error.
};

struct ProcessState {
  bool transport_alive = false;
  bool group_alive = false;
  bool killed = false;
  bool aborted = false;
  absl::Status abort_reason;  // The reason given to the first Abort, when `aborted`.
  // Signalled whenever a request owned by this process changes state; waited on by its Transport.
  absl::CondVar cv;
  RequestId next_request = 1;  // Monotonic across reconnects, so stale ids never alias.
  absl::flat_hash_map<RequestId, std::shared_ptr<Request>> requests;
  int64_t next_collective = 0;
  int64_t fail_send_countdown = 0;  // 0: no FailNthSend hook armed.
  absl::Status fail_send_error;
  std::vector<bool> drop_to;  // Indexed by receiver.
};

struct FabricState {
  FabricState(int32_t n, int64_t eager) : size(n), eager_bytes(eager) {
    for (int32_t p = 0; p < n; ++p) {
      processes.push_back(std::make_unique<ProcessState>());
      processes.back()->drop_to.assign(n, false);
    }
    delivered_bytes.assign(static_cast<size_t>(n) * n, 0);
  }

  bool InRange(int32_t p) const { return p >= 0 && p < size; }
  ProcessState& process(int32_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return *processes[p]; }

  const int32_t size;
  const int64_t eager_bytes;  // Sends of at most this many bytes are eager (loopback.h).
  mutable absl::Mutex mu;
  std::vector<std::unique_ptr<ProcessState>> processes ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<MatchKey, RequestQueue> queued_sends ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<MatchKey, RequestQueue> queued_receives ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<int64_t, std::unique_ptr<Round>> rounds ABSL_GUARDED_BY(mu);
  absl::CondVar group_cv;  // Signalled on every contribution, abort and kill.
  std::vector<int64_t> delivered_bytes ABSL_GUARDED_BY(mu);
  int64_t delivered_messages ABSL_GUARDED_BY(mu) = 0;
  int64_t largest_message_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t dropped_messages ABSL_GUARDED_BY(mu) = 0;
};

// "0x..." texts of a tag and an address, for error messages.
std::string TagText(MessageTag tag);
std::string AddressText(const void* p);

// "send to process 3 (tag 0x..., 64 bytes)": a request in error messages.
std::string Describe(const Request& r);

// Why process `p` is down ("was killed", "aborted: <reason>"), or empty while it is up.
std::string DownText(FabricState& s, int32_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// The error of a request involving process `p` while `p` is killed (Unavailable) or aborted
// (Aborted), or OK. `as_peer` words it for the other side of the request.
absl::Status DownError(FabricState& s, int32_t p, bool as_peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// The queue `r` waits in (sends and receives apart, by (sender, receiver, tag)), created when
// missing; its key in `key`.
RequestQueue& QueueOf(FabricState& s, const Request& r, MatchKey* key)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// Takes `r` out of its queue (no-op when it is not queued) and drops the queue once empty.
void RemoveFromQueue(FabricState& s, const Request& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// Fails `r` with `error` unless it is final. A request being copied keeps its state and fails
// when the copy ends. Signals the owner.
void FailRequest(FabricState& s, Request& r, absl::Status error, bool cancelled)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// Fails every request of process `p` with its own error and every request of another process
// whose peer is `p` with the peer error; wakes every waiter. For Abort and Kill.
void FailInvolving(FabricState& s, int32_t p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// Ends the copy of a matched pair: each request completes, or fails with the error it received
// while being copied. The bytes were delivered either way and are counted.
void FinishCopy(FabricState& s, Request& send, Request& receive)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

// Cancels the in-flight requests among `requests` (which `ps` owns), waits for those being copied,
// and releases them all. Returns the descriptions of the requests it cancelled.
std::vector<std::string> CancelAndRelease(FabricState& s, ProcessState& ps,
                                          absl::Span<const std::shared_ptr<Request>> requests)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);

}  // namespace loopback_internal
}  // namespace wsync

#endif  // WSYNC_TRANSPORT_LOOPBACK_LOOPBACK_STATE_H_
