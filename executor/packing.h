#ifndef WSYNC_EXECUTOR_PACKING_H_
#define WSYNC_EXECUTOR_PACKING_H_

// Private to the executor: the copies that move a staged message's bytes between this process's
// buffers and the message's arena slot, and the strided copies under them.
//
// - Packing a staged send gathers its chunks (work.h: Message::chunks, in that order) from their
//   segments' source endpoints into the slot, each chunk row-major, one after the other.
// - Unpacking a received staged message scatters its slot, laid out the same way, into its chunks'
//   target endpoints.
// - Copy is one strided copy between two memory kinds (the run's local copies use it too).
//
// Host-to-host copies are appended to the caller's batch (to run as one CopyStridedBatch pass,
// which may interleave copies whose rows line up) or, for Copy, run at once. A copy touching CUDA
// memory is enqueued on the device at once and stays pending until Synchronize: a slot packed that
// way may be sent, and a target unpacked that way read, only after it. The sender's quantization
// steps (quant_run.h) enqueue device work of their own and mark it pending through
// device_pending(). Direct messages and delta-encoded ones (delta_run.h) have nothing to pack or
// unpack: the caller leaves them out.
//
// Errors: only the device's (CopyStridedAsync, Synchronize). Ownership: borrows the work, the
// segments and the device, which outlive it; endpoint addresses come from the caller's resolver
// (the run's buffers and arenas). Not thread-safe: the run's thread only.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/copy.h"
#include "executor/work.h"
#include "planner/plan.h"
#include "transport/device_memory.h"

namespace wsync::executor_internal {

// Where element `offset` (in elements of `element_size` bytes) of endpoint `end`'s buffer lies in
// this process's memory.
using EndpointAddress =
    std::function<char*(const Endpoint& end, int64_t offset, int64_t element_size)>;

class MessagePacker {
 public:
  // `device`: where copies touching CUDA memory go; may be null when no buffer, arena or chunk of
  // the work is CUDA memory.
  MessagePacker(const Work& work, absl::Span<const Segment> segments, EndpointAddress address,
                DeviceMemory* device);
  MessagePacker(const MessagePacker&) = delete;
  MessagePacker& operator=(const MessagePacker&) = delete;

  // Packs staged send `message` of `lane` into `slot` (its arena slot, in lane.kind memory, at
  // least message.bytes): host-to-host copies appended to `host_batch`, the others enqueued.
  absl::Status AppendPack(const Lane& lane, const Message& message, char* slot,
                          std::vector<StridedCopy>& host_batch);
  // Unpacks received staged `message` of `lane` from `slot` into its chunks' targets, as
  // AppendPack does in the other direction.
  absl::Status AppendUnpack(const Lane& lane, const Message& message, const char* slot,
                            std::vector<StridedCopy>& host_batch);
  // One strided copy of `shape` elements: at once when both sides are host memory, else enqueued.
  absl::Status Copy(void* dst, MemoryKind dst_kind, const Dims& dst_strides, const void* src,
                    MemoryKind src_kind, const Dims& src_strides, const Dims& shape,
                    int64_t element_size);
  // Waits until `deadline` for the device copies enqueued since the last call (none: returns at
  // once, without a device call).
  absl::Status Synchronize(absl::Time deadline);
  // Whether device work is pending; those who enqueue their own set it (QuantSteps).
  bool& device_pending() { return device_pending_; }

 private:
  // Appends `copy` to `host_batch` when both sides are host memory, else enqueues it.
  absl::Status CopyOrBatch(const StridedCopy& copy, MemoryKind dst_kind, MemoryKind src_kind,
                           std::vector<StridedCopy>& host_batch);

  const Work& work_;
  absl::Span<const Segment> segments_;
  EndpointAddress address_;
  DeviceMemory* device_;
  bool device_pending_ = false;  // Device copies enqueued since the last Synchronize.
};

}  // namespace wsync::executor_internal

#endif  // WSYNC_EXECUTOR_PACKING_H_
