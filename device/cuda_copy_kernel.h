#ifndef WSYNC_DEVICE_CUDA_COPY_KERNEL_H_
#define WSYNC_DEVICE_CUDA_COPY_KERNEL_H_

// Launches the strided copy kernel (cuda_copy_kernel.cu) on `stream` (a cudaStream_t). Strides in
// elements; element_size 1, 2, 4 or 8; at most kMaxKernelAxes axes. Returns the cudaError_t of
// the launch as an int (0: enqueued). Internal to the real NcclApi: use CopyStridedAsync.

#include <cstdint>

namespace wsync {

inline constexpr int kMaxKernelAxes = 8;

int LaunchStridedCopy(void* dst, const int64_t* dst_strides, const void* src,
                      const int64_t* src_strides, const int64_t* shape, int rank,
                      int64_t element_size, void* stream);

}  // namespace wsync

#endif  // WSYNC_DEVICE_CUDA_COPY_KERNEL_H_
