// The general strided copy as one CUDA kernel (compiled by nvcc for sm_80 and sm_90 when nvcc is
// found; see CMakeLists.txt). One thread per element, grid-stride loop; the address of element i
// is computed from its row-major index over up to kMaxKernelAxes axes.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/cuda_copy_kernel.h"

namespace wsync {
namespace {

struct Geometry {
  int rank;
  int64_t extent[kMaxKernelAxes];
  int64_t dst_stride[kMaxKernelAxes];  // Elements.
  int64_t src_stride[kMaxKernelAxes];
  int64_t count;
};

template <typename T>
__global__ void StridedCopyKernel(T* dst, const T* src, Geometry g) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < g.count;
       i += step) {
    int64_t rest = i, d = 0, s = 0;
    for (int axis = g.rank - 1; axis >= 0; --axis) {
      const int64_t index = rest % g.extent[axis];
      rest /= g.extent[axis];
      d += index * g.dst_stride[axis];
      s += index * g.src_stride[axis];
    }
    dst[d] = src[s];
  }
}

template <typename T>
cudaError_t Launch(void* dst, const void* src, const Geometry& g, cudaStream_t stream) {
  const int threads = 256;
  const int64_t wanted = (g.count + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 ? wanted : 65535);
  StridedCopyKernel<T>
      <<<blocks, threads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), g);
  return cudaGetLastError();
}

}  // namespace

int LaunchStridedCopy(void* dst, const int64_t* dst_strides, const void* src,
                      const int64_t* src_strides, const int64_t* shape, int rank,
                      int64_t element_size, void* stream) {
  if (rank < 0 || rank > kMaxKernelAxes) return static_cast<int>(cudaErrorInvalidValue);
  Geometry g{};
  g.rank = rank;
  g.count = 1;
  for (int a = 0; a < rank; ++a) {
    g.extent[a] = shape[a];
    g.count *= shape[a];
    g.dst_stride[a] = dst_strides[a];
    g.src_stride[a] = src_strides[a];
  }
  if (g.count == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  switch (element_size) {
    case 1:
      return static_cast<int>(Launch<uint8_t>(dst, src, g, s));
    case 2:
      return static_cast<int>(Launch<uint16_t>(dst, src, g, s));
    case 4:
      return static_cast<int>(Launch<uint32_t>(dst, src, g, s));
    case 8:
      return static_cast<int>(Launch<uint64_t>(dst, src, g, s));
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace wsync
