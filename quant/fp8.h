#ifndef WSYNC_QUANT_FP8_H_
#define WSYNC_QUANT_FP8_H_

// FP8 e4m3 quantization of bf16 or fp32 weights on the CPU, in the rollout engines' formats.
//
// Format: OCP FP8 e4m3 "fn" (torch.float8_e4m3fn, the type of vLLM's and DeepSeek-V3's FP8
// weights): 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest finite value 448; no infinities;
// 0x7f and 0xff are NaN and never produced here.
//
// Scaling: every matrix of a parameter (a 2-D weight, or each expert of a 3-D expert tensor
// [experts, rows, cols]) is cut into blocks of `Fp8Blocking` (128 x 128 for DeepSeek-V3 / Kimi-K2
// block FP8; 1 x cols per output channel; rows x cols per tensor), the last block along an axis
// ragged where the axis is not a multiple of the block. Each block has one fp32 scale:
//   scale = fp32(max(amax, kFp8AmaxFloor) / 448)    amax: the largest |x| of the block
//   fp8   = e4m3(clamp(fp32(x / scale), -448, 448))  fp32 division, round to nearest even
// The scale is what the engines store and read as `weight_scale_inv` (DeepSeek-V3 block FP8) or
// `weight_scale` (vLLM per-channel / per-tensor): dequantized = fp8 * scale. An all-zero block
// (and any block with amax < 1e-10) gets the scale 1e-10 / 448 and quantizes to zeros, which
// dequantize to zero (a -0 or a negative value that rounds to zero keeps its sign: 0x80); vLLM's
// per_token_group_quant_fp8 (vllm/model_executor/layers/quantization/utils/fp8_utils.py,
// eps = 1e-10) uses the same floor.
// A NaN or infinity in the input is refused (InvalidArgument naming the parameter and element).
//
// Thread safety: the functions are pure over their arguments; concurrent calls on disjoint
// outputs are safe.

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace wsync::quant {

inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr float kFp8AmaxFloor = 1e-10f;
// A block extent that covers the whole axis, whatever its length.
inline constexpr int64_t kWholeAxis = std::numeric_limits<int64_t>::max();

// The scale blocks of each matrix: `rows` x `cols` elements (kWholeAxis: the whole axis).
struct Fp8Blocking {
  int64_t rows = 128;
  int64_t cols = 128;

  static Fp8Blocking Block(int64_t rows = 128, int64_t cols = 128) { return {rows, cols}; }
  static Fp8Blocking PerChannel() { return {1, kWholeAxis}; }
  static Fp8Blocking PerTensor() { return {kWholeAxis, kWholeAxis}; }
};

// Number of blocks of extent `block` along an axis of `extent` elements (the last one ragged).
inline int64_t BlockCount(int64_t block, int64_t extent) {
  if (extent <= 0) return 0;
  return block >= extent ? 1 : (extent + block - 1) / block;
}

// A strided region of elements of one parameter: `experts` matrices of `rows` x `cols`; element
// (e, r, c) lies at `base` + e * expert_stride + r * row_stride + c * col_stride elements (the
// executor's piece strides). A 2-D tensor has experts == 1 (its expert_stride is unused).
template <typename Pointer>
struct Region {
  Pointer base = nullptr;
  int64_t experts = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t expert_stride = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
};
using ConstRegion = Region<const void*>;
using MutableRegion = Region<void*>;

// The region of rank 2 ([rows, cols]) or 3 ([experts, rows, cols]) `shape` with element strides
// `strides` at `base`. InvalidArgument for another rank, a negative extent, or sizes that differ.
template <typename Pointer>
absl::Status MakeRegion(Pointer base, absl::Span<const int64_t> strides,
                        absl::Span<const int64_t> shape, Region<Pointer>& region);

// Quantizes `input` (bf16 or fp32 elements, `input_dtype`) into `fp8` (e4m3 bytes, the same
// shape) and `scales` (fp32, shape [experts, BlockCount(blocking.rows, rows),
// BlockCount(blocking.cols, cols)]) by the rules at the top of this file. The blocks start at the
// region's first row and column: quantizing a box of a parameter gives the parameter's own bytes
// and scales only when the box covers whole blocks (see WholeBlocks): a sender quantizes such a
// box straight from its piece; a receiver gathers a box whose blocks span several sources into a
// bf16 buffer first and quantizes that buffer.
// InvalidArgument (naming `parameter`) for a dtype other than bf16/fp32, a blocking below 1, shapes
// that disagree, or a NaN or infinity in the input (with its (expert, row, col) in the region).
// On an error the outputs are unspecified (blocks before the bad one may be written). The regions
// must not overlap. Runs SelectedFp8Kernel() (declared below).
absl::Status QuantizeFp8(const Fp8Blocking& blocking, DType input_dtype, const ConstRegion& input,
                         const MutableRegion& fp8, const MutableRegion& scales,
                         absl::string_view parameter);

// The host kernels QuantizeFp8 can run. Each computes the same bits (the rules above); they
// differ in speed only: kPortable is compiler-vectorized code for the baseline instruction set;
// kAvx2 (x86-64-v3) and kAvx512 (x86-64-v4) build the same loops for their instruction sets and
// quantize contiguous bf16 rows with intrinsics (quant/fp8_rows.h).
enum class Fp8Kernel { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// "portable", "avx2", "avx512".
absl::string_view Fp8KernelName(Fp8Kernel kernel);

// The kernels this build has and this CPU runs, slowest first; kPortable always.
std::vector<Fp8Kernel> RunnableFp8Kernels();

// The environment variable that caps the kernel QuantizeFp8 runs: "avx2" runs AVX2 on a CPU with
// AVX-512 (as a CPU without it would), "portable" the baseline code; any other value is ignored.
inline constexpr char kFp8KernelVariable[] = "WSYNC_FP8_KERNEL";

// The kernel QuantizeFp8 runs: the fastest runnable one, capped by kFp8KernelVariable. Chosen at
// the first call and fixed for the life of the process.
Fp8Kernel SelectedFp8Kernel();

// QuantizeFp8 with `kernel`: the same results and errors, and FailedPrecondition when `kernel` is
// not runnable here (RunnableFp8Kernels).
absl::Status QuantizeFp8WithKernel(Fp8Kernel kernel, const Fp8Blocking& blocking, DType input_dtype,
                                   const ConstRegion& input, const MutableRegion& fp8,
                                   const MutableRegion& scales, absl::string_view parameter);

// The e4m3 byte of a finite fp32 value: round to nearest even, saturating at +-448. The kernels'
// per-element step, exposed for tests. `value` must not be NaN.
uint8_t EncodeE4m3Saturating(float value);

// [origin, origin + extent) of one axis.
struct AxisRange {
  int64_t origin = 0;
  int64_t extent = 0;
};

// The smallest range of whole blocks (extent `block`, the last block of the axis ragged at
// `axis_extent`) that contains `range`; a receiver gathers this range before quantizing. Requires
// 0 <= range.origin, range.origin + range.extent <= axis_extent, block >= 1.
AxisRange WholeBlocks(int64_t block, int64_t axis_extent, AxisRange range);

// True when `range` is made of whole blocks: WholeBlocks(block, axis_extent, range) == range.
bool IsWholeBlocks(int64_t block, int64_t axis_extent, AxisRange range);

// The range of the scale tensor's axis that the whole-block `range` writes.
AxisRange ScaleRange(int64_t block, int64_t axis_extent, AxisRange range);

}  // namespace wsync::quant

#endif  // WSYNC_QUANT_FP8_H_
