#ifndef WSYNC_QUANT_FP8_DEVICE_H_
#define WSYNC_QUANT_FP8_DEVICE_H_

// FP8 e4m3 quantization on a CUDA device: the request one quantization carries (Fp8DeviceQuant),
// its tiling, and the per-element arithmetic, as inline functions that compile for the host and,
// under nvcc, for the device. The CUDA kernels (device/cuda_quant_kernel.cu) and their
// host emulation (fp8_device_host.h: the fake device of the unit tests) run this same code.
// C++17 and <cstdint>/<cstring> only, so that nvcc compiles it.
//
// The rules are quant/fp8.h's, computed with the same operations, so the result is bit-identical
// to QuantizeFp8 and to the reference quantizer (integration/fill/fp8_reference.h):
// - amax: the integer maximum of the |x| bits, as fp32 bits (a bf16 is the high half of an fp32);
//   bits at or above 0x7f800000 are a NaN or an infinity, which is refused;
// - scale = fp32(max(amax, 1e-10f) / 448): one IEEE fp32 division rounded to nearest even
//   (`__fdiv_rn` on the device, which no compiler flag changes; `/` on the host);
// - e4m3(fp32(x / scale)) with the same division and Fp8EncodeE4m3, which is integer code only
//   (round to nearest even, saturating at +-448; no floating-point operation, so flush-to-zero
//   and fast-math flags cannot change it).
//
// Tiling: each scale block (the last one of an axis ragged) is cut into tiles of at most
// kFp8TileRows rows and kFp8TileElements elements; one CUDA thread block works on one tile at a
// time. The amax of a block is the atomic maximum of its tiles' maxima, kept in the block's scale
// slot as integer bits until the last pass turns it into the scale.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define WSYNC_FP8_HD __host__ __device__
#else
#define WSYNC_FP8_HD
#endif

namespace wsync::quant {

// Input element types of a device quantization.
inline constexpr int32_t kFp8InputBf16 = 0;
inline constexpr int32_t kFp8InputFp32 = 1;

// The report word when no element was NaN or infinite.
inline constexpr unsigned long long kFp8NoNonFinite = ~0ull;  // NOLINT(runtime/int): atomicMin's.

inline constexpr int64_t kFp8TileRows = 64;
inline constexpr int64_t kFp8TileElements = 8192;
inline constexpr uint32_t kFp8NonFiniteBits = 0x7f800000;  // |x| bits at or above: NaN or inf.

// One quantization of a strided region of `experts` matrices of `rows` x `cols` elements (a 2-D
// tensor: experts == 1): element (e, r, c) is read at input + e * input_strides[0] +
// r * input_strides[1] + c * input_strides[2] elements. All pointers are device memory (or, for
// the host emulation, host memory).
struct Fp8DeviceQuant {
  const void* input = nullptr;
  int32_t input_type = kFp8InputBf16;
  int64_t experts = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t input_strides[3] = {0, 0, 1};
  // Scale blocks of block_rows x block_cols (>= 1; at or above the axis: the whole axis). The
  // blocks start at the region's first row and column, as in QuantizeFp8.
  int64_t block_rows = 128;
  int64_t block_cols = 128;
  // The e4m3 bytes of the elements inside the window [window_origin, window_origin +
  // window_extent) (per axis, region coordinates): element (e, r, c) of the window is written at
  // fp8 + (e - o0) * fp8_strides[0] + (r - o1) * fp8_strides[1] + (c - o2) * fp8_strides[2].
  // Elements outside the window are quantized (they count in the amax) but not written: a
  // receiver writes only its piece of the blocks it quantized.
  uint8_t* fp8 = nullptr;
  int64_t fp8_strides[3] = {0, 0, 1};
  int64_t window_origin[3] = {0, 0, 0};
  int64_t window_extent[3] = {0, 0, 0};
  // The fp32 scales [experts, BlockCount(block_rows, rows), BlockCount(block_cols, cols)], every
  // one written (a block with a NaN or infinity gets unspecified bits).
  float* scales = nullptr;
  int64_t scale_strides[3] = {0, 0, 1};
  // One word the quantization sets to kFp8NoNonFinite first and then lowers (atomic minimum) to
  // Fp8NonFiniteKey of every NaN or infinite element: afterwards it names the first such element
  // in row-major order of the region, or stays kFp8NoNonFinite.
  unsigned long long* report = nullptr;  // NOLINT(runtime/int)
};

// The report key of element (e, r, c): its row-major index in the region, times two, plus one for
// an infinity (zero for a NaN).
WSYNC_FP8_HD inline unsigned long long Fp8NonFiniteKey(  // NOLINT(runtime/int)
    const Fp8DeviceQuant& q, int64_t e, int64_t r, int64_t c, uint32_t abs_bits) {
  const int64_t index = (e * q.rows + r) * q.cols + c;
  return (static_cast<unsigned long long>(index) << 1) |  // NOLINT(runtime/int)
         (abs_bits == kFp8NonFiniteBits ? 1u : 0u);
}

WSYNC_FP8_HD inline uint32_t Fp8FloatBits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

WSYNC_FP8_HD inline float Fp8BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

// a / b in fp32, rounded to nearest even.
WSYNC_FP8_HD inline float Fp8Divide(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The fp32 bits of input element `offset` (elements from q.input).
WSYNC_FP8_HD inline uint32_t Fp8InputBits(const Fp8DeviceQuant& q, int64_t offset) {
  if (q.input_type == kFp8InputBf16) {
    return static_cast<uint32_t>(static_cast<const uint16_t*>(q.input)[offset]) << 16;
  }
  return static_cast<const uint32_t*>(q.input)[offset];
}

// The scale of a block whose |x| maximum has fp32 bits `amax_bits` (finite).
WSYNC_FP8_HD inline float Fp8ScaleOf(uint32_t amax_bits) {
  const float amax = Fp8BitsFloat(amax_bits);
  const float floored = amax < 1e-10f ? 1e-10f : amax;  // std::max(amax, 1e-10f)
  return Fp8Divide(floored, 448.0f);
}

// The e4m3 byte of a finite fp32 value, integer code only: round to nearest even, saturate at
// +-448; signed zeros keep their sign. NaN bits saturate (callers never pass a NaN).
WSYNC_FP8_HD inline uint8_t Fp8EncodeE4m3(float value) {
  const uint32_t bits = Fp8FloatBits(value);
  const uint32_t sign = (bits >> 24) & 0x80;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // >= 448
  if (magnitude >= 0x3c800000u) {                                          // >= 2^-6: a normal e4m3
    // Round the 23-bit mantissa to 3 bits, to nearest even (a carry moves into the exponent),
    // and rebias the exponent from 127 to 7.
    const uint32_t rounded = magnitude + 0x7ffffu + ((magnitude >> 20) & 1);
    return static_cast<uint8_t>(sign | ((rounded >> 20) - ((127u - 7u) << 3)));
  }
  // Subnormal e4m3: the count of 2^-9 steps, rounded to nearest even (8 is the smallest normal,
  // code 0x08). value = significand * 2^(exponent - 150), so steps = significand >> shift with
  // shift = 141 - exponent (at least 21 here).
  const uint32_t exponent = magnitude >> 23;
  const uint32_t significand = (magnitude & 0x7fffffu) | (exponent != 0 ? 0x800000u : 0u);
  const uint32_t shift = 141u - (exponent != 0 ? exponent : 1u);
  if (shift >= 32) return static_cast<uint8_t>(sign);  // Below 2^-10: rounds to zero.
  uint32_t steps = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (steps & 1) != 0)) ++steps;
  return static_cast<uint8_t>(sign | steps);
}

// How a request is cut into tiles: `tiles` in all, each an index over (expert, block row, block
// column, tile row, tile column), the last fastest.
struct Fp8Tiling {
  int64_t block_rows = 0;  // min(q.block_rows, rows): whole-axis blocks made finite.
  int64_t block_cols = 0;
  int64_t scale_rows = 0;  // Blocks along each axis.
  int64_t scale_cols = 0;
  int64_t tile_rows = 0;
  int64_t tile_cols = 0;
  int64_t tiles_per_block_row = 0;  // Tile rows in a full block.
  int64_t tiles_per_block_col = 0;
  int64_t scales = 0;  // experts * scale_rows * scale_cols.
  int64_t tiles = 0;
};

WSYNC_FP8_HD inline int64_t Fp8CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tiling of `q` (extents >= 0, blocks >= 1). An empty region has no tiles and no scales.
WSYNC_FP8_HD inline Fp8Tiling MakeFp8Tiling(const Fp8DeviceQuant& q) {
  Fp8Tiling t;
  if (q.experts <= 0 || q.rows <= 0 || q.cols <= 0) return t;
  t.block_rows = q.block_rows < q.rows ? q.block_rows : q.rows;
  t.block_cols = q.block_cols < q.cols ? q.block_cols : q.cols;
  t.scale_rows = Fp8CeilDiv(q.rows, t.block_rows);
  t.scale_cols = Fp8CeilDiv(q.cols, t.block_cols);
  t.tile_rows = t.block_rows < kFp8TileRows ? t.block_rows : kFp8TileRows;
  const int64_t wide = kFp8TileElements / t.tile_rows;
  t.tile_cols = t.block_cols < wide ? t.block_cols : wide;
  t.tiles_per_block_row = Fp8CeilDiv(t.block_rows, t.tile_rows);
  t.tiles_per_block_col = Fp8CeilDiv(t.block_cols, t.tile_cols);
  t.scales = q.experts * t.scale_rows * t.scale_cols;
  t.tiles = t.scales * t.tiles_per_block_row * t.tiles_per_block_col;
  return t;
}

// One tile: rows [r0, r1) and columns [c0, c1) of expert `expert`, in scale block `scale`
// (its index in [0, Fp8Tiling::scales), row-major over [experts, scale_rows, scale_cols]).
struct Fp8Tile {
  int64_t expert = 0;
  int64_t scale = 0;
  int64_t block_row = 0;
  int64_t block_col = 0;
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};

// Tile `index` of `t` (0 <= index < t.tiles); false when it lies past the end of a ragged block
// (such tiles are empty and skipped).
WSYNC_FP8_HD inline bool Fp8TileAt(const Fp8DeviceQuant& q, const Fp8Tiling& t, int64_t index,
                                   Fp8Tile& tile) {
  const int64_t tile_col = index % t.tiles_per_block_col;
  index /= t.tiles_per_block_col;
  const int64_t tile_row = index % t.tiles_per_block_row;
  tile.scale = index / t.tiles_per_block_row;
  tile.block_col = tile.scale % t.scale_cols;
  tile.block_row = tile.scale / t.scale_cols % t.scale_rows;
  tile.expert = tile.scale / (t.scale_cols * t.scale_rows);
  const int64_t row_end = (tile.block_row + 1) * t.block_rows;
  const int64_t block_r1 = row_end < q.rows ? row_end : q.rows;
  const int64_t col_end = (tile.block_col + 1) * t.block_cols;
  const int64_t block_c1 = col_end < q.cols ? col_end : q.cols;
  tile.r0 = tile.block_row * t.block_rows + tile_row * t.tile_rows;
  tile.c0 = tile.block_col * t.block_cols + tile_col * t.tile_cols;
  if (tile.r0 >= block_r1 || tile.c0 >= block_c1) return false;
  tile.r1 = tile.r0 + t.tile_rows < block_r1 ? tile.r0 + t.tile_rows : block_r1;
  tile.c1 = tile.c0 + t.tile_cols < block_c1 ? tile.c0 + t.tile_cols : block_c1;
  return true;
}

// The scale slot of scale block `scale` (row-major index over [experts, scale_rows, scale_cols]).
WSYNC_FP8_HD inline float* Fp8ScaleSlot(const Fp8DeviceQuant& q, const Fp8Tiling& t,
                                        int64_t scale) {
  const int64_t col = scale % t.scale_cols;
  const int64_t row = scale / t.scale_cols % t.scale_rows;
  const int64_t expert = scale / (t.scale_cols * t.scale_rows);
  return q.scales + expert * q.scale_strides[0] + row * q.scale_strides[1] +
         col * q.scale_strides[2];
}

// Where element (e, r, c) of the region goes, or nullptr when it lies outside the window.
WSYNC_FP8_HD inline uint8_t* Fp8OutputAt(const Fp8DeviceQuant& q, int64_t e, int64_t r, int64_t c) {
  const int64_t we = e - q.window_origin[0];
  const int64_t wr = r - q.window_origin[1];
  const int64_t wc = c - q.window_origin[2];
  if (we < 0 || wr < 0 || wc < 0 || we >= q.window_extent[0] || wr >= q.window_extent[1] ||
      wc >= q.window_extent[2]) {
    return nullptr;
  }
  return q.fp8 + we * q.fp8_strides[0] + wr * q.fp8_strides[1] + wc * q.fp8_strides[2];
}

// The input offset (elements) of element (e, r, c).
WSYNC_FP8_HD inline int64_t Fp8InputOffset(const Fp8DeviceQuant& q, int64_t e, int64_t r,
                                           int64_t c) {
  return e * q.input_strides[0] + r * q.input_strides[1] + c * q.input_strides[2];
}

}  // namespace wsync::quant

#endif  // WSYNC_QUANT_FP8_DEVICE_H_
