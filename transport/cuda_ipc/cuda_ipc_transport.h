#ifndef WSYNC_TRANSPORT_CUDA_IPC_CUDA_IPC_TRANSPORT_H_
#define WSYNC_TRANSPORT_CUDA_IPC_CUDA_IPC_TRANSPORT_H_

// A Transport for CUDA memory between processes of one node, over CUDA IPC: the receiver maps the
// sender's device allocation (cudaIpcOpenMemHandle) and copies from it on its own stream. It is
// what carries two processes that share one GPU (NCCL refuses two ranks on one device), and pairs
// on different GPUs of one node (the copy goes over NVLink / PCIe peer access).
//
// Protocol, per message (a pull): the sender's PostSend sends the receiver a descriptor (the IPC
// handle of the allocation holding `data`, the offset of `data` in it, `bytes`) over the
// messenger, a host-memory Transport to the same peers owned by this transport (a UCX worker of its
// own in the session). The receiver's PostReceive posts a receive for that descriptor; once it
// arrived, the receiver opens the handle (cached per handle, see Memory), checks the size,
// copies the bytes on its stream (MemcpyAsync), records an event, and when the event completed
// the receive completes and an acknowledgement goes back; the send completes when the
// acknowledgement arrived (so the sender's memory is not read after its send completed). A
// different size fails the receive with InvalidArgument naming the peer and both sizes, copies
// nothing, and the acknowledgement says so: the send fails likewise. Empty messages travel as
// descriptors and acknowledgements without a copy. Sends to self travel the same way, the
// descriptor carrying the address itself (no IPC handle); so does a peer in this OS process
// (threads standing in for processes: the descriptor names the sender's OS process, and CUDA
// cannot open a handle in the process that made it) unless the API opens its own handles (a
// fake's threads, NcclApi::OpensOwnIpcHandles). Nothing in a descriptor is trusted for memory
// safety: the copy's size is the receive's (the plan's); the offset must lie, with that size, in
// the mapped allocation as the driver reports it (AllocationRange of the mapping), not as the
// descriptor claims; "this OS process" needs an equal pid, pid namespace and boot id
// (OwnPidNamespace, common/process_identity.h), and an address read directly must be exactly a
// send that a transport of this OS process posted to this receiver with this tag and size and
// has not released. A descriptor failing these fails the receive with PermissionDenied. On the
// messenger the descriptor of a message of sync s and round r travels with tag (s, r, sender) and
// its acknowledgement with tag (s with bit 23 flipped, r, receiver): every round is usable (the
// executor's verification uses the last one, kMaxRounds - 1), and acknowledgements never meet
// descriptors or messages of a sync DiscardStaleMessages looks at (so a late acknowledgement nobody
// waits for is not discarded; it is 16 bytes). The caller's sender bits are replaced by the actual
// sender's. Receives of one peer with equal tags acknowledge in posting order, so equal-tag
// messages pair in order as the contract asks. Pairs advance on their own (NeedsRoundOrder is
// false).
//
// Memory: CUDA memory only (posts whose pointer CUDA reports as host memory, and RegisterMemory
// of host memory, are refused with Unimplemented). Any allocation made by cudaMalloc can be
// sent, registered or not: the allocation's base and size come from the driver
// (AllocationRange). A registered range's handle is made once, at RegisterMemory; a send outside
// registrations asks for its allocation's handle at each post (cudaIpcGetMemHandle is cheap, and
// a new allocation at a freed one's address gets a new handle, so nothing stale is sent). The
// receiver opens each distinct handle once and keeps it open while it is used: at a sync boundary
// (DiscardStaleMessages(sync_id), which the executor calls at the start and end of each run) with
// no copy in flight, handles that neither sync `sync_id` nor the one before copied from are
// closed, so that mappings of allocations a sender freed and replaced do not accumulate; the rest
// close at destruction. Limits: a sender must keep an allocation alive while a receiver may still
// have it mapped (CUDA leaves freeing an exported allocation before its importers closed it
// undefined): the session sends only from its weights and from device memory it keeps for the
// session (arenas and the verifier's hash area live in its ArenaCache); memory without a legacy
// IPC handle (cuMemCreate / VMM allocations, e.g. PyTorch's expandable segments) fails its post
// with CUDA's error. Ordering: the receiver's copy is not ordered after the sender's streams, so a
// sender's bytes must be complete (its device work synchronised) when it posts the send, as with
// NCCL on its own stream; a receive completes only after its copy finished on the device.
//
// Deadlines and failures: every wait polls the messenger and the events, so it returns by its
// deadline. A deadline or failure cancels the messenger's requests; a copy already issued is
// waited for (bounded by the copy itself, not by a peer) before the call returns, so receive memory
// is not written after its request was released. PeerLost, Abort and DiscardStaleMessages are
// forwarded to the messenger (DiscardStaleMessages after closing unused handles, above; a request
// waiting on the messenger then fails with its error; a receive whose copy was already issued
// still completes: its bytes are all in); Abort also fails every outstanding and later request
// of this transport (Aborted). The destructor gives acknowledgements already posted up to one
// second to leave, then cancels everything.
//
// Threads: as Transport: one driving thread; Abort and PeerLost from any thread.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/nccl/nccl_api.h"
#include "transport/transport.h"

namespace wsync {

struct CudaIpcOptions {
  // Global id of this process (the messenger's process too).
  int32_t process = 0;
  // CUDA device of this process's buffers.
  int device = 0;
  // Poll pause bound while waiting.
  absl::Duration max_poll_pause = absl::Microseconds(100);
};

class CudaIpcTransport final : public Transport {
 public:
  // Sets the device, creates the copy stream. `api` makes the CUDA calls (the CUDA module's real
  // one, or a test fake); `messenger` carries descriptors and acknowledgements (host memory) and
  // must have `options.process` as its process. InvalidArgument when it has another.
  static absl::StatusOr<std::unique_ptr<CudaIpcTransport>> Create(
      CudaIpcOptions options, std::unique_ptr<NcclApi> api, std::unique_ptr<Transport> messenger);
  ~CudaIpcTransport() override;

  int32_t process() const override;
  std::string name() const override { return "cuda_ipc"; }
  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override;
  absl::Status DeregisterMemory(RegistrationId id) override;
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override;
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override;
  absl::StatusOr<bool> Test(RequestId request) override;
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override;
  // One progress pass over every request per poll (the default would make one per request).
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished) override;
  void Abort(const absl::Status& reason) override;
  void PeerLost(int32_t peer, const absl::Status& reason) override;
  int64_t DiscardStaleMessages(uint64_t sync_id) override;

  // The host transport carrying descriptors (the session reconnects it when a peer is replaced).
  Transport& messenger();

 private:
  class Impl;
  explicit CudaIpcTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_CUDA_IPC_CUDA_IPC_TRANSPORT_H_
