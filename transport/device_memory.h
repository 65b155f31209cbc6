#ifndef WSYNC_TRANSPORT_DEVICE_MEMORY_H_
#define WSYNC_TRANSPORT_DEVICE_MEMORY_H_

// The device-memory operations the executor needs for buffers that are not host memory: staging
// arenas allocated on the device, and stream-ordered strided copies between any two memory kinds
// (pack, unpack, local copies). The executor calls only this interface; the plugin wires in an
// implementation (device/: CudaDeviceMemory over the CUDA runtime) when a process holds
// CUDA buffers, so the executor never includes a CUDA or NCCL header.
//
// Ordering: copies run in the order they were enqueued, asynchronously to the caller; Synchronize
// waits for all of them. A caller must Synchronize before handing a copy's destination to a
// transport (a send) and before reusing a copy's source (an arena slot about to be received into).
//
// Thread safety: one thread at a time (the executor's).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/memory_kind.h"
#include "quant/fp8_device.h"

namespace wsync {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // The memory kind Allocate returns (kCuda).
  virtual MemoryKind kind() const = 0;

  // `bytes` bytes of device memory, freed by Free. ResourceExhausted when the device has no room.
  virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  virtual void Free(void* memory) = 0;

  // Enqueues the copy of region `shape` (elements of `element_size` bytes, element strides on each
  // side) from `src` to `dst`; either side may be host or device memory. Regions must not overlap.
  virtual absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides,
                                        const void* src, absl::Span<const int64_t> src_strides,
                                        absl::Span<const int64_t> shape, int64_t element_size) = 0;

  // Waits until every copy enqueued so far has finished. DeadlineExceeded at `deadline` (the copies
  // may then still run: the caller must not free their memory before a later Synchronize succeeds
  // or the device is torn down).
  virtual absl::Status Synchronize(absl::Time deadline) = 0;

  // Whether QuantizeFp8Async runs (a build whose CUDA module has the FP8 kernels).
  virtual bool HasFp8Kernel() const { return false; }

  // Enqueues the FP8 quantization of `q` (quant/fp8_device.h; every pointer device memory), in
  // order with the copies. Its report word is meaningful after the next Synchronize (copy it to
  // the host first, also in order). InvalidArgument naming `parameter` for a request that fails
  // quant::CheckFp8DeviceQuant; Unimplemented when !HasFp8Kernel().
  virtual absl::Status QuantizeFp8Async(const quant::Fp8DeviceQuant& q,
                                        absl::string_view parameter) {
    return absl::UnimplementedError("this device memory has no FP8 quantization kernel");
  }
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_DEVICE_MEMORY_H_
