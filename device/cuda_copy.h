#ifndef WSYNC_DEVICE_CUDA_COPY_H_
#define WSYNC_DEVICE_CUDA_COPY_H_

// Strided copies of CUDA memory on a stream: the pack and unpack of staged chunks and the local
// copies when buffers are CUDA memory. Same geometry as executor/copy.h (element strides; axes of
// extent 1 ignored; axes contiguous on both sides merged), carried out as cudaMemcpy2DAsync calls:
// one call when the merged geometry is at most 2-D, one per index of the outer axes otherwise.
// The innermost axis is the copy's width when it is contiguous on both sides; otherwise each
// element is a row of one element (correct for any geometry, slow for element-wise transposes).
//
// The general case: when a geometry needs more than kMaxCopies2D 2-D copies and the NcclApi has the
// copy kernel (the real one of libwsync_cuda.so when nvcc was found at configure time, compiled for
// sm_80 and sm_90; NcclApi::HasCopyKernel), CopyStridedAsync launches that kernel once instead
// (element sizes 1, 2, 4, 8; up to 8 axes) when both pointers are device memory
// (NcclApi::PointerKind): a copy to or from host memory always goes through cudaMemcpy2DAsync.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "transport/nccl/nccl_api.h"

namespace wsync {

inline constexpr int64_t kMaxCopies2D = 16;

// Copies the region `shape` of elements of `element_size` bytes from `src` (element strides
// `src_strides`) to `dst` (element strides `dst_strides`) on `stream`. The regions must not
// overlap. Returns when the copies are enqueued; completion is the stream's.
absl::Status CopyStridedAsync(NcclApi& api, CudaStream stream, void* dst,
                              absl::Span<const int64_t> dst_strides, const void* src,
                              absl::Span<const int64_t> src_strides,
                              absl::Span<const int64_t> shape, int64_t element_size);

// Packs the strided region at `src` into the row-major buffer `packed`.
absl::Status PackRegionAsync(NcclApi& api, CudaStream stream, void* packed, const void* src,
                             absl::Span<const int64_t> src_strides, absl::Span<const int64_t> shape,
                             int64_t element_size);

// Unpacks the row-major buffer `packed` into the strided region at `dst`.
absl::Status UnpackRegionAsync(NcclApi& api, CudaStream stream, void* dst,
                               absl::Span<const int64_t> dst_strides, const void* packed,
                               absl::Span<const int64_t> shape, int64_t element_size);

// How many cudaMemcpy2DAsync calls CopyStridedAsync makes for this geometry (0 when empty).
int64_t CountCopies2D(absl::Span<const int64_t> dst_strides, absl::Span<const int64_t> src_strides,
                      absl::Span<const int64_t> shape, int64_t element_size);

}  // namespace wsync

#endif  // WSYNC_DEVICE_CUDA_COPY_H_
