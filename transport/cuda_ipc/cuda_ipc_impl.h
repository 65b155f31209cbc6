#ifndef WSYNC_TRANSPORT_CUDA_IPC_CUDA_IPC_IMPL_H_
#define WSYNC_TRANSPORT_CUDA_IPC_CUDA_IPC_IMPL_H_

// Internal to the cuda_ipc library: the wire records and the state of CudaIpcTransport, shared by
// its posting half (cuda_ipc_transport.cc) and its progress and wait half (cuda_ipc_progress.cc).
// Not installed, not included outside this folder. Thread safety as in cuda_ipc_transport.h.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"

namespace wsync {
namespace cuda_ipc_internal {

constexpr uint32_t kDescriptorMagic = 0x77637031;  // "wcp1"
constexpr uint32_t kAckMagic = 0x77636131;         // "wca1"

// What the sender tells the receiver, over the messenger. Both processes run the same build.
// Nothing in it is trusted for memory safety: the receiver copies its own receive's size (from
// the plan), checks the offset against the size the driver reports for the mapped allocation, and
// reads `source_address` only when it is exactly a send that a transport of its own OS process has
// posted to it and not yet released (LiveSends).
struct Descriptor {
  uint32_t magic = kDescriptorMagic;
  int32_t sender_pid = 0;        // The sender's OS process (getpid).
  int64_t bytes = 0;             // The message's size.
  int64_t offset = 0;            // Of the message in its allocation.
  int64_t allocation_bytes = 0;  // Of the allocation the handle names (informative only).
  uint64_t source_address = 0;   // The sender's address of the message (self-sends copy from it).
  char handle[NcclApi::kIpcHandleBytes] = {};  // Zero for empty messages and self-sends.
  uint64_t sender_namespace = 0;  // OwnPidNamespace() of the sender: pids compare only within it.
};

// The sends posted by the CUDA IPC transports of this OS process and not yet released: (sender,
// receiver, descriptor tag, address, bytes). A receiver in this OS process (a self-send, or
// threads standing in for processes) reads a sender's memory at its own address only when the
// descriptor names such a send exactly, so a forged descriptor cannot make it read any other
// memory of the process.
class LiveSends {
 public:
  using Key = std::tuple<int32_t, int32_t, uint64_t, uint64_t, int64_t>;
  static LiveSends& Get() {
    static LiveSends* sends = new LiveSends();
    return *sends;
  }
  void Add(const Key& key) {
    absl::MutexLock lock(&mu_);
    sends_.insert(key);
  }
  void Remove(const Key& key) {
    absl::MutexLock lock(&mu_);
    auto it = sends_.find(key);
    if (it != sends_.end()) sends_.erase(it);
  }
  bool Contains(const Key& key) const {
    absl::MutexLock lock(&mu_);
    return sends_.count(key) > 0;
  }

 private:
  mutable absl::Mutex mu_;
  std::multiset<Key> sends_ ABSL_GUARDED_BY(mu_);
};

// What the receiver answers once it copied the message (or refused it).
struct Ack {
  uint32_t magic = kAckMagic;
  int32_t size_mismatch = 0;  // 1: the receive had another size (receive_bytes), nothing copied.
  int64_t receive_bytes = 0;
};

// Acknowledgements travel with this bit of the 24-bit sync id flipped, so that they never meet a
// descriptor (or any message of a sync within kStaleSyncWindow) whatever the round.
constexpr uint64_t kAckSyncBit = uint64_t{1} << 23;

inline uint64_t TagSync(MessageTag tag) { return tag.value >> 40; }
inline int64_t TagRound(MessageTag tag) {
  return static_cast<int64_t>((tag.value >> 16) & 0xffffffu);
}

}  // namespace cuda_ipc_internal

using cuda_ipc_internal::Ack;
using cuda_ipc_internal::Descriptor;
using cuda_ipc_internal::LiveSends;

class CudaIpcTransport::Impl {
 public:
  Impl(CudaIpcOptions options, std::unique_ptr<NcclApi> api, std::unique_ptr<Transport> messenger)
      : options_(options), api_(std::move(api)), messenger_(std::move(messenger)) {}
  ~Impl();

  absl::Status Init();
  int32_t process() const { return options_.process; }
  Transport& messenger() { return *messenger_; }

  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes, MemoryKind kind);
  absl::Status DeregisterMemory(RegistrationId id);
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data, int64_t bytes);
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data, int64_t bytes);
  absl::StatusOr<bool> Test(RequestId request);
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline);
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished);
  void Abort(const absl::Status& reason);
  int64_t DiscardStaleMessages(uint64_t sync_id);

 private:
  enum class Direction : uint8_t { kSend, kReceive };
  // Wire buffers of one request; heap-allocated so that they outlive a cancelled messenger send.
  struct Wire {
    Descriptor descriptor;
    Ack ack;
  };
  struct Request {
    Direction direction = Direction::kSend;
    int32_t peer = 0;
    MessageTag tag;  // The caller's.
    void* data = nullptr;
    int64_t bytes = 0;
    std::unique_ptr<Wire> wire = std::make_unique<Wire>();
    // Messenger requests still in flight (0: none): the descriptor (sent by a send, received by
    // a receive) and the acknowledgement (received by a send).
    RequestId descriptor_request = 0;
    RequestId ack_request = 0;
    CudaEvent copy_event = nullptr;           // Set while the receive's copy runs.
    bool descriptor_sent = false;             // A send's descriptor send completed successfully.
    std::optional<LiveSends::Key> live_send;  // A send listed in LiveSends until released.
    bool done = false;
    absl::Status failure;
  };
  struct Registration {
    char* address;
    int64_t bytes;
    char* allocation_base;
    int64_t allocation_bytes;
    std::string handle;
  };
  // An opened handle: its base in this process, its size as the driver reports it for the
  // mapping (never the descriptor's), and the last sync (24 bits) that copied from it.
  struct Mapping {
    char* base;
    int64_t bytes;
    uint64_t last_sync;
  };
  // An acknowledgement sent after its receive was released.
  struct PendingAck {
    RequestId messenger_request;
    std::unique_ptr<Ack> ack;
  };

  absl::StatusOr<RequestId> PostLocked(Direction direction, int32_t peer, MessageTag tag,
                                       void* data, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills the handle, offset and allocation size of a send of [data, data + bytes).
  absl::Status DescribeSourceLocked(const void* data, int64_t bytes, Descriptor& descriptor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Advances every request (in posting order) and every pending acknowledgement.
  void ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProgressSendLocked(Request& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProgressReceiveLocked(Request& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The descriptor of `request` arrived: checks it and issues the copy (or completes).
  absl::Status StartCopyLocked(Request& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mapping of `handle` in this process, opened on first use; marks it used by `sync`.
  absl::StatusOr<Mapping> MappingLocked(const std::string& handle, uint64_t sync)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendAckLocked(const Request& request, bool size_mismatch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(Request& request, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Done (true), in flight (false) or failed (its error); releases nothing.
  absl::StatusOr<bool> StateLocked(const Request& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the request's messenger requests, waits for its copy, and forgets it.
  void ReleaseLocked(RequestId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels messenger requests (a past deadline): every id is released.
  void CancelMessengerLocked(std::vector<RequestId> ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls until `event` completed or failed; bounded by the copy, not by a peer.
  void AwaitCopyLocked(CudaEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CudaEvent> TakeEventLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeLocked(absl::Span<const RequestId> ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string What(const Request& request) const;
  void PauseLocked(absl::Duration& pause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CudaIpcOptions options_;
  mutable absl::Mutex mu_;
  std::unique_ptr<NcclApi> api_ ABSL_GUARDED_BY(mu_);
  // Thread-safe for Abort and PeerLost; everything else is called with mu_ held.
  std::unique_ptr<Transport> messenger_;
  CudaStream stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<CudaEvent> free_events_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // Set by Abort.
  std::map<RequestId, Request> requests_ ABSL_GUARDED_BY(mu_);
  RequestId next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<RegistrationId, Registration> registrations_ ABSL_GUARDED_BY(mu_);
  RegistrationId next_registration_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, Mapping> mappings_ ABSL_GUARDED_BY(mu_);  // By handle.
  std::vector<PendingAck> pending_acks_ ABSL_GUARDED_BY(mu_);
  // Wire buffers of cancelled messenger sends: the messenger may still read them until it is
  // destroyed.
  std::vector<std::unique_ptr<Wire>> cancelled_wires_ ABSL_GUARDED_BY(mu_);
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_CUDA_IPC_CUDA_IPC_IMPL_H_
