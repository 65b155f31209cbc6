#ifndef WSYNC_TRANSPORT_TRANSPORT_H_
#define WSYNC_TRANSPORT_TRANSPORT_H_

// The byte-moving interface the executor drives. A Transport belongs to one process of a job and
// talks to its peers by their global process id. Receivers choose where bytes land: a process only
// posts sends from its own memory and receives into its own memory; no peer ever writes into
// memory it was not handed by a posted receive.
//
// Thread safety: Abort may be called from any thread at any time. All other calls are made by one
// thread at a time (the executor's), but implementations must tolerate Abort racing with them.
//
// Memory: a receive's memory is never written once the request is released, cancelled or aborted.
// A send's memory may still be read by the peer after a cancel (UCX cancels a send only by closing
// its endpoint, and a rendezvous the peer already started may complete its read), so callers keep
// send memory unchanged until the sync ends. Registration before posting is a backend's choice:
// loopback needs none, UCX registers on first use when the caller did not. Messages may be empty
// and a process may send to itself. Messages with equal tags between one pair arrive in order.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/memory_kind.h"

namespace wsync {

using RequestId = uint64_t;
using RegistrationId = uint64_t;

// A 64-bit message tag: which sync, which round, which sender. Both sides compute the same tag for
// one message; a receive matches only a send from its peer with an equal tag.
struct MessageTag {
  uint64_t value = 0;
  friend bool operator==(MessageTag a, MessageTag b) { return a.value == b.value; }
};

// sync_id keeps its low 24 bits, round its low 24 bits (kMaxRounds), sender its low 16 bits. The
// sender matters to backends whose tag receives do not filter by endpoint (UCX); it limits a job
// to 65536 processes.
inline constexpr int64_t kMaxRounds = int64_t{1} << 24;
MessageTag MakeTag(uint64_t sync_id, int64_t round, int32_t sender);

// Syncs a transport looks back when it discards stale messages (DiscardStaleMessages).
inline constexpr uint64_t kStaleSyncWindow = 16;
// Whether `tag` belongs to one of the kStaleSyncWindow syncs before `sync_id` (modulo the 24 bits
// the tag keeps).
bool IsStaleTag(MessageTag tag, uint64_t sync_id);

// The reason PeerLost gets for every peer when the coordinator itself was lost (LossWatch: no
// sync can complete without it, though the peers may be alive): Unavailable("this process lost
// its connection to the coordinator: <detail>"), marked so that IsCoordinatorLoss tells it apart
// from a lost peer.
absl::Status CoordinatorLoss(absl::string_view detail);
bool IsCoordinatorLoss(const absl::Status& reason);

class Transport {
 public:
  virtual ~Transport() = default;

  // Global process id of this endpoint.
  virtual int32_t process() const = 0;
  // Short name for stats and metrics ("loopback", "ucx", "nccl").
  virtual std::string name() const = 0;

  // Registers [address, address + bytes) for use in sends and receives; registration is reused
  // every sync. Memory of another kind than the transport supports is refused (Unimplemented).
  virtual absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                        MemoryKind kind) = 0;
  virtual absl::Status DeregisterMemory(RegistrationId id) = 0;

  // Posts a send of `bytes` bytes at `data` to `peer`. `data` must stay valid and unchanged until
  // the request completes. Fails at once on a bad peer or after Abort.
  virtual absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                             int64_t bytes) = 0;
  // Posts a receive of exactly `bytes` bytes from `peer` into `data`. A matching message of another
  // size fails the receive with both sizes in the message (the send may succeed: UCX and NCCL do
  // not tell the sender). Tags come from MakeTag.
  virtual absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                                int64_t bytes) = 0;

  // True once the request completed successfully (it is then released and its id is invalid);
  // false while it is in flight; the request's error once it failed (also releasing it).
  virtual absl::StatusOr<bool> Test(RequestId request) = 0;

  // Waits until every request completed (releasing them) or `deadline` passes. On a deadline the
  // outstanding requests are cancelled and DeadlineExceeded names their peers; on a failed request
  // its error is returned after the others are cancelled. Either way every id is released.
  virtual absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) = 0;

  // Waits until at least one of `requests` finished or `deadline` passes. Appends to `finished`
  // the positions (in `requests`) of those that finished, each released whether it succeeded or
  // failed, and returns the error of the first that failed, else OK. At the deadline with none
  // finished: DeadlineExceeded, nothing released. What is still in flight stays posted (the
  // caller waits for it again, or cancels it with WaitAll). The default polls Test, spinning for
  // 50 us and then pausing up to 50 us between passes; backends with a wakeup event override it.
  virtual absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                               std::vector<size_t>* finished);

  // Moves the bytes of requests already posted without completing any for the caller: no id is
  // released, Test/WaitAll/WaitAny still report each. For a caller busy between its waits (the
  // executor while it quantizes the next message) so that what it posted keeps moving. Returns
  // promptly (a bounded amount of work); an abort it notices fails the requests as WaitAll would
  // see. The default does nothing: for a backend whose transfers advance without the caller
  // (threads, a device stream, a simulated clock).
  virtual void ProgressInFlight() {}

  // Whether every process must post its messages in the executor's global round order, round by
  // round: true where a backend runs the operations of one communicator in issue order (NCCL,
  // one stream), so that a process running ahead on one peer could block a round another process
  // needs. The executor then runs in lockstep rounds; otherwise each pair advances on its own.
  virtual bool NeedsRoundOrder() const { return false; }

  // Fails every outstanding and future request of this endpoint with `reason` (Aborted), and the
  // collectives of this process's Group. Peers learn of it either at once (their requests with
  // this process fail) or at their deadline; both are allowed. Idempotent, callable from any
  // thread.
  virtual void Abort(const absl::Status& reason) = 0;

  // Process `peer` is known to be dead (the control plane saw its connection end): fails this
  // endpoint's outstanding requests with it, and its later ones until the peer is connected again,
  // with Unavailable(reason), so that a wait blocked on it returns now instead of at its deadline.
  // Requests with other peers are left alone where the backend can single the peer out (UCX); the
  // default aborts the whole endpoint (Abort: permanent), which is what a backend whose operations
  // cannot be cancelled one by one must do (NCCL: ncclCommAbort). Idempotent, callable from any
  // thread.
  // When the control plane lost the coordinator instead, every peer is reported with a reason
  // made by CoordinatorLoss (below): the peer may be alive, and backends word their errors so.
  virtual void PeerLost(int32_t peer, const absl::Status& reason) { Abort(reason); }

  // Rejects the messages that arrived for this process from one of the kStaleSyncWindow syncs
  // before `sync_id` and were never matched (delayed, or replayed): each is consumed into scratch
  // memory and dropped, writing nothing the caller owns, and counted. Returns how many this call
  // rejected. Messages of `sync_id` and later syncs are left alone. What a message announces
  // allocates nothing, a call's time is bounded (what it leaves, a later call drops) and Abort
  // does not wait for it. The default rejects nothing (a backend that cannot see unmatched
  // messages).
  virtual int64_t DiscardStaleMessages(uint64_t sync_id) { return 0; }
};

// Small collectives over the processes of a job, used by the executor before any byte moves.
// Thread-compatible: one collective at a time per process.
class Group {
 public:
  virtual ~Group() = default;
  virtual int32_t process() const = 0;
  virtual int32_t size() const = 0;
  // Every process contributes `payload`; every process returns all payloads indexed by process.
  // DeadlineExceeded names the processes that did not contribute in time. Collectives are numbered
  // per process: the k-th call of every process forms one round, and a failed call still uses its
  // number, so a process that retries pairs with its peers' next call.
  virtual absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view payload,
                                                             absl::Time deadline) = 0;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_TRANSPORT_H_
