#ifndef WSYNC_INTEGRATION_SIMULATION_SIMGRID_SIMGRID_TRANSPORT_H_
#define WSYNC_INTEGRATION_SIMULATION_SIMGRID_SIMGRID_TRANSPORT_H_

// A Transport, Group and DeviceMemory whose operations are SimGrid activities: each process of a
// job runs as a SimGrid S4U actor, its messages are SimGrid communications of the posted sizes
// through mailboxes keyed by (receiver, tag) (the tag names the sender, so this is one mailbox
// per (sender, receiver, tag)), and no payload byte moves. Time is SimGrid's simulated clock:
// every wait is a SimGrid wait and every deadline is read in simulated time (SimulatedNow).
//
// Threading: SimGrid runs every actor cooperatively in one OS thread; every object here is used
// only from actors of one running s4u::Engine (or from the thread that runs it), never from
// another thread. The SimFabric outlives every transport, group and device made from it.
//
// Memory: PostSend / PostReceive never read or write `data`; VirtualDeviceMemory hands out
// addresses that are never mapped. A job runs over these only when every byte it touches is
// device memory (the executor then copies through the DeviceMemory alone), so a model of any
// size runs without its bytes.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/device_memory.h"
#include "transport/transport.h"

namespace wsync::simgrid_backend {

// Simulated time as an absl::Time: the Unix epoch plus SimGrid's clock. Deadlines given to the
// objects below are in this time; absl::InfiniteFuture never passes.
absl::Time SimulatedNow();
// Seconds of SimGrid's clock at `time` (+inf for absl::InfiniteFuture).
double SimulatedSeconds(absl::Time time);

// One message that completed: `bytes` moved from process `from` to process `to`.
struct DeliveredMessage {
  int32_t from = 0;
  int32_t to = 0;
  int64_t bytes = 0;
  friend bool operator==(const DeliveredMessage&, const DeliveredMessage&) = default;
  friend auto operator<=>(const DeliveredMessage&, const DeliveredMessage&) = default;
};

// What every process of one simulation shares: the message log and the group's rounds. Made in
// the engine's thread before the engine runs (not inside an actor).
class SimFabric {
 public:
  // `record_messages`: keep every delivered message (DeliveredMessage) besides the per-process
  // totals, for tests.
  SimFabric(int32_t processes, bool record_messages);
  ~SimFabric();
  SimFabric(const SimFabric&) = delete;
  SimFabric& operator=(const SimFabric&) = delete;

  int32_t processes() const { return processes_; }
  // Every delivered message, in delivery order (empty unless record_messages).
  const std::vector<DeliveredMessage>& delivered() const { return delivered_; }
  // Bytes delivered, by sending and by receiving process.
  const std::vector<int64_t>& sent_bytes() const { return sent_bytes_; }
  const std::vector<int64_t>& received_bytes() const { return received_bytes_; }
  int64_t messages() const { return messages_; }

 private:
  friend class SimGridTransport;
  friend class SimGridGroup;
  struct Envelope;
  struct GroupState;

  Envelope* NewEnvelope(int32_t from, int64_t bytes);
  void Deliver(int32_t from, int32_t to, int64_t bytes);

  const int32_t processes_;
  const bool record_messages_;
  std::deque<Envelope> envelopes_;  // Stable addresses: a message's payload is a pointer to one.
  std::vector<DeliveredMessage> delivered_;
  std::vector<int64_t> sent_bytes_;
  std::vector<int64_t> received_bytes_;
  int64_t messages_ = 0;
  std::unique_ptr<GroupState> group_;
};

// The Transport of one process (one actor). Sends and receives are rendezvous communications
// (a message starts moving once both sides posted it) between the hosts of the two processes;
// a receive whose message has another size fails with both sizes once it completed; Abort and
// PeerLost cancel every outstanding request of this endpoint. Messages of one (sender, receiver,
// tag) complete in posting order.
class SimGridTransport final : public Transport {
 public:
  // `needs_round_order`: what NeedsRoundOrder answers (true: the executor runs lockstep rounds,
  // as over NCCL, which GPU clusters use between nodes).
  SimGridTransport(SimFabric& fabric, int32_t process, bool needs_round_order);
  ~SimGridTransport() override;

  int32_t process() const override { return process_; }
  std::string name() const override { return "simgrid"; }
  absl::StatusOr<RegistrationId> RegisterMemory(void* address, int64_t bytes,
                                                MemoryKind kind) override;
  absl::Status DeregisterMemory(RegistrationId id) override;
  absl::StatusOr<RequestId> PostSend(int32_t peer, MessageTag tag, const void* data,
                                     int64_t bytes) override;
  absl::StatusOr<RequestId> PostReceive(int32_t peer, MessageTag tag, void* data,
                                        int64_t bytes) override;
  absl::StatusOr<bool> Test(RequestId request) override;
  absl::Status WaitAll(absl::Span<const RequestId> requests, absl::Time deadline) override;
  absl::Status WaitAny(absl::Span<const RequestId> requests, absl::Time deadline,
                       std::vector<size_t>* finished) override;
  bool NeedsRoundOrder() const override { return needs_round_order_; }
  void Abort(const absl::Status& reason) override;

 private:
  struct Request;
  absl::StatusOr<RequestId> Post(int32_t peer, MessageTag tag, int64_t bytes, bool send);
  // The request's outcome once its communication finished (it is then released).
  absl::Status Finish(RequestId id, Request& request);
  void Cancel(RequestId id);

  SimFabric& fabric_;
  const int32_t process_;
  const bool needs_round_order_;
  absl::Status aborted_;
  RequestId next_request_ = 1;
  RegistrationId next_registration_ = 1;
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_;
};

// The Group of one process: AllGather completes when every process contributed to the same
// numbered round, in zero simulated time (the control plane's cost is not simulated); at the
// deadline DeadlineExceeded names the processes that did not contribute.
class SimGridGroup final : public Group {
 public:
  SimGridGroup(SimFabric& fabric, int32_t process);
  int32_t process() const override { return process_; }
  int32_t size() const override;
  absl::StatusOr<std::vector<std::string>> AllGather(absl::string_view payload,
                                                     absl::Time deadline) override;

 private:
  SimFabric& fabric_;
  const int32_t process_;
  int64_t next_round_ = 0;
};

// Device memory that holds nothing: Allocate returns distinct unmapped addresses, copies touch
// no memory and take bytes / copy_bytes_per_second of simulated time each, one after the other
// on one stream per object; Synchronize waits in simulated time until the stream is idle.
class VirtualDeviceMemory final : public DeviceMemory {
 public:
  explicit VirtualDeviceMemory(double copy_bytes_per_second);
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t bytes) override;
  void Free(void* memory) override {}
  absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) override;
  absl::Status Synchronize(absl::Time deadline) override;
  // Keeps the stream busy for `seconds` more after what it holds (a simulated kernel, e.g. a
  // quantization): Synchronize then waits for it too. Negative or NaN counts as 0.
  void Occupy(double seconds);

  int64_t copied_bytes() const { return copied_bytes_; }
  int64_t allocated_bytes() const { return allocated_bytes_; }

 private:
  const double copy_bytes_per_second_;
  double stream_idle_at_ = 0;  // Simulated seconds.
  int64_t copied_bytes_ = 0;
  int64_t allocated_bytes_ = 0;
  uintptr_t next_address_;
};

// An address for buffer `index` of a process that is never mapped (for LocalBuffers of a job run
// over VirtualDeviceMemory): distinct per index, 1 TiB apart.
void* UnmappedBufferAddress(int64_t index);

}  // namespace wsync::simgrid_backend

#endif  // WSYNC_INTEGRATION_SIMULATION_SIMGRID_SIMGRID_TRANSPORT_H_
