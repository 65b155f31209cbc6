#ifndef WSYNC_DEVICE_CUDA_DEVICE_MEMORY_H_
#define WSYNC_DEVICE_CUDA_DEVICE_MEMORY_H_

// DeviceMemory (transport/device_memory.h) over the CUDA runtime calls of an NcclApi: arenas by
// cudaMalloc on the process's device, strided copies by cuda_copy (cudaMemcpy2DAsync, or the copy
// kernel for the general case) on a dedicated non-blocking stream, Synchronize by polling an event
// recorded after the last copy, so that it honours its deadline.
//
// Thread safety: one thread at a time, as DeviceMemory.

#include <memory>

#include "absl/status/statusor.h"
#include "transport/device_memory.h"
#include "transport/nccl/nccl_api.h"

namespace wsync {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  // Selects `device` and creates the stream and event. FailedPrecondition "no CUDA device" when
  // the machine has none (checked first, so a GPU-less machine fails fast and clearly).
  static absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> Create(std::unique_ptr<NcclApi> api,
                                                                  int device);
  ~CudaDeviceMemory() override;

  MemoryKind kind() const override { return MemoryKind::kCuda; }
  absl::StatusOr<void*> Allocate(int64_t bytes) override;
  void Free(void* memory) override;
  absl::Status CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides, const void* src,
                                absl::Span<const int64_t> src_strides,
                                absl::Span<const int64_t> shape, int64_t element_size) override;
  absl::Status Synchronize(absl::Time deadline) override;
  // The kernels of the NcclApi (NcclApi::QuantizeFp8Async) on the copies' stream.
  bool HasFp8Kernel() const override { return has_fp8_kernel_; }
  absl::Status QuantizeFp8Async(const quant::Fp8DeviceQuant& q,
                                absl::string_view parameter) override;

  int device() const { return device_; }

 private:
  CudaDeviceMemory(std::unique_ptr<NcclApi> api, int device)
      : api_(std::move(api)), device_(device) {}

  std::unique_ptr<NcclApi> api_;
  const int device_;
  CudaStream stream_ = nullptr;
  CudaEvent event_ = nullptr;
  bool has_fp8_kernel_ = false;
};

// FailedPrecondition "no CUDA device (cudaGetDeviceCount found none): ..." when `api` sees no
// device, or when `device` is not one of them; OK otherwise. `what` names the caller's purpose.
absl::Status RequireCudaDevice(NcclApi& api, int device, absl::string_view what);

}  // namespace wsync

#endif  // WSYNC_DEVICE_CUDA_DEVICE_MEMORY_H_
