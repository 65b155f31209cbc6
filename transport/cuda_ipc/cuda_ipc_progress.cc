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
#include "transport/cuda_ipc/cuda_ipc_transport.h"

namespace wsync {

using cuda_ipc_internal::kAckMagic;
using cuda_ipc_internal::kAckSyncBit;
using cuda_ipc_internal::kDescriptorMagic;
using cuda_ipc_internal::TagRound;
using cuda_ipc_internal::TagSync;

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

}  // namespace wsync
