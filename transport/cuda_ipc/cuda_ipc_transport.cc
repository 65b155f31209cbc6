#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/process_identity.h"
#include "common/status.h"

namespace wsync {
namespace {

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

uint64_t TagSync(MessageTag tag) { return tag.value >> 40; }
int64_t TagRound(MessageTag tag) { return static_cast<int64_t>((tag.value >> 16) & 0xffffffu); }

}  // namespace

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
    CudaEvent copy_event = nullptr;  // Set while the receive's copy runs.
    bool descriptor_sent = false;    // A send's descriptor send completed successfully.
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

absl::Status CudaIpcTransport::Impl::Init() {
  absl::MutexLock lock(&mu_);
  if (messenger_->process() != options_.process) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA IPC transport of process ", options_.process,
        " needs a messenger of the same process, not of process ", messenger_->process()));
  }
  WSYNC_RETURN_IF_ERROR(api_->SetDevice(options_.device));
  WSYNC_ASSIGN_OR_RETURN(stream_, api_->StreamCreate());
  return absl::OkStatus();
}

CudaIpcTransport::Impl::~Impl() {
  absl::MutexLock lock(&mu_);
  // Acknowledgements already posted get a short chance to leave, so that senders do not wait for
  // their deadline when this receiver is destroyed right after its receives completed.
  const absl::Time give_up = absl::Now() + absl::Seconds(1);
  absl::Duration pause = absl::ZeroDuration();
  while (!pending_acks_.empty() && absl::Now() < give_up) {
    ProgressLocked();
    PauseLocked(pause);
  }
  std::vector<RequestId> ids;
  for (const auto& [id, request] : requests_) ids.push_back(id);
  for (RequestId id : ids) ReleaseLocked(id);
  std::vector<RequestId> acks;
  for (const PendingAck& ack : pending_acks_) acks.push_back(ack.messenger_request);
  CancelMessengerLocked(std::move(acks));
  messenger_.reset();  // Before the buffers it may still read.
  pending_acks_.clear();
  cancelled_wires_.clear();
  for (const auto& [handle, mapping] : mappings_) {
    api_->IpcCloseMemHandle(mapping.base).IgnoreError();
  }
  for (CudaEvent event : free_events_) api_->EventDestroy(event).IgnoreError();
  if (stream_ != nullptr) api_->StreamDestroy(stream_).IgnoreError();
}

std::string CudaIpcTransport::Impl::What(const Request& request) const {
  return absl::StrCat(
      "CUDA IPC ", request.direction == Direction::kSend ? "send to" : "receive from", " process ",
      request.peer, " (sync ", TagSync(request.tag), ", round ", TagRound(request.tag), ")");
}

absl::StatusOr<RegistrationId> CudaIpcTransport::Impl::RegisterMemory(void* address, int64_t bytes,
                                                                      MemoryKind kind) {
  if (kind != MemoryKind::kCuda) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA IPC transport carries CUDA memory only, not ", MemoryKindName(kind), " memory"));
  }
  if (bytes < 0) return absl::InvalidArgumentError("negative registration size");
  absl::MutexLock lock(&mu_);
  Registration registration{static_cast<char*>(address), bytes, nullptr, 0, ""};
  if (bytes > 0) {
    WSYNC_ASSIGN_OR_RETURN(MemoryKind actual, api_->PointerKind(address));
    if (actual != MemoryKind::kCuda) {
      return absl::UnimplementedError(
          "the CUDA IPC transport carries CUDA memory only, and this range is host memory");
    }
    Descriptor descriptor;
    WSYNC_RETURN_IF_ERROR(DescribeSourceLocked(address, bytes, descriptor));
    registration.allocation_base = registration.address - descriptor.offset;
    registration.allocation_bytes = descriptor.allocation_bytes;
    registration.handle.assign(descriptor.handle, sizeof(descriptor.handle));
  }
  const RegistrationId id = next_registration_++;
  registrations_.emplace(id, std::move(registration));
  return id;
}

absl::Status CudaIpcTransport::Impl::DeregisterMemory(RegistrationId id) {
  absl::MutexLock lock(&mu_);
  if (registrations_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("no registration ", id));
  }
  return absl::OkStatus();
}

absl::Status CudaIpcTransport::Impl::DescribeSourceLocked(const void* data, int64_t bytes,
                                                          Descriptor& descriptor) {
  const char* begin = static_cast<const char*>(data);
  for (const auto& [id, r] : registrations_) {
    if (!r.handle.empty() && begin >= r.address && begin + bytes <= r.address + r.bytes) {
      descriptor.offset = begin - r.allocation_base;
      descriptor.allocation_bytes = r.allocation_bytes;
      std::memcpy(descriptor.handle, r.handle.data(), sizeof(descriptor.handle));
      return absl::OkStatus();
    }
  }
  WSYNC_ASSIGN_OR_RETURN(NcclApi::Allocation allocation, api_->AllocationRange(data));
  const char* base = static_cast<const char*>(allocation.base);
  if (begin < base || begin + bytes > base + allocation.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC: [", absl::Hex(begin), ", +", bytes,
                                                   ") is not inside one cudaMalloc allocation"));
  }
  WSYNC_ASSIGN_OR_RETURN(std::string handle, api_->IpcGetMemHandle(allocation.base));
  if (handle.size() != sizeof(descriptor.handle)) {
    return absl::InternalError(absl::StrCat("CUDA IPC handle of ", handle.size(), " bytes"));
  }
  descriptor.offset = begin - base;
  descriptor.allocation_bytes = static_cast<int64_t>(allocation.bytes);
  std::memcpy(descriptor.handle, handle.data(), sizeof(descriptor.handle));
  return absl::OkStatus();
}

absl::StatusOr<RequestId> CudaIpcTransport::Impl::PostSend(int32_t peer, MessageTag tag,
                                                           const void* data, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  return PostLocked(Direction::kSend, peer, tag, const_cast<void*>(data), bytes);
}

absl::StatusOr<RequestId> CudaIpcTransport::Impl::PostReceive(int32_t peer, MessageTag tag,
                                                              void* data, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  return PostLocked(Direction::kReceive, peer, tag, data, bytes);
}

absl::StatusOr<RequestId> CudaIpcTransport::Impl::PostLocked(Direction direction, int32_t peer,
                                                             MessageTag tag, void* data,
                                                             int64_t bytes) {
  WSYNC_RETURN_IF_ERROR(failure_);
  Request request;
  request.direction = direction;
  request.peer = peer;
  request.tag = tag;
  request.data = data;
  request.bytes = bytes;
  const std::string what = What(request);
  if (peer < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": no such process"));
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative size ", bytes));
  if (bytes > 0) {
    WSYNC_ASSIGN_OR_RETURN(MemoryKind kind, api_->PointerKind(data));
    if (kind != MemoryKind::kCuda) {
      return absl::UnimplementedError(absl::StrCat(
          what,
          ": the CUDA IPC transport carries CUDA memory only, and this pointer is host "
          "memory"));
    }
  }
  const int32_t sender = direction == Direction::kSend ? options_.process : peer;
  const int32_t receiver = direction == Direction::kSend ? peer : options_.process;
  const MessageTag descriptor_tag = MakeTag(TagSync(tag), TagRound(tag), sender);
  const MessageTag ack_tag = MakeTag(TagSync(tag) ^ kAckSyncBit, TagRound(tag), receiver);
  Wire& wire = *request.wire;
  if (direction == Direction::kSend) {
    wire.descriptor.bytes = bytes;
    wire.descriptor.sender_pid = getpid();
    wire.descriptor.sender_namespace = OwnPidNamespace();
    wire.descriptor.source_address = reinterpret_cast<uintptr_t>(data);
    if (bytes > 0 && peer != options_.process) {
      absl::Status described = DescribeSourceLocked(data, bytes, wire.descriptor);
      if (!described.ok()) {
        return absl::Status(described.code(), absl::StrCat(what, ": ", described.message()));
      }
    }
    WSYNC_ASSIGN_OR_RETURN(request.ack_request,
                           messenger_->PostReceive(peer, ack_tag, &wire.ack, sizeof(Ack)));
    // Listed before the descriptor leaves, so that a receiver of this OS process finds it.
    if (bytes > 0) {
      request.live_send = LiveSends::Key{options_.process, peer, descriptor_tag.value,
                                         reinterpret_cast<uintptr_t>(data), bytes};
      LiveSends::Get().Add(*request.live_send);
    }
    absl::StatusOr<RequestId> sent =
        messenger_->PostSend(peer, descriptor_tag, &wire.descriptor, sizeof(Descriptor));
    if (!sent.ok()) {
      if (request.live_send) LiveSends::Get().Remove(*request.live_send);
      CancelMessengerLocked({request.ack_request});
      return sent.status();
    }
    request.descriptor_request = *sent;
  } else {
    WSYNC_ASSIGN_OR_RETURN(
        request.descriptor_request,
        messenger_->PostReceive(peer, descriptor_tag, &wire.descriptor, sizeof(Descriptor)));
  }
  const RequestId id = next_request_++;
  requests_.emplace(id, std::move(request));
  return id;
}

void CudaIpcTransport::Impl::ProgressLocked() {
  // Receives of one (peer, tag) acknowledge in posting order, so that a sender's equal-tag
  // acknowledgements match its sends in order: a later one waits while an earlier one is still
  // waiting for its descriptor or its copy.
  std::set<std::pair<int32_t, uint64_t>> blocked;
  for (auto& [id, request] : requests_) {
    if (request.done || !request.failure.ok()) continue;
    if (request.direction == Direction::kSend) {
      ProgressSendLocked(request);
      continue;
    }
    const std::pair<int32_t, uint64_t> key{request.peer, request.tag.value};
    if (blocked.count(key) != 0) continue;
    ProgressReceiveLocked(request);
    if (!request.done && request.failure.ok()) blocked.insert(key);
  }
  std::vector<PendingAck> still;
  for (PendingAck& ack : pending_acks_) {
    // A failed acknowledgement is the sender's problem (it fails by its deadline or peer loss).
    absl::StatusOr<bool> sent = messenger_->Test(ack.messenger_request);
    if (sent.ok() && !*sent) still.push_back(std::move(ack));
  }
  pending_acks_ = std::move(still);
}

void CudaIpcTransport::Impl::ProgressSendLocked(Request& request) {
  for (RequestId* messenger_request : {&request.descriptor_request, &request.ack_request}) {
    if (*messenger_request == 0) continue;
    absl::StatusOr<bool> finished = messenger_->Test(*messenger_request);
    if (!finished.ok()) {
      *messenger_request = 0;  // Released by the failed Test.
      FailLocked(request,
                 absl::Status(finished.status().code(),
                              absl::StrCat(What(request), ": ", finished.status().message())));
      return;
    }
    if (*finished) {
      *messenger_request = 0;
      if (messenger_request == &request.descriptor_request) request.descriptor_sent = true;
    }
  }
  if (request.ack_request != 0 || request.descriptor_request != 0) return;
  const Ack& ack = request.wire->ack;
  if (ack.magic != kAckMagic) {
    FailLocked(request,
               absl::InternalError(absl::StrCat(What(request), ": malformed acknowledgement")));
  } else if (ack.size_mismatch != 0) {
    FailLocked(request, absl::InvalidArgumentError(
                            absl::StrCat(What(request), ": the message has ", request.bytes,
                                         " bytes and the receive ", ack.receive_bytes, " bytes")));
  } else {
    request.done = true;
  }
}

void CudaIpcTransport::Impl::ProgressReceiveLocked(Request& request) {
  if (request.descriptor_request != 0) {
    absl::StatusOr<bool> arrived = messenger_->Test(request.descriptor_request);
    if (!arrived.ok()) {
      request.descriptor_request = 0;
      FailLocked(request,
                 absl::Status(arrived.status().code(),
                              absl::StrCat(What(request), ": ", arrived.status().message())));
      return;
    }
    if (!*arrived) return;
    request.descriptor_request = 0;
    absl::Status started = StartCopyLocked(request);
    if (!started.ok()) {
      FailLocked(request, started);
      return;
    }
  }
  if (request.copy_event == nullptr) return;  // Completed without a copy.
  absl::StatusOr<bool> copied = api_->EventQuery(request.copy_event);
  if (!copied.ok()) {
    FailLocked(request,
               absl::Status(
                   copied.status().code(),
                   absl::StrCat(What(request), ": the copy failed: ", copied.status().message())));
    return;
  }
  if (!*copied) return;
  free_events_.push_back(request.copy_event);
  request.copy_event = nullptr;
  request.done = true;
  SendAckLocked(request, /*size_mismatch=*/false);
}

absl::Status CudaIpcTransport::Impl::StartCopyLocked(Request& request) {
  const Descriptor& d = request.wire->descriptor;
  if (d.magic != kDescriptorMagic || d.bytes < 0) {
    return absl::InternalError(absl::StrCat(What(request), ": malformed descriptor"));
  }
  if (d.bytes != request.bytes) {
    SendAckLocked(request, /*size_mismatch=*/true);
    return absl::InvalidArgumentError(absl::StrCat(What(request), ": the message has ", d.bytes,
                                                   " bytes and the receive ", request.bytes,
                                                   " bytes"));
  }
  // From here on the size is the receive's (the plan's), never the descriptor's.
  const int64_t bytes = request.bytes;
  if (bytes == 0) {
    request.done = true;
    SendAckLocked(request, /*size_mismatch=*/false);
    return absl::OkStatus();
  }
  WSYNC_RETURN_IF_ERROR(api_->SetDevice(options_.device));
  const char* source = nullptr;
  // A peer in this OS process (a self-send; threads standing in for processes) is read at its own
  // address: CUDA cannot open an IPC handle in the process that made it. The same OS process means
  // the same pid in the same pid namespace of the same boot, and the address must be a send a
  // transport of this process posted to this receiver with this tag and size.
  const uint64_t own_namespace = OwnPidNamespace();
  const bool same_os_process = request.peer == options_.process ||
                               (d.sender_pid == getpid() && own_namespace != 0 &&
                                d.sender_namespace == own_namespace && !api_->OpensOwnIpcHandles());
  if (same_os_process) {
    const MessageTag descriptor_tag =
        MakeTag(TagSync(request.tag), TagRound(request.tag), request.peer);
    if (!LiveSends::Get().Contains(LiveSends::Key{request.peer, options_.process,
                                                  descriptor_tag.value, d.source_address, bytes})) {
      return absl::PermissionDeniedError(absl::StrCat(
          What(request), ": the descriptor names memory of this OS process at ",
          absl::Hex(d.source_address), " that no send to this receiver posted; refused"));
    }
    source = reinterpret_cast<const char*>(static_cast<uintptr_t>(d.source_address));
  } else {
    absl::StatusOr<Mapping> mapped =
        MappingLocked(std::string(d.handle, sizeof(d.handle)), TagSync(request.tag));
    if (!mapped.ok()) {
      return absl::Status(mapped.status().code(),
                          absl::StrCat(What(request), ": cannot open the sender's allocation: ",
                                       mapped.status().message()));
    }
    if (d.offset < 0 || d.offset > mapped->bytes - bytes) {
      return absl::PermissionDeniedError(
          absl::StrCat(What(request), ": the descriptor's offset ", d.offset, " and the receive's ",
                       bytes, " bytes reach past the sender's allocation of ", mapped->bytes,
                       " bytes (as the driver maps it); refused"));
    }
    source = mapped->base + d.offset;
  }
  WSYNC_ASSIGN_OR_RETURN(CudaEvent event, TakeEventLocked());
  absl::Status issued =
      api_->MemcpyAsync(request.data, source, static_cast<size_t>(bytes), stream_);
  if (issued.ok()) issued = api_->EventRecord(event, stream_);
  if (!issued.ok()) {
    // Nothing recorded after a failed copy: the event stays out of the pool.
    api_->EventDestroy(event).IgnoreError();
    return absl::Status(
        issued.code(),
        absl::StrCat(What(request), ": issuing the copy failed: ", issued.message()));
  }
  request.copy_event = event;
  return absl::OkStatus();
}

absl::StatusOr<CudaIpcTransport::Impl::Mapping> CudaIpcTransport::Impl::MappingLocked(
    const std::string& handle, uint64_t sync) {
  auto it = mappings_.find(handle);
  if (it == mappings_.end()) {
    WSYNC_ASSIGN_OR_RETURN(void* mapped, api_->IpcOpenMemHandle(handle));
    // The mapping's size from the driver: the descriptor's allocation size is not trusted.
    absl::StatusOr<NcclApi::Allocation> range = api_->AllocationRange(mapped);
    if (!range.ok() || range->base != mapped) {
      api_->IpcCloseMemHandle(mapped).IgnoreError();
      return range.ok() ? absl::InternalError("the mapped allocation does not start at its base")
                        : range.status();
    }
    it = mappings_
             .emplace(handle,
                      Mapping{static_cast<char*>(mapped), static_cast<int64_t>(range->bytes), sync})
             .first;
  }
  it->second.last_sync = sync;
  return it->second;
}

int64_t CudaIpcTransport::Impl::DiscardStaleMessages(uint64_t sync_id) {
  absl::MutexLock lock(&mu_);
  bool copying = false;
  for (const auto& [id, request] : requests_) copying |= request.copy_event != nullptr;
  if (!copying) {
    // A sender's allocation that neither this sync nor the one before copied from is closed: a
    // sender that freed it (and maybe allocated anew) gets its memory back.
    for (auto it = mappings_.begin(); it != mappings_.end();) {
      const uint64_t behind = ((sync_id & 0xffffffu) - it->second.last_sync) & 0xffffffu;
      if (behind < 2) {
        ++it;
        continue;
      }
      api_->IpcCloseMemHandle(it->second.base).IgnoreError();
      it = mappings_.erase(it);
    }
  }
  return messenger_->DiscardStaleMessages(sync_id);
}

absl::StatusOr<CudaEvent> CudaIpcTransport::Impl::TakeEventLocked() {
  if (free_events_.empty()) return api_->EventCreate();
  CudaEvent event = free_events_.back();
  free_events_.pop_back();
  return event;
}

void CudaIpcTransport::Impl::SendAckLocked(const Request& request, bool size_mismatch) {
  auto ack = std::make_unique<Ack>();
  ack->size_mismatch = size_mismatch ? 1 : 0;
  ack->receive_bytes = request.bytes;
  const MessageTag ack_tag =
      MakeTag(TagSync(request.tag) ^ kAckSyncBit, TagRound(request.tag), options_.process);
  absl::StatusOr<RequestId> sent =
      messenger_->PostSend(request.peer, ack_tag, ack.get(), sizeof(Ack));
  // A refused acknowledgement (the peer is lost, or this transport aborted) leaves the sender to
  // its own deadline or peer loss.
  if (sent.ok()) pending_acks_.push_back(PendingAck{*sent, std::move(ack)});
}

void CudaIpcTransport::Impl::FailLocked(Request& request, const absl::Status& status) {
  if (request.failure.ok()) request.failure = status;
}

absl::StatusOr<bool> CudaIpcTransport::Impl::StateLocked(const Request& request) const {
  if (!request.failure.ok()) return request.failure;
  if (request.done) return true;
  if (!failure_.ok()) return failure_;
  return false;
}

void CudaIpcTransport::Impl::CancelMessengerLocked(std::vector<RequestId> ids) {
  ids.erase(std::remove(ids.begin(), ids.end(), RequestId{0}), ids.end());
  if (!ids.empty()) messenger_->WaitAll(ids, absl::InfinitePast()).IgnoreError();
}

void CudaIpcTransport::Impl::AwaitCopyLocked(CudaEvent event) {
  absl::Duration pause = absl::ZeroDuration();
  while (true) {
    absl::StatusOr<bool> copied = api_->EventQuery(event);
    if (!copied.ok() || *copied) break;
    PauseLocked(pause);
  }
}

void CudaIpcTransport::Impl::ReleaseLocked(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& request = it->second;
  // A send's descriptor that did not complete may still be read by the messenger (after a cancel
  // or a failure) until the messenger is destroyed.
  const bool keep_wire = request.direction == Direction::kSend && !request.descriptor_sent;
  CancelMessengerLocked({request.descriptor_request, request.ack_request});
  if (request.copy_event != nullptr) {
    AwaitCopyLocked(request.copy_event);
    free_events_.push_back(request.copy_event);
  }
  if (request.live_send) LiveSends::Get().Remove(*request.live_send);
  if (keep_wire) cancelled_wires_.push_back(std::move(request.wire));
  requests_.erase(it);
}

void CudaIpcTransport::Impl::PauseLocked(absl::Duration& pause) {
  pause = std::min(pause + absl::Microseconds(10), options_.max_poll_pause);
  mu_.Unlock();
  absl::SleepFor(pause);
  mu_.Lock();
}

std::string CudaIpcTransport::Impl::DescribeLocked(absl::Span<const RequestId> ids) const {
  std::vector<std::string> parts;
  for (RequestId id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    const Request& r = it->second;
    std::string part = absl::StrCat(
        "process ", r.peer,
        r.direction == Direction::kSend
            ? (r.descriptor_request != 0 ? " (send: descriptor not delivered)"
                                         : " (send: not acknowledged)")
            : (r.copy_event != nullptr ? " (receive: copying)" : " (receive: no descriptor)"));
    if (std::find(parts.begin(), parts.end(), part) == parts.end()) parts.push_back(part);
  }
  return parts.empty() ? "no peer" : absl::StrJoin(parts, ", ");
}

absl::StatusOr<bool> CudaIpcTransport::Impl::Test(RequestId id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request ", id));
  ProgressLocked();
  absl::StatusOr<bool> state = StateLocked(it->second);
  if (!state.ok() || *state) ReleaseLocked(id);
  return state;
}

absl::Status CudaIpcTransport::Impl::WaitAll(absl::Span<const RequestId> requests,
                                             absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  absl::Status status;
  std::vector<RequestId> pending;
  for (RequestId id : requests) {
    if (requests_.count(id) == 0) {
      status.Update(absl::NotFoundError(absl::StrCat("no request ", id)));
    } else if (std::find(pending.begin(), pending.end(), id) == pending.end()) {
      pending.push_back(id);
    }
  }
  absl::Status wait;
  absl::Duration pause = absl::ZeroDuration();
  while (!pending.empty()) {
    ProgressLocked();
    std::vector<RequestId> left;
    for (RequestId id : pending) {
      absl::StatusOr<bool> state = StateLocked(requests_.at(id));
      if (!state.ok()) {
        wait.Update(state.status());
        ReleaseLocked(id);
      } else if (*state) {
        ReleaseLocked(id);
      } else {
        left.push_back(id);
      }
    }
    pending = std::move(left);
    if (!wait.ok() || pending.empty()) break;
    if (absl::Now() >= deadline) {
      wait = absl::DeadlineExceededError(
          absl::StrCat("CUDA IPC requests with ", DescribeLocked(pending), " missed the deadline"));
      break;
    }
    PauseLocked(pause);
  }
  for (RequestId id : pending) ReleaseLocked(id);
  status.Update(wait);
  return status;
}

absl::Status CudaIpcTransport::Impl::WaitAny(absl::Span<const RequestId> requests,
                                             absl::Time deadline, std::vector<size_t>* finished) {
  absl::MutexLock lock(&mu_);
  absl::Duration pause = absl::ZeroDuration();
  while (true) {
    ProgressLocked();
    absl::Status first_error;
    bool any = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto it = requests_.find(requests[i]);
      absl::StatusOr<bool> state =
          it == requests_.end()
              ? absl::StatusOr<bool>(absl::NotFoundError(absl::StrCat("no request ", requests[i])))
              : StateLocked(it->second);
      if (state.ok() && !*state) continue;
      any = true;
      finished->push_back(i);
      if (!state.ok()) first_error.Update(state.status());
      if (it != requests_.end()) ReleaseLocked(requests[i]);
    }
    if (any) return first_error;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "CUDA IPC requests with ", DescribeLocked(requests), " missed the deadline"));
    }
    PauseLocked(pause);
  }
}

void CudaIpcTransport::Impl::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) {
      failure_ = absl::AbortedError(absl::StrCat("CUDA IPC transport of process ", options_.process,
                                                 " aborted: ", reason.message()));
    }
  }
  messenger_->Abort(reason);
}

// --- CudaIpcTransport ---

absl::StatusOr<std::unique_ptr<CudaIpcTransport>> CudaIpcTransport::Create(
    CudaIpcOptions options, std::unique_ptr<NcclApi> api, std::unique_ptr<Transport> messenger) {
  if (api == nullptr || messenger == nullptr) {
    return absl::InvalidArgumentError("the CUDA IPC transport needs an NcclApi and a messenger");
  }
  auto impl = std::make_unique<Impl>(options, std::move(api), std::move(messenger));
  WSYNC_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<CudaIpcTransport>(new CudaIpcTransport(std::move(impl)));
}

CudaIpcTransport::CudaIpcTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaIpcTransport::~CudaIpcTransport() = default;

int32_t CudaIpcTransport::process() const { return impl_->process(); }
Transport& CudaIpcTransport::messenger() { return impl_->messenger(); }

absl::StatusOr<RegistrationId> CudaIpcTransport::RegisterMemory(void* address, int64_t bytes,
                                                                MemoryKind kind) {
  return impl_->RegisterMemory(address, bytes, kind);
}
absl::Status CudaIpcTransport::DeregisterMemory(RegistrationId id) {
  return impl_->DeregisterMemory(id);
}
absl::StatusOr<RequestId> CudaIpcTransport::PostSend(int32_t peer, MessageTag tag, const void* data,
                                                     int64_t bytes) {
  return impl_->PostSend(peer, tag, data, bytes);
}
absl::StatusOr<RequestId> CudaIpcTransport::PostReceive(int32_t peer, MessageTag tag, void* data,
                                                        int64_t bytes) {
  return impl_->PostReceive(peer, tag, data, bytes);
}
absl::StatusOr<bool> CudaIpcTransport::Test(RequestId request) { return impl_->Test(request); }
absl::Status CudaIpcTransport::WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) {
  return impl_->WaitAll(requests, deadline);
}
absl::Status CudaIpcTransport::WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                                       std::vector<size_t>* finished) {
  return impl_->WaitAny(requests, deadline, finished);
}
void CudaIpcTransport::Abort(const absl::Status& reason) { impl_->Abort(reason); }
void CudaIpcTransport::PeerLost(int32_t peer, const absl::Status& reason) {
  impl_->messenger().PeerLost(peer, reason);
}
int64_t CudaIpcTransport::DiscardStaleMessages(uint64_t sync_id) {
  return impl_->DiscardStaleMessages(sync_id);
}

}  // namespace wsync
