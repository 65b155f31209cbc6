#ifndef WSYNC_TRANSPORT_NCCL_NCCL_API_H_
#define WSYNC_TRANSPORT_NCCL_NCCL_API_H_

// The few NCCL and CUDA runtime calls the NCCL backend makes, behind a small interface so that the
// backend's bookkeeping (round grouping, tag order, deadlines, abort) is tested against a fake on
// machines without a GPU. This header does not include <nccl.h> or the CUDA headers: handles are
// opaque pointers and results are absl::Status. The real API (nccl_api_real.h, the only code that
// includes <nccl.h> and <cuda_runtime_api.h>) lives in the module libwsync_cuda.so, which links
// libcudart and libnccl; the rest of wsync reaches it through device/cuda_module.h
// (LoadRealNcclApi), so that a process maps the CUDA libraries only once it needs them.
//
// Non-blocking NCCL: communicators are created with config.blocking = 0, so NCCL calls return at
// once; a call whose work continues in the background returns "in progress" (false below), and
// CommAsyncError reports when it finished or failed. Every wait in the backend polls, so every
// wait honours a deadline.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/memory_kind.h"
#include "quant/fp8_device.h"

namespace wsync {

using NcclComm = void*;    // ncclComm_t
using CudaStream = void*;  // cudaStream_t
using CudaEvent = void*;   // cudaEvent_t

// ncclUniqueId: 128 opaque bytes made by one process and carried to the others by the control
// plane (Broadcast). Serialized as exactly these bytes.
struct NcclUniqueId {
  std::array<char, 128> bytes{};
  std::string ToBytes() const { return std::string(bytes.data(), bytes.size()); }
  // InvalidArgument unless `serialized` is exactly 128 bytes.
  static absl::StatusOr<NcclUniqueId> FromBytes(const std::string& serialized);
};

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // --- CUDA runtime ---
  // cudaGetDeviceCount; 0 (not an error) on a machine without a usable CUDA device or driver.
  virtual int DeviceCount() = 0;
  virtual absl::Status SetDevice(int device) = 0;
  // cudaMalloc / cudaFree on the current device (ResourceExhausted when it has no room).
  virtual absl::StatusOr<void*> Malloc(size_t bytes) = 0;
  virtual absl::Status Free(void* memory) = 0;
  // A non-blocking stream (cudaStreamNonBlocking) dedicated to the backend.
  virtual absl::StatusOr<CudaStream> StreamCreate() = 0;
  virtual absl::Status StreamDestroy(CudaStream stream) = 0;
  // An event without timing (cudaEventDisableTiming).
  virtual absl::StatusOr<CudaEvent> EventCreate() = 0;
  virtual absl::Status EventDestroy(CudaEvent event) = 0;
  virtual absl::Status EventRecord(CudaEvent event, CudaStream stream) = 0;
  // True once the work recorded before the event finished; false while it runs (cudaErrorNotReady).
  virtual absl::StatusOr<bool> EventQuery(CudaEvent event) = 0;
  // kCuda for device or managed memory, kHost otherwise (cudaPointerGetAttributes).
  virtual absl::StatusOr<MemoryKind> PointerKind(const void* pointer) = 0;
  // cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDefault, stream).
  virtual absl::Status Memcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                     size_t width, size_t height, CudaStream stream) = 0;
  // cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream): one contiguous copy of any size
  // (Memcpy2DAsync's pitch is bounded by the device's maximum pitch). The default is
  // Memcpy2DAsync with one row, for fakes.
  virtual absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CudaStream stream) {
    return Memcpy2DAsync(dst, bytes, src, bytes, bytes, 1, stream);
  }
  // The strided copy kernel (device/cuda_copy.h: CopyStridedKernelAsync) on `stream`, when this
  // API has one: the real API when nvcc built it, a fake that implements it on the host. The
  // defaults say there is none (cuda_copy then uses Memcpy2DAsync only).
  virtual bool HasCopyKernel() { return false; }
  virtual absl::Status CopyKernelAsync(void* dst, absl::Span<const int64_t> dst_strides,
                                       const void* src, absl::Span<const int64_t> src_strides,
                                       absl::Span<const int64_t> shape, int64_t element_size,
                                       CudaStream stream) {
    return absl::UnimplementedError("this NcclApi has no strided copy kernel");
  }
  // The FP8 quantization kernels (device/cuda_quant_kernel.h) on `stream`, when this API
  // has them: the real API when nvcc built them, a fake that runs their host emulation
  // (quant/fp8_device_host.h). `q` passed quant::CheckFp8DeviceQuant; its pointers are device
  // memory. The defaults say there are none.
  virtual bool HasQuantKernel() { return false; }
  virtual absl::Status QuantizeFp8Async(const quant::Fp8DeviceQuant& q, CudaStream stream) {
    return absl::UnimplementedError("this NcclApi has no FP8 quantization kernel");
  }

  // --- CUDA IPC (transport/cuda_ipc) ---
  // The defaults say this API has none (Unimplemented).
  // The cudaMalloc allocation holding `pointer` (the driver's cuMemGetAddressRange, reached
  // through the runtime's driver entry point so that nothing links libcuda).
  struct Allocation {
    void* base = nullptr;
    size_t bytes = 0;
  };
  virtual absl::StatusOr<Allocation> AllocationRange(const void* pointer) {
    return absl::UnimplementedError("this NcclApi has no CUDA IPC");
  }
  // cudaIpcGetMemHandle of the allocation starting at `allocation_base`: kIpcHandleBytes opaque
  // bytes another process of the node opens with IpcOpenMemHandle. A new allocation at a freed
  // one's address gets a different handle.
  static constexpr size_t kIpcHandleBytes = 64;
  virtual absl::StatusOr<std::string> IpcGetMemHandle(void* allocation_base) {
    return absl::UnimplementedError("this NcclApi has no CUDA IPC");
  }
  // cudaIpcOpenMemHandle (cudaIpcMemLazyEnablePeerAccess) of a handle from another process: the
  // allocation's base as mapped in this process (on the current device's context). Opening a
  // handle of this process itself fails. Each successful open is closed with IpcCloseMemHandle.
  virtual absl::StatusOr<void*> IpcOpenMemHandle(const std::string& handle) {
    return absl::UnimplementedError("this NcclApi has no CUDA IPC");
  }
  // Whether IpcOpenMemHandle opens handles this OS process made (CUDA: no; a fake whose threads
  // stand in for processes may). When not, the CUDA IPC transport reads a peer of its own OS
  // process at the peer's address.
  virtual bool OpensOwnIpcHandles() const { return false; }
  virtual absl::Status IpcCloseMemHandle(void* mapped_base) {
    return absl::UnimplementedError("this NcclApi has no CUDA IPC");
  }
  // The 16-byte UUID of CUDA device `device` (cudaGetDeviceProperties): equal in two processes
  // exactly when they use the same GPU.
  virtual absl::StatusOr<std::string> DeviceUuid(int device) {
    return absl::UnimplementedError("this NcclApi cannot tell device UUIDs");
  }

  // --- NCCL ---
  virtual absl::StatusOr<NcclUniqueId> GetUniqueId() = 0;
  // ncclCommInitRankConfig with config.blocking = 0. Returns the communicator at once; it is ready
  // once CommAsyncError returns true.
  virtual absl::StatusOr<NcclComm> CommInitRank(int nranks, const NcclUniqueId& id, int rank) = 0;
  // ncclCommGetAsyncError: true when the communicator is idle and healthy (ncclSuccess), false
  // while an operation is in progress (ncclInProgress), the error otherwise.
  virtual absl::StatusOr<bool> CommAsyncError(NcclComm comm) = 0;
  virtual absl::Status CommAbort(NcclComm comm) = 0;
  virtual absl::Status CommDestroy(NcclComm comm) = 0;
  virtual absl::StatusOr<void*> CommRegister(NcclComm comm, void* buffer, size_t bytes) = 0;
  virtual absl::Status CommDeregister(NcclComm comm, void* handle) = 0;
  virtual absl::Status GroupStart() = 0;
  // ncclGroupEnd: true when the group's operations are enqueued on their streams, false while a
  // non-blocking communicator is still enqueuing them (poll CommAsyncError until true).
  virtual absl::StatusOr<bool> GroupEnd() = 0;
  // ncclSend / ncclRecv of `bytes` bytes (ncclUint8) with the communicator rank `peer`.
  virtual absl::Status Send(const void* data, size_t bytes, int peer, NcclComm comm,
                            CudaStream stream) = 0;
  virtual absl::Status Recv(void* data, size_t bytes, int peer, NcclComm comm,
                            CudaStream stream) = 0;
};

}  // namespace wsync

#endif  // WSYNC_TRANSPORT_NCCL_NCCL_API_H_
