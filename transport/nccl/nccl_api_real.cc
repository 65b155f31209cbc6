// The only file of wsync that includes <nccl.h> and the CUDA runtime header (see nccl_api_real.h).

#include "transport/nccl/nccl_api_real.h"

#include <cuda.h>  // Driver types only: cuMemGetAddressRange is reached through the runtime.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "device/cuda_copy_kernel.h"
#include "device/cuda_quant_kernel.h"

namespace wsync {
namespace {

absl::Status CudaError(cudaError_t error, const char* call) {
  return absl::InternalError(absl::StrCat(call, " failed: ", cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

#define WSYNC_CUDA_CALL(call)                    \
  do {                                           \
    const cudaError_t wsync_cuda_error = (call); \
    if (wsync_cuda_error != cudaSuccess) {       \
      return CudaError(wsync_cuda_error, #call); \
    }                                            \
  } while (false)

absl::Status NcclError(ncclResult_t result, const char* call, ncclComm_t comm = nullptr) {
  std::string detail = ncclGetErrorString(result);
  if (const char* last = ncclGetLastError(comm); last != nullptr && last[0] != '\0') {
    absl::StrAppend(&detail, ": ", last);
  }
  // Remote and system errors are how a lost peer shows; the caller names the peers involved.
  const absl::StatusCode code = result == ncclRemoteError || result == ncclSystemError
                                    ? absl::StatusCode::kUnavailable
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(call, " failed: ", detail));
}

// ncclSuccess → true, ncclInProgress → false, anything else → error.
absl::StatusOr<bool> NcclProgress(ncclResult_t result, const char* call, ncclComm_t comm) {
  if (result == ncclSuccess) return true;
  if (result == ncclInProgress) return false;
  return NcclError(result, call, comm);
}

// One launch of the strided copy kernel (device/cuda_copy_kernel.cu) for any geometry;
// Unimplemented in a build without it (nvcc not found at configure time).
absl::Status CopyStridedKernelAsync(CudaStream stream, void* dst,
                                    absl::Span<const int64_t> dst_strides, const void* src,
                                    absl::Span<const int64_t> src_strides,
                                    absl::Span<const int64_t> shape, int64_t element_size) {
#ifdef WSYNC_CUDA_KERNELS
  if (dst_strides.size() != shape.size() || src_strides.size() != shape.size() ||
      shape.size() > static_cast<size_t>(kMaxKernelAxes)) {
    return absl::InvalidArgumentError(absl::StrCat("strided copy kernel: ", shape.size(),
                                                   " axes with ", dst_strides.size(), " and ",
                                                   src_strides.size(), " strides"));
  }
  if (element_size != 1 && element_size != 2 && element_size != 4 && element_size != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("strided copy kernel: element size ", element_size, " is not 1, 2, 4 or 8"));
  }
  const int error =
      LaunchStridedCopy(dst, dst_strides.data(), src, src_strides.data(), shape.data(),
                        static_cast<int>(shape.size()), element_size, stream);
  if (error != 0) {
    return CudaError(static_cast<cudaError_t>(error), "strided copy kernel launch");
  }
  return absl::OkStatus();
#else
  return absl::UnimplementedError("this build has no CUDA copy kernels (nvcc was not found)");
#endif
}

// cuMemGetAddressRange (v2) from the driver the runtime loaded, found once; nullptr when the
// driver does not provide it. Linking libcuda would put it in the module's DT_NEEDED.
using GetAddressRangeFunction = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
GetAddressRangeFunction DriverGetAddressRange() {
  static GetAddressRangeFunction function = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
    // Version 12000 selects the v2 ABI (64-bit CUdeviceptr, size_t size).
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &found, 12000, cudaEnableDefault,
                                         &result) == cudaSuccess &&
        result == cudaDriverEntryPointSuccess) {
      function = reinterpret_cast<GetAddressRangeFunction>(found);
    } else {
      cudaGetLastError();
    }
  });
  return function;
}

class RealNcclApi final : public NcclApi {
 public:
  absl::StatusOr<Allocation> AllocationRange(const void* pointer) override {
    GetAddressRangeFunction get_range = DriverGetAddressRange();
    if (get_range == nullptr) {
      return absl::UnimplementedError("the CUDA driver provides no cuMemGetAddressRange");
    }
    CUdeviceptr base = 0;
    size_t bytes = 0;
    if (CUresult r = get_range(&base, &bytes, reinterpret_cast<CUdeviceptr>(pointer));
        r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuMemGetAddressRange failed with CUresult ", static_cast<int>(r),
                       ": the pointer is not in a cudaMalloc allocation of the current context"));
    }
    return Allocation{reinterpret_cast<void*>(base), bytes};
  }
  absl::StatusOr<std::string> IpcGetMemHandle(void* allocation_base) override {
    cudaIpcMemHandle_t handle;
    WSYNC_CUDA_CALL(cudaIpcGetMemHandle(&handle, allocation_base));
    static_assert(sizeof(handle.reserved) == kIpcHandleBytes);
    return std::string(handle.reserved, sizeof(handle.reserved));
  }
  absl::StatusOr<void*> IpcOpenMemHandle(const std::string& bytes) override {
    cudaIpcMemHandle_t handle;
    if (bytes.size() != sizeof(handle.reserved)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a CUDA IPC handle has ", sizeof(handle.reserved), " bytes, not ", bytes.size()));
    }
    std::memcpy(handle.reserved, bytes.data(), bytes.size());
    void* mapped = nullptr;
    WSYNC_CUDA_CALL(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess));
    return mapped;
  }
  absl::Status IpcCloseMemHandle(void* mapped_base) override {
    WSYNC_CUDA_CALL(cudaIpcCloseMemHandle(mapped_base));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> DeviceUuid(int device) override {
    cudaDeviceProp properties;
    std::memset(&properties, 0, sizeof(properties));
    WSYNC_CUDA_CALL(cudaGetDeviceProperties(&properties, device));
    static_assert(sizeof(properties.uuid.bytes) == 16);
    return std::string(properties.uuid.bytes, sizeof(properties.uuid.bytes));
  }

  int DeviceCount() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // Clears the sticky "no device" error for later calls.
      return 0;
    }
    return count;
  }
  absl::StatusOr<void*> Malloc(size_t bytes) override {
    void* memory = nullptr;
    const cudaError_t error = cudaMalloc(&memory, bytes);
    if (error == cudaErrorMemoryAllocation) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of ", bytes, " bytes: the device has no room"));
    }
    if (error != cudaSuccess) return CudaError(error, "cudaMalloc");
    return memory;
  }
  absl::Status Free(void* memory) override {
    WSYNC_CUDA_CALL(cudaFree(memory));
    return absl::OkStatus();
  }
  absl::Status SetDevice(int device) override {
    WSYNC_CUDA_CALL(cudaSetDevice(device));
    return absl::OkStatus();
  }
  absl::StatusOr<CudaStream> StreamCreate() override {
    cudaStream_t stream = nullptr;
    WSYNC_CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return static_cast<CudaStream>(stream);
  }
  absl::Status StreamDestroy(CudaStream stream) override {
    WSYNC_CUDA_CALL(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }
  absl::StatusOr<CudaEvent> EventCreate() override {
    cudaEvent_t event = nullptr;
    WSYNC_CUDA_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return static_cast<CudaEvent>(event);
  }
  absl::Status EventDestroy(CudaEvent event) override {
    WSYNC_CUDA_CALL(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
    return absl::OkStatus();
  }
  absl::Status EventRecord(CudaEvent event, CudaStream stream) override {
    WSYNC_CUDA_CALL(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }
  absl::StatusOr<bool> EventQuery(CudaEvent event) override {
    const cudaError_t error = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) return false;
    return CudaError(error, "cudaEventQuery");
  }
  absl::StatusOr<MemoryKind> PointerKind(const void* pointer) override {
    cudaPointerAttributes attributes;
    std::memset(&attributes, 0, sizeof(attributes));
    WSYNC_CUDA_CALL(cudaPointerGetAttributes(&attributes, pointer));
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged
               ? MemoryKind::kCuda
               : MemoryKind::kHost;
  }
  absl::Status Memcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                             size_t width, size_t height, CudaStream stream) override {
    WSYNC_CUDA_CALL(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                                      cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }

  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes, CudaStream stream) override {
    WSYNC_CUDA_CALL(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }

  bool HasCopyKernel() override {
#ifdef WSYNC_CUDA_KERNELS
    return true;
#else
    return false;
#endif
  }
  absl::Status CopyKernelAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                               absl::Span<const int64_t> src_strides,
                               absl::Span<const int64_t> shape, int64_t element_size,
                               CudaStream stream) override {
    return CopyStridedKernelAsync(stream, dst, dst_strides, src, src_strides, shape, element_size);
  }

  bool HasQuantKernel() override { return HasCopyKernel(); }  // Built together.
  absl::Status QuantizeFp8Async(const quant::Fp8DeviceQuant& q, CudaStream stream) override {
#ifdef WSYNC_CUDA_KERNELS
    const int error = LaunchQuantizeFp8(q, stream);
    if (error != 0) return CudaError(static_cast<cudaError_t>(error), "FP8 quantization launch");
    return absl::OkStatus();
#else
    return absl::UnimplementedError("this build has no CUDA FP8 kernels (nvcc was not found)");
#endif
  }

  absl::StatusOr<NcclUniqueId> GetUniqueId() override {
    ncclUniqueId raw;
    if (ncclResult_t r = ncclGetUniqueId(&raw); r != ncclSuccess) {
      return NcclError(r, "ncclGetUniqueId");
    }
    static_assert(sizeof(raw.internal) == sizeof(NcclUniqueId::bytes));
    NcclUniqueId id;
    std::memcpy(id.bytes.data(), raw.internal, id.bytes.size());
    return id;
  }
  absl::StatusOr<NcclComm> CommInitRank(int nranks, const NcclUniqueId& id, int rank) override {
    ncclUniqueId raw;
    std::memcpy(raw.internal, id.bytes.data(), id.bytes.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, raw, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm != nullptr) ncclCommAbort(comm);
      return NcclError(r, "ncclCommInitRankConfig");
    }
    return static_cast<NcclComm>(comm);
  }
  absl::StatusOr<bool> CommAsyncError(NcclComm comm) override {
    ncclResult_t async = ncclSuccess;
    auto c = static_cast<ncclComm_t>(comm);
    if (ncclResult_t r = ncclCommGetAsyncError(c, &async); r != ncclSuccess) {
      return NcclError(r, "ncclCommGetAsyncError", c);
    }
    return NcclProgress(async, "NCCL communicator", c);
  }
  absl::Status CommAbort(NcclComm comm) override {
    if (ncclResult_t r = ncclCommAbort(static_cast<ncclComm_t>(comm)); r != ncclSuccess) {
      return NcclError(r, "ncclCommAbort");
    }
    return absl::OkStatus();
  }
  absl::Status CommDestroy(NcclComm comm) override {
    auto c = static_cast<ncclComm_t>(comm);
    if (ncclResult_t r = ncclCommDestroy(c); r != ncclSuccess && r != ncclInProgress) {
      return NcclError(r, "ncclCommDestroy", c);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<void*> CommRegister(NcclComm comm, void* buffer, size_t bytes) override {
    void* handle = nullptr;
    auto c = static_cast<ncclComm_t>(comm);
    const ncclResult_t r = ncclCommRegister(c, buffer, bytes, &handle);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "ncclCommRegister", c);
    WSYNC_RETURN_IF_ERROR(AwaitIdle(c, "ncclCommRegister"));
    return handle;
  }
  absl::Status CommDeregister(NcclComm comm, void* handle) override {
    auto c = static_cast<ncclComm_t>(comm);
    const ncclResult_t r = ncclCommDeregister(c, handle);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "ncclCommDeregister", c);
    return AwaitIdle(c, "ncclCommDeregister");
  }

 private:
  // Registration on a non-blocking communicator may return ncclInProgress; it is local and short,
  // so wait for it here (bounded) rather than through the transport's deadlines.
  static absl::Status AwaitIdle(ncclComm_t comm, const char* call) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (true) {
      ncclResult_t async = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(comm, &async); r != ncclSuccess) {
        return NcclError(r, call, comm);
      }
      if (async == ncclSuccess) return absl::OkStatus();
      if (async != ncclInProgress) return NcclError(async, call, comm);
      if (absl::Now() > give_up) return absl::DeadlineExceededError(absl::StrCat(call, " hung"));
      absl::SleepFor(absl::Microseconds(50));
    }
  }

 public:
  absl::Status GroupStart() override {
    if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return NcclError(r, "ncclGroupStart");
    return absl::OkStatus();
  }
  absl::StatusOr<bool> GroupEnd() override {
    return NcclProgress(ncclGroupEnd(), "ncclGroupEnd", nullptr);
  }
  absl::Status Send(const void* data, size_t bytes, int peer, NcclComm comm,
                    CudaStream stream) override {
    auto c = static_cast<ncclComm_t>(comm);
    const ncclResult_t r =
        ncclSend(data, bytes, ncclUint8, peer, c, static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "ncclSend", c);
    return absl::OkStatus();
  }
  absl::Status Recv(void* data, size_t bytes, int peer, NcclComm comm, CudaStream stream) override {
    auto c = static_cast<ncclComm_t>(comm);
    const ncclResult_t r =
        ncclRecv(data, bytes, ncclUint8, peer, c, static_cast<cudaStream_t>(stream));
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "ncclRecv", c);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<NcclApi> MakeRealNcclApi() { return std::make_unique<RealNcclApi>(); }

}  // namespace wsync
