#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/process_identity.h"
#include "common/status.h"
#include "transport/cuda_ipc/cuda_ipc_impl.h"

namespace wsync {

using cuda_ipc_internal::kAckMagic;
using cuda_ipc_internal::kAckSyncBit;
using cuda_ipc_internal::kDescriptorMagic;
using cuda_ipc_internal::TagRound;
using cuda_ipc_internal::TagSync;

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
