#include "device/cuda_device_memory.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "device/cuda_copy.h"
#include "quant/fp8_device_host.h"

namespace wsync {

absl::Status RequireCudaDevice(NcclApi& api, int device, absl::string_view what) {
  const int count = api.DeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device (cudaGetDeviceCount found none): ", what,
                     " needs an NVIDIA GPU and its driver"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " devices): ", what));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> CudaDeviceMemory::Create(
    std::unique_ptr<NcclApi> api, int device) {
  if (api == nullptr) return absl::InvalidArgumentError("CudaDeviceMemory needs an NcclApi");
  WSYNC_RETURN_IF_ERROR(RequireCudaDevice(*api, device, "CUDA buffers"));
  auto memory = std::unique_ptr<CudaDeviceMemory>(new CudaDeviceMemory(std::move(api), device));
  WSYNC_RETURN_IF_ERROR(memory->api_->SetDevice(device));
  WSYNC_ASSIGN_OR_RETURN(memory->stream_, memory->api_->StreamCreate());
  WSYNC_ASSIGN_OR_RETURN(memory->event_, memory->api_->EventCreate());
  memory->has_fp8_kernel_ = memory->api_->HasQuantKernel();
  return memory;
}

CudaDeviceMemory::~CudaDeviceMemory() {
  if (event_ != nullptr) api_->EventDestroy(event_).IgnoreError();
  if (stream_ != nullptr) api_->StreamDestroy(stream_).IgnoreError();
}

absl::StatusOr<void*> CudaDeviceMemory::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("negative device allocation");
  WSYNC_RETURN_IF_ERROR(api_->SetDevice(device_));
  return api_->Malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
}

void CudaDeviceMemory::Free(void* memory) {
  if (memory != nullptr) api_->Free(memory).IgnoreError();
}

absl::Status CudaDeviceMemory::CopyStridedAsync(void* dst, absl::Span<const int64_t> dst_strides,
                                                const void* src,
                                                absl::Span<const int64_t> src_strides,
                                                absl::Span<const int64_t> shape,
                                                int64_t element_size) {
  return wsync::CopyStridedAsync(*api_, stream_, dst, dst_strides, src, src_strides, shape,
                                 element_size);
}

absl::Status CudaDeviceMemory::QuantizeFp8Async(const quant::Fp8DeviceQuant& q,
                                                absl::string_view parameter) {
  if (!has_fp8_kernel_) {
    return absl::UnimplementedError(
        "CUDA FP8 quantization needs the module's kernels (nvcc was not found at build time)");
  }
  WSYNC_RETURN_IF_ERROR(quant::CheckFp8DeviceQuant(q, parameter));
  return api_->QuantizeFp8Async(q, stream_);
}

absl::Status CudaDeviceMemory::Synchronize(absl::Time deadline) {
  WSYNC_RETURN_IF_ERROR(api_->EventRecord(event_, stream_));
  absl::Duration pause = absl::Microseconds(5);
  while (true) {
    WSYNC_ASSIGN_OR_RETURN(bool done, api_->EventQuery(event_));
    if (done) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("CUDA copies on device ", device_, " did not finish by the deadline"));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Microseconds(200));
  }
}

}  // namespace wsync
