#ifndef WSYNC_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
#define WSYNC_TRANSPORT_NCCL_NCCL_TRANSPORT_H_

// A Transport over NCCL point-to-point for CUDA memory: one non-blocking communicator
// (config.blocking = 0) over the job's processes that use NCCL, formed from an ncclUniqueId that
// one process makes (NcclTransport::NewUniqueId) and the control plane broadcasts.
//
// Rounds: PostSend and PostReceive only record operations. The first Test or WaitAll of a request
// (or an explicit Flush) issues the recorded operations of its round (the sync id and round bits
// of the tag), and of every earlier-posted round still recorded, as one group per round:
// ncclGroupStart / ncclSend and ncclRecv ... / ncclGroupEnd on the backend's dedicated stream.
// Rounds of later posts stay recorded. One group per round is what keeps NCCL deadlock-free: the
// groups of one stream run one after another, so a group holding round r+1 sends (the executor
// posts them early, overlapping round r) could wait on a peer whose round r+1 receives come only
// after its round r completes, while that peer waits likewise. With every process issuing exactly
// round r's operations in its round-r group, the round-r groups of all processes match each other
// completely. Callers must therefore post every send and receive of round r before waiting on
// round r (the executor does). Rounds do not overlap on the stream (a second stream for odd rounds
// would let them; not done). With a non-blocking communicator ncclGroupEnd may return before the
// operations are enqueued; the backend polls ncclCommGetAsyncError until they are and only then
// records a CUDA event after them. A request completes when its group's event does.
//
// Tags: NCCL has no tags; it matches the k-th send from A to B with the k-th receive on B from A.
// The executor provides this order: both sides derive the rounds of a pair from the same agreed
// plan and post them in the canonical order (rounds ascending, one message per peer and direction
// per round). The backend checks the part of that order it can see: per peer and direction, the
// round of a tag (bits 16..39 of MakeTag) never decreases within one sync id (bits 40..63), and the
// sender bits (0..15) are zero or the sending process. A post that breaks the order is refused
// with InvalidArgument naming the peer and both tags, before anything is issued, because NCCL would
// otherwise deliver the bytes into the wrong buffer. Sizes are not on the wire either: a receive
// of another size than its send is not detected by NCCL (the plan digest both sides agreed on
// makes sizes equal); the contract's size-mismatch error is therefore not produced by this backend.
//
// Deadlines and failures: every wait polls ncclCommGetAsyncError and the events, so it returns by
// its deadline. NCCL cannot cancel one operation: a deadline, an asynchronous error (a lost peer
// shows as ncclRemoteError / ncclSystemError) or Abort aborts the whole communicator
// (ncclCommAbort), fails every outstanding request with an error naming the peers they were with,
// and leaves the transport aborted: every later post fails, and a new communicator (a new
// NcclTransport with a new unique id) is needed. ncclCommAbort stops the communicator's kernels,
// so receive memory is not written after the abort returned.
//
// Memory: CUDA memory only. RegisterMemory of host memory, and posts whose pointer CUDA reports as
// host memory, are refused with Unimplemented. RegisterMemory registers the range with
// ncclCommRegister (used by NCCL where it helps, e.g. network p2p); registration is optional.
// Empty messages complete at once without NCCL (both sides skip them). Sends to self are NCCL
// self-sends within the group.
//
// Threads: one driving thread makes every call but Abort; Abort may come from any thread. An
// internal mutex serialises every NCCL and CUDA call; none of them blocks (non-blocking
// communicator, queries only), so Abort waits at most one call.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/nccl/nccl_api.h"
#include "transport/transport.h"

namespace wsync {

struct NcclOptions {
  // Global id of this process.
  int32_t process = 0;
  // Global ids of the communicator's members in rank order; must contain `process` once. Peers
  // outside it are refused.
  std::vector<int32_t> members;
  // Made by one member with NewUniqueId, carried to the others by the control plane.
  NcclUniqueId unique_id;
  // CUDA device of this process.
  int device = 0;
  // The communicator must form by then (every member must create its transport).
  absl::Time connect_deadline = absl::InfiniteFuture();
  // Poll pause bounds while waiting.
  absl::Duration max_poll_pause = absl::Microseconds(200);
};

class NcclTransport final : public Transport {
 public:
  // A fresh unique id for a new communicator.
  static absl::StatusOr<NcclUniqueId> NewUniqueId(NcclApi& api);

  // Forms the communicator: every member calls Create with the same unique id and members. On the
  // connect deadline the communicator is aborted and DeadlineExceeded returned.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(NcclOptions options,
                                                               std::unique_ptr<NcclApi> api);
  ~NcclTransport() override;

  int32_t process() const override { return options_.process; }
  std::string name() const override { return "nccl"; }
  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override;
  absl::Status DeregisterMemory(RegistrationId id) override;
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override;
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override;
  absl::StatusOr<bool> Test(RequestId request) override;
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override;
  // NCCL runs a communicator's operations in issue order on one stream.
  bool NeedsRoundOrder() const override { return true; }
  void Abort(const absl::Status& reason) override;

  // Issues the recorded operations as one group now (Test and WaitAll do it when needed).
  absl::Status Flush();
  // Number of groups issued so far (each is one ncclGroupStart ... ncclGroupEnd), for tests and
  // stats.
  int64_t groups_issued() const;

 private:
  enum class Direction : uint8_t { kSend, kReceive };
  struct Operation {
    RequestId request;
    Direction direction;
    int32_t peer;  // Global process id.
    void* data;
    int64_t bytes;
    uint64_t round_key;  // Bits 16..63 of the tag: sync id and round.
  };
  enum class Stage : uint8_t { kEnqueuing, kRecorded, kDone };
  struct GroupState {
    Stage stage = Stage::kEnqueuing;
    CudaEvent event = nullptr;
    int64_t outstanding = 0;  // Requests of the group not yet released.
  };
  struct Request {
    Direction direction;
    int32_t peer;
    int64_t group = -1;  // -1: recorded, not issued yet.
    bool done = false;   // Completed without NCCL (empty message).
  };
  struct LastTag {
    bool any = false;
    uint64_t sync = 0;
    uint64_t round = 0;
  };

  NcclTransport(NcclOptions options, std::unique_ptr<NcclApi> api);

  absl::StatusOr<RequestId> Post(Direction direction, int32_t peer, MessageTag tag, void* data,
                                 int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Issues recorded operations, one group per round (sync id and round of the tag), rounds in the
  // order they were first posted, up to and including the rounds of `needed` (every round when
  // `needed` is empty); later rounds stay recorded. Stops early, leaving rounds recorded, while an
  // issued group is still being enqueued (ncclInProgress).
  absl::Status FlushLocked(absl::Span<const RequestId> needed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool EnqueuingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status IssueGroupLocked(std::vector<Operation> operations)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Advances every group; on a communicator failure aborts (failure_ set) and returns it.
  absl::Status ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when `request` completed, false while in flight; the failure otherwise. Releases nothing.
  absl::StatusOr<bool> DoneLocked(RequestId request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(RequestId request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "process 3 (send), process 5 (receive)" for the given requests.
  std::string DescribeLocked(absl::Span<const RequestId> requests) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The communicator rank of `peer`, or -1.
  int RankOf(int32_t peer) const;

  const NcclOptions options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<NcclApi> api_ ABSL_GUARDED_BY(mu_);
  NcclComm comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  CudaStream stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // Set once aborted.
  std::vector<Operation> recorded_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, GroupState> groups_ ABSL_GUARDED_BY(mu_);
  int64_t next_group_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<RequestId, Request> requests_ ABSL_GUARDED_BY(mu_);
  RequestId next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::pair<int32_t, Direction>, LastTag> last_tag_ ABSL_GUARDED_BY(mu_);
  std::map<RegistrationId, void*> registrations_ ABSL_GUARDED_BY(mu_);
  RegistrationId next_registration_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_NCCL_NCCL_TRANSPORT_H_
