// The FP8 quantization kernels (cuda_quant_kernel.h), compiled by nvcc for the architectures of
// CMakeLists.txt (sm_80, sm_90) without fast math and with --fmad=false; the arithmetic is
// quant/fp8_device.h's (IEEE divisions by __fdiv_rn, integer e4m3 rounding), shared with the host
// emulation the unit tests run, so the bytes equal quant::QuantizeFp8's.
//
// One thread block per tile at a time (grid-stride over tiles), 256 threads over the tile's
// elements row by row (consecutive threads on consecutive columns). The amax of a block is the
// atomicMax of its tiles' maxima into the block's scale slot (as integer bits: the order of
// non-negative fp32 values is the order of their bits); a NaN or infinity lowers the report word
// by atomicMin.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/cuda_quant_kernel.h"

namespace wsync {
namespace {

using quant::Fp8DeviceQuant;
using quant::Fp8Tile;
using quant::Fp8Tiling;

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 20;

__device__ unsigned int* SlotBits(const Fp8DeviceQuant& q, const Fp8Tiling& t, int64_t scale) {
  return reinterpret_cast<unsigned int*>(quant::Fp8ScaleSlot(q, t, scale));
}

__global__ void ResetKernel(Fp8DeviceQuant q, Fp8Tiling t) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) *q.report = quant::kFp8NoNonFinite;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = first; s < t.scales; s += step) *SlotBits(q, t, s) = 0;
}

__global__ void AmaxKernel(Fp8DeviceQuant q, Fp8Tiling t) {
  __shared__ unsigned int warp_max[kThreads / 32];
  Fp8Tile tile;
  for (int64_t index = blockIdx.x; index < t.tiles; index += gridDim.x) {
    if (!quant::Fp8TileAt(q, t, index, tile)) continue;  // The same for every thread.
    const int width = static_cast<int>(tile.c1 - tile.c0);
    const int count = static_cast<int>(tile.r1 - tile.r0) * width;
    unsigned int amax = 0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t r = tile.r0 + i / width;
      const int64_t c = tile.c0 + i % width;
      const uint32_t bits =
          quant::Fp8InputBits(q, quant::Fp8InputOffset(q, tile.expert, r, c)) & 0x7fffffffu;
      if (bits >= quant::kFp8NonFiniteBits) {
        atomicMin(q.report, quant::Fp8NonFiniteKey(q, tile.expert, r, c, bits));
      }
      amax = amax > bits ? amax : bits;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const unsigned int other = __shfl_down_sync(0xffffffffu, amax, offset);
      amax = amax > other ? amax : other;
    }
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w) amax = amax > warp_max[w] ? amax : warp_max[w];
      atomicMax(SlotBits(q, t, tile.scale), amax);
    }
    __syncthreads();  // warp_max is reused by the next tile.
  }
}

__global__ void QuantizeKernel(Fp8DeviceQuant q, Fp8Tiling t) {
  Fp8Tile tile;
  for (int64_t index = blockIdx.x; index < t.tiles; index += gridDim.x) {
    if (!quant::Fp8TileAt(q, t, index, tile)) continue;
    const unsigned int amax = *SlotBits(q, t, tile.scale);
    if (amax >= quant::kFp8NonFiniteBits) continue;  // Refused through the report.
    const float scale = quant::Fp8ScaleOf(amax);
    const int width = static_cast<int>(tile.c1 - tile.c0);
    const int count = static_cast<int>(tile.r1 - tile.r0) * width;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t r = tile.r0 + i / width;
      const int64_t c = tile.c0 + i % width;
      uint8_t* out = quant::Fp8OutputAt(q, tile.expert, r, c);
      if (out == nullptr) continue;
      const float x =
          quant::Fp8BitsFloat(quant::Fp8InputBits(q, quant::Fp8InputOffset(q, tile.expert, r, c)));
      *out = quant::Fp8EncodeE4m3(quant::Fp8Divide(x, scale));
    }
  }
}

__global__ void ScaleKernel(Fp8DeviceQuant q, Fp8Tiling t) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < t.scales;
       s += step) {
    const unsigned int amax = *SlotBits(q, t, s);
    if (amax < quant::kFp8NonFiniteBits) *quant::Fp8ScaleSlot(q, t, s) = quant::Fp8ScaleOf(amax);
  }
}

int GridFor(int64_t items, int64_t per_block) {
  const int64_t wanted = (items + per_block - 1) / per_block;
  return static_cast<int>(wanted < 1 ? 1 : (wanted < kMaxGrid ? wanted : kMaxGrid));
}

}  // namespace

int LaunchQuantizeFp8(const quant::Fp8DeviceQuant& q, void* stream) {
  const Fp8Tiling t = quant::MakeFp8Tiling(q);
  auto s = static_cast<cudaStream_t>(stream);
  if (t.tiles == 0) {  // Nothing to quantize; the report still says so.
    if (q.report == nullptr) return 0;
    return static_cast<int>(cudaMemsetAsync(q.report, 0xff, sizeof(*q.report), s));
  }
  ResetKernel<<<GridFor(t.scales, kThreads), kThreads, 0, s>>>(q, t);
  AmaxKernel<<<GridFor(t.tiles, 1), kThreads, 0, s>>>(q, t);
  QuantizeKernel<<<GridFor(t.tiles, 1), kThreads, 0, s>>>(q, t);
  ScaleKernel<<<GridFor(t.scales, kThreads), kThreads, 0, s>>>(q, t);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace wsync
