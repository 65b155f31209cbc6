#ifndef WSYNC_TRANSPORT_UCX_UCX_IMPL_H_
#define WSYNC_TRANSPORT_UCX_UCX_IMPL_H_

// Private to the UCX backend: the transport class behind UcxTransport (ucx_transport.h states its
// contracts) and its records of requests, peers and registrations. Setup, endpoints, memory and
// posts are defined in ucx_transport.cc; waiting, completion, cancelling, abort and progress in
// ucx_requests.cc.

#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_stale.h"
#include "transport/ucx/ucx_transport.h"

namespace wsync::ucx_internal {

constexpr int32_t kMaxProcesses = 1 << 16;
constexpr uint64_t kSenderMask = 0xffff;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
constexpr int kProgressBurst = 64;  // ucp_worker_progress calls per Progress() at most.
// What one DiscardStaleMessages call may spend; a flood of stale messages is drained over calls.
constexpr absl::Duration kStaleDrainTime = absl::Milliseconds(250);
constexpr int64_t kMaxStaleDrained = 4096;

enum class Kind : uint8_t { kSend, kReceive };

class UcxTransportImpl;

// One posted request. Owned by the transport's slot table; UCX's callbacks get its address as
// user_data, so a slot lives until UCX can no longer call back (done, or its handle freed).
struct Slot {
  UcxTransportImpl* owner = nullptr;
  RequestId id = 0;
  Kind kind = Kind::kSend;
  int32_t peer = 0;
  MessageTag tag;
  int64_t bytes = 0;
  RegistrationId registration = 0;  // The registration whose memory handle UCX uses, or 0.
  void* request = nullptr;          // UCX's handle while UCX may still finish the operation.
  bool done = false;
  absl::Status status;         // Final once `done`.
  absl::Status cancel_reason;  // Replaces a UCX error once this side cancelled the request.
  ucp_tag_recv_info_t info{};  // Filled by a receive that completes inside ucp_tag_recv_nbx.
};

// A peer process. Heap-allocated so its address can be the error callback's argument.
struct Peer {
  UcxTransportImpl* owner = nullptr;
  int32_t process = 0;
  std::string address;  // Empty: unknown.
  ucp_ep_h ep = nullptr;
  bool peer_mode = false;  // `ep` uses UCP_ERR_HANDLING_MODE_PEER.
  // Not OK once UCX reported the peer failed; sticky until ConnectPeers connects it again.
  absl::Status failure;
  bool failure_pending = false;  // `failure` was set by the error callback and not handled yet.
  // From the address's trailer (ProcessTrailer): the peer's pid and pid namespace (0: unknown).
  int32_t pid = 0;
  uint64_t pid_namespace = 0;
};

struct Registration {
  uintptr_t begin = 0;
  int64_t bytes = 0;
  ucp_mem_h memh = nullptr;  // Null for an empty range.
  MemoryKind kind = MemoryKind::kHost;
  int64_t users = 0;  // Requests using `memh` that UCX may still run.
};

// "0x" and `v` in hexadecimal.
std::string Hex(uint64_t v);
// "send to process P (tag T, B bytes)" or "receive from ...".
std::string Describe(const Slot& s);
// `status` as an absl::Status prefixed with `what`, by kind of failure.
absl::Status FromUcs(ucs_status_t status, absl::string_view what);
// What this backend appends to UCX's worker address: the process's pid and pid namespace (a hash
// of the host's boot id and the inode of /proc/self/ns/pid, 0 when unknown), so that peers of the
// same namespace on the same host can tell whether it has exited. UCX reads its address by its own
// encoding and ignores the bytes after it.
std::string ProcessTrailer(int32_t pid, uint64_t pid_namespace);
// The trailer of a published address; false when it has none (then nothing is known).
bool ParseProcessTrailer(absl::string_view address, int32_t* pid, uint64_t* pid_namespace);
// Whether process `pid` (of this pid namespace) has exited: it is gone, or a zombie.
bool ProcessHasExited(int32_t pid);
// The pid namespace of this process, as the trailer gives it (0 when unknown), is
// OwnPidNamespace() (common/process_identity.h).

// True when every entry of a UCX_TLS list is a shared-memory or self transport, none of which
// has a peer failure handler in UCX 1.13.
bool OnlySharedMemory(absl::string_view transports);

class UcxTransportImpl final : public UcxTransport {
 public:
  explicit UcxTransportImpl(const UcxOptions& options) : options_(options) {}

  ~UcxTransportImpl() override;

  absl::Status Init();

  int32_t process() const override { return options_.process; }
  std::string name() const override { return "ucx"; }
  std::string WorkerAddress() const override { return address_; }
  bool CarriesCudaMemory() const override;
  std::string MemoryTypes() const override;

  absl::Status ConnectPeers(const std::vector<std::string>& addresses) override;

  std::string EndpointInfo(int32_t peer) override;

  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override;

  absl::Status DeregisterMemory(RegistrationId id) override;

  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override;

  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override;

  absl::StatusOr<bool> Test(RequestId request) override;
  void ProgressInFlight() override;

  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override;

  // Transport::WaitAny, sleeping on the worker's wakeup event (as WaitAll) after idle_spin.
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished) override;

  int64_t DiscardStaleMessages(uint64_t sync_id) override;

  void Abort(const absl::Status& reason) override;

  // Records the loss and wakes the driving thread, which treats it as UCX's own report of the
  // peer's failure (HandleFailures: its endpoint is closed, its requests fail, later posts to it
  // fail until ConnectPeers connects it again).
  void PeerLost(int32_t peer, const absl::Status& reason) override;

 private:
  static void OnSendDone(void* /*request*/, ucs_status_t status,
                         void* user_data) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  static void OnReceiveDone(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info,
                            void* user_data) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Runs inside ucp_worker_progress: only records the failure; HandleFailures acts on it.
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  absl::Status UnknownRequest(RequestId id) const;

  // The abort status once Abort was called, else OK; performs the abort first if needed.
  absl::Status CheckAbort() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // Fails every unfinished request with the abort status and closes every endpoint. Idempotent.
  void AbortNow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // Marks the peers PeerLost named since the last call as failed, for HandleFailures.
  void TakeLostPeers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  std::vector<Slot*> PendingSlots() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // Records a completion reported by UCX or by a post that completed at once. UCX calls back only
  // inside calls made with drive_mu_ held (progress, post, cancel, close).
  void Complete(Slot& s, ucs_status_t status, const ucp_tag_recv_info_t* info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // Gives an unfinished request back to UCX, which then never calls back; its memory may still be
  // used, so its registration stays pinned. `why` says why it was not waited for.
  void Abandon(Slot& s, const absl::Status& reason, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // Cancels `slots` with `reason`: receives with ucp_request_cancel, sends by closing their
  // endpoints (all endpoints if `close_all`). Waits up to drain_timeout for UCX to finish them,
  // then abandons the rest. Every slot is done afterwards.
  void CancelAndDrain(const std::vector<Slot*>& slots, const absl::Status& reason, bool close_all)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // Force-closes the endpoint to `peer`; its unfinished sends fail with `reason` unless they
  // already have one. The next send to the peer creates a new endpoint.
  void CloseEndpoint(Peer& peer, const absl::Status& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // The endpoint to `peer`, created on demand.
  absl::StatusOr<ucp_ep_h> Endpoint(Peer& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // A registration covering [data, data + bytes), or 0. Linear: a process registers a few
  // hundred buffers at most, and a lookup costs far less than the message it serves.
  RegistrationId Covering(const void* data, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  absl::StatusOr<RequestId> Post(Kind kind, int32_t peer, MessageTag tag, void* data,
                                 int64_t bytes);

  // Acts on failures the error callback recorded, outside UCX callbacks: closes the endpoint
  // (failing its sends) and cancels the receives from the peer. No new endpoint is created until
  // ConnectPeers: UCX 1.13's tcp transport can hit an internal assertion when a new endpoint
  // connects to a peer whose old connection is still failing.
  void HandleFailures() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // One burst of UCX progress plus the bookkeeping after it; returns UCX's event count.
  unsigned Progress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // At most every kExitedPeerCheckPeriod (so at once after this process was stopped, or idle
  // between syncs): fails the peers in this pid namespace whose process has exited (kill(pid, 0):
  // ESRCH, or a zombie) for HandleFailures, which Progress runs before UCX's progress, so that
  // their requests fail naming the exit rather than at a deadline. (A CMA copy from or to an
  // exited peer that UCX runs first fails its request: endpoints carry the error callback.)
  void FailExitedPeers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  // Sleeps until the worker has an event, `until`, or `cap` (zero: max_sleep), whichever is first.
  void Sleep(absl::Time until, absl::Duration cap) ABSL_EXCLUSIVE_LOCKS_REQUIRED(drive_mu_);

  const UcxOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;  // Set once by Init; read without the lock by Abort.
  int efd_ = -1;
  std::string address_;         // UCX's worker address, then this process's ProcessTrailer.
  uint64_t pid_namespace_ = 0;  // Of this process (0: unknown); set by Init.
  absl::Time exited_peers_checked_ ABSL_GUARDED_BY(drive_mu_) = absl::InfinitePast();
  uint64_t memory_types_ = 0;  // ucp_context_query's bitmap of ucs_memory_type_t; set by Init.

  // Where stale messages are received (truncated) and dropped; UCX may write it until the worker
  // is destroyed (DiscardStaleMessages).
  std::array<char, kDiscardScratchBytes> discard_scratch_{};

  // Serializes every use of the worker, the context and the tables below (the worker runs in
  // UCS_THREAD_MODE_SERIALIZED). Held by the driving thread for a whole WaitAll.
  absl::Mutex drive_mu_;
  std::vector<std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(drive_mu_);
  absl::flat_hash_map<RequestId, std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(drive_mu_);
  RequestId next_request_ ABSL_GUARDED_BY(drive_mu_) = 1;
  std::vector<void*> closing_ ABSL_GUARDED_BY(drive_mu_);  // Unfinished ucp_ep_close_nbx.
  bool failures_pending_ = false;  // Set by OnPeerError during progress (under drive_mu_).
  absl::flat_hash_map<RegistrationId, Registration> registrations_ ABSL_GUARDED_BY(drive_mu_);
  RegistrationId next_registration_ ABSL_GUARDED_BY(drive_mu_) = 1;
  bool abort_done_ ABSL_GUARDED_BY(drive_mu_) = false;

  absl::Mutex abort_mu_;
  std::atomic<bool> abort_requested_{false};
  absl::Status abort_status_ ABSL_GUARDED_BY(abort_mu_);
  std::atomic<bool> lost_requested_{false};
  // PeerLost's reports, as plain data: a Status shares its representation between copies through
  // a reference count that ThreadSanitizer cannot see in Debian's uninstrumented Abseil, so none
  // crosses threads here.
  struct LostPeer {
    int32_t process;
    std::string reason;
    bool coordinator_loss;  // IsCoordinatorLoss(reason).
  };
  std::vector<LostPeer> lost_peers_ ABSL_GUARDED_BY(abort_mu_);
};

}  // namespace wsync::ucx_internal

#endif  // WSYNC_TRANSPORT_UCX_UCX_IMPL_H_
