#include "quant/fp8.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "quant/fp8_rows.h"

namespace wsync::quant {
namespace {

// The per-element and per-row steps are inlined into the per-kernel entry points below, so that
// each one vectorizes them for its instruction set.
#define WSYNC_QUANT_INLINE __attribute__((always_inline)) inline

constexpr int64_t kBlock128 = 128;         // The block width of DeepSeek-V3 / Kimi-K2 block FP8.
constexpr uint32_t kBits448 = 0x43e00000;  // 448.0f
constexpr uint32_t kBitsMinNormal = 0x3c800000;       // 2^-6, e4m3's smallest normal
constexpr float kSubnormalMagic = 16384.0f;           // 2^14: its fp32 ulp is 2^-9, e4m3's quantum
constexpr uint32_t kBitsSubnormalMagic = 0x46800000;  // 2^14
constexpr uint32_t kFp32ToE4m3Bias = (127 - 7) << 3;

WSYNC_QUANT_INLINE uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

WSYNC_QUANT_INLINE float BitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Branch-free so that the loops calling it vectorize: both the normal and the subnormal encoding
// are computed and one is selected.
WSYNC_QUANT_INLINE uint8_t Encode(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 24) & 0x80;
  const uint32_t magnitude = std::min(bits & 0x7fffffffu, kBits448);
  // Normal range: round the 23-bit mantissa to 3 bits, to nearest even (a carry moves into the
  // exponent, as it should), and rebias the exponent from 127 to 7.
  const uint32_t rounded = magnitude + 0x7ffff + ((magnitude >> 20) & 1);
  const uint32_t normal = (rounded >> 20) - kFp32ToE4m3Bias;
  // Subnormal range (below 2^-6): adding 2^14 rounds to a multiple of 2^-9 (nearest even, the
  // fp32 addition's rounding); the count of 2^-9 steps is the e4m3 code (8 is the smallest normal).
  const uint32_t subnormal =
      FloatBits(BitsFloat(magnitude) + kSubnormalMagic) - kBitsSubnormalMagic;
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(magnitude < kBitsMinNormal);
  return static_cast<uint8_t>(sign | (subnormal & is_subnormal) | (normal & ~is_subnormal));
}

// Per input type: the bits of an element, |x| as ordered signed bits (the order of non-negative
// IEEE values is the order of their bits), and the bits at or above which |x| is not finite.
struct Bf16 {
  using Bits = uint16_t;
  using AbsBits = int16_t;
  static constexpr int kAbsMask = 0x7fff;
  static constexpr AbsBits kNonFinite = 0x7f80;
  static float ToFloat(uint32_t bits) { return BitsFloat(bits << 16); }
};
struct Fp32 {
  using Bits = uint32_t;
  using AbsBits = int32_t;
  static constexpr uint32_t kAbsMask = 0x7fffffff;
  static constexpr AbsBits kNonFinite = 0x7f800000;
  static float ToFloat(uint32_t bits) { return BitsFloat(bits); }
};

template <typename T>
WSYNC_QUANT_INLINE typename T::AbsBits RowAbsMax(const typename T::Bits* row, int64_t count,
                                                 int64_t stride, typename T::AbsBits amax) {
  using AbsBits = typename T::AbsBits;
  if (stride == 1 && count == kBlock128) {  // A full row of a 128-wide block: no loop epilogue.
    for (int64_t i = 0; i < kBlock128; ++i) {
      amax = std::max(amax, static_cast<AbsBits>(row[i] & T::kAbsMask));
    }
  } else if (stride == 1) {
    for (int64_t i = 0; i < count; ++i) {
      amax = std::max(amax, static_cast<AbsBits>(row[i] & T::kAbsMask));
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      amax = std::max(amax, static_cast<AbsBits>(row[i * stride] & T::kAbsMask));
    }
  }
  return amax;
}

template <typename T>
WSYNC_QUANT_INLINE void QuantizeRow(const typename T::Bits* row, int64_t count, int64_t stride,
                                    float scale, uint8_t* out, int64_t out_stride) {
  if (stride == 1 && out_stride == 1) {
    const typename T::Bits* __restrict in = row;
    uint8_t* __restrict packed_out = out;
    if (count == kBlock128) {
      for (int64_t i = 0; i < kBlock128; ++i) packed_out[i] = Encode(T::ToFloat(in[i]) / scale);
      return;
    }
    for (int64_t i = 0; i < count; ++i) packed_out[i] = Encode(T::ToFloat(in[i]) / scale);
  } else {
    for (int64_t i = 0; i < count; ++i) {
      out[i * out_stride] = Encode(T::ToFloat(row[i * stride]) / scale);
    }
  }
}

// The first non-finite element of the block, for the error.
template <typename T>
[[gnu::noinline, gnu::cold]] absl::Status NonFiniteError(const typename T::Bits* in,
                                                         const ConstRegion& input, int64_t expert,
                                                         int64_t r0, int64_t r1, int64_t c0,
                                                         int64_t c1, absl::string_view parameter) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const uint32_t bits =
          in[expert * input.expert_stride + r * input.row_stride + c * input.col_stride];
      if (static_cast<typename T::AbsBits>(bits & T::kAbsMask) < T::kNonFinite) continue;
      const bool nan = (bits & T::kAbsMask) > static_cast<uint32_t>(T::kNonFinite);
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", parameter, ": cannot quantize ", nan ? "NaN" : "an infinity",
                       " at element (", expert, ", ", r, ", ", c, ") of the region to FP8"));
    }
  }
  return absl::InternalError("non-finite amax without a non-finite element");
}

// Adds the |x| of row `row` to the amax of each of its column blocks (`maxima`, one per block).
template <typename T>
WSYNC_QUANT_INLINE void AddRowAbsMax(const typename T::Bits* row, const ConstRegion& input,
                                     int64_t block_cols, absl::Span<typename T::AbsBits> maxima) {
  for (int64_t bc = 0; bc < static_cast<int64_t>(maxima.size()); ++bc) {
    const int64_t c0 = bc * block_cols;
    maxima[bc] = RowAbsMax<T>(row + c0 * input.col_stride, std::min(block_cols, input.cols - c0),
                              input.col_stride, maxima[bc]);
  }
}

// A quantizer of whole contiguous bf16 rows (internal::QuantizeBf16RowAvx512's signature).
using Bf16RowFn = void (*)(const uint16_t* row, int64_t cols, int64_t block_cols,
                           const float* scales, uint8_t* out, const uint16_t* next_row);

// One band of blocks (block rows r0..r1 of every column block) at a time, each pass over whole
// rows of the band: first the amax of every block of the band, row by row, then the elements,
// row by row. Rows are read front to back (the hardware prefetcher streams them) instead of a
// block's 128 short row segments at a stride of a whole row each. The amax pass of the next band
// runs interleaved with the quantize pass of this one (a row of each in turn), so that its reads
// from memory overlap the quantize pass's arithmetic. The bits are those of one block at a time:
// the same amax, scale and encoding per element. `bf16_rows` (null, or bf16 only) quantizes the
// rows when input and output rows are contiguous, and prefetches the next band's row.
template <typename T>
WSYNC_QUANT_INLINE absl::Status QuantizeTyped(const Fp8Blocking& blocking, const ConstRegion& input,
                                              const MutableRegion& fp8, const MutableRegion& scales,
                                              absl::string_view parameter, Bf16RowFn bf16_rows) {
  using AbsBits = typename T::AbsBits;
  const auto* in = static_cast<const typename T::Bits*>(input.base);
  auto* out = static_cast<uint8_t*>(fp8.base);
  auto* scale_out = static_cast<float*>(scales.base);
  const int64_t block_rows = std::min(blocking.rows, input.rows);
  const int64_t block_cols = std::min(blocking.cols, input.cols);
  const bool whole_rows = bf16_rows != nullptr && input.col_stride == 1 && fp8.col_stride == 1;
  absl::InlinedVector<AbsBits, 64> amax(scales.cols), next_amax(scales.cols);
  absl::InlinedVector<float, 64> band_scales(scales.cols);
  for (int64_t e = 0; e < input.experts; ++e) {
    const auto* matrix = in + e * input.expert_stride;
    uint8_t* out_matrix = out + e * fp8.expert_stride;
    std::fill(amax.begin(), amax.end(), 0);
    for (int64_t r = 0; r < block_rows; ++r) {
      AddRowAbsMax<T>(matrix + r * input.row_stride, input, block_cols, absl::MakeSpan(amax));
    }
    for (int64_t br = 0; br < scales.rows; ++br) {
      const int64_t r0 = br * block_rows;
      const int64_t r1 = r0 + std::min(block_rows, input.rows - r0);
      // The next band, rows r1..next_end: no more rows than this one (only the last is ragged).
      const int64_t next_end = std::min(input.rows, r1 + block_rows);
      for (int64_t bc = 0; bc < scales.cols; ++bc) {
        const int64_t c0 = bc * block_cols;
        if (amax[bc] >= T::kNonFinite) {
          return NonFiniteError<T>(in, input, e, r0, r1, c0,
                                   c0 + std::min(block_cols, input.cols - c0), parameter);
        }
        band_scales[bc] =
            std::max(T::ToFloat(static_cast<uint32_t>(amax[bc])), kFp8AmaxFloor) / kFp8E4m3Max;
        scale_out[e * scales.expert_stride + br * scales.row_stride + bc * scales.col_stride] =
            band_scales[bc];
      }
      std::fill(next_amax.begin(), next_amax.end(), 0);
      for (int64_t r = r0; r < r1; ++r) {
        const auto* row = matrix + r * input.row_stride;
        uint8_t* out_row = out_matrix + r * fp8.row_stride;
        const int64_t ahead = r1 + (r - r0);  // The next band's row read after this one.
        if constexpr (std::is_same_v<T, Bf16>) {
          if (whole_rows) {
            bf16_rows(row, input.cols, block_cols, band_scales.data(), out_row,
                      ahead < next_end ? matrix + ahead * input.row_stride : nullptr);
          }
        }
        for (int64_t bc = 0; bc < scales.cols && !whole_rows; ++bc) {
          const int64_t c0 = bc * block_cols;
          QuantizeRow<T>(row + c0 * input.col_stride, std::min(block_cols, input.cols - c0),
                         input.col_stride, band_scales[bc], out_row + c0 * fp8.col_stride,
                         fp8.col_stride);
        }
        if (ahead < next_end) {
          AddRowAbsMax<T>(matrix + ahead * input.row_stride, input, block_cols,
                          absl::MakeSpan(next_amax));
        }
      }
      std::swap(amax, next_amax);
    }
  }
  return absl::OkStatus();
}

// The kernels (Fp8Kernel): QuantizeTyped built for the baseline, for x86-64-v3 and for x86-64-v4,
// bf16 rows through the portable loops or fp8_rows.h's intrinsics. Every build computes the same
// bits: integer operations and IEEE fp32 division and addition in the default rounding mode (the
// target builds with -ffp-contract=off: no fused multiply-add anywhere).
struct KernelEntry {
  absl::Status (*bf16)(const Fp8Blocking&, const ConstRegion&, const MutableRegion&,
                       const MutableRegion&, absl::string_view);
  absl::Status (*fp32)(const Fp8Blocking&, const ConstRegion&, const MutableRegion&,
                       const MutableRegion&, absl::string_view);
};

#define WSYNC_QUANT_KERNEL_ENTRY(attributes, name, rows)                                    \
  attributes absl::Status name##Bf16(const Fp8Blocking& blocking, const ConstRegion& input, \
                                     const MutableRegion& fp8, const MutableRegion& scales, \
                                     absl::string_view parameter) {                         \
    return QuantizeTyped<Bf16>(blocking, input, fp8, scales, parameter, rows);              \
  }                                                                                         \
  attributes absl::Status name##Fp32(const Fp8Blocking& blocking, const ConstRegion& input, \
                                     const MutableRegion& fp8, const MutableRegion& scales, \
                                     absl::string_view parameter) {                         \
    return QuantizeTyped<Fp32>(blocking, input, fp8, scales, parameter, nullptr);           \
  }                                                                                         \
  constexpr KernelEntry k##name = {name##Bf16, name##Fp32};

WSYNC_QUANT_KERNEL_ENTRY(, Portable, nullptr)
#ifdef WSYNC_QUANT_X86_KERNELS
WSYNC_QUANT_KERNEL_ENTRY(__attribute__((target("arch=x86-64-v3"))), Avx2,
                         internal::QuantizeBf16RowAvx2)
WSYNC_QUANT_KERNEL_ENTRY(__attribute__((target("arch=x86-64-v4"))), Avx512,
                         internal::QuantizeBf16RowAvx512)
#endif
#undef WSYNC_QUANT_KERNEL_ENTRY

bool Runnable(Fp8Kernel kernel) {
  switch (kernel) {
    case Fp8Kernel::kPortable:
      return true;
#ifdef WSYNC_QUANT_X86_KERNELS
    case Fp8Kernel::kAvx2:
      return internal::CpuHasAvx2();
    case Fp8Kernel::kAvx512:
      return internal::CpuHasAvx512();
#endif
    default:
      return false;
  }
}

const KernelEntry& EntryOf(Fp8Kernel kernel) {
  switch (kernel) {
#ifdef WSYNC_QUANT_X86_KERNELS
    case Fp8Kernel::kAvx2:
      return kAvx2;
    case Fp8Kernel::kAvx512:
      return kAvx512;
#endif
    default:
      return kPortable;
  }
}

// The fastest runnable kernel no faster than WSYNC_FP8_KERNEL names (read once).
Fp8Kernel ChooseKernel() {
  std::vector<Fp8Kernel> runnable = RunnableFp8Kernels();
  const char* cap = std::getenv(kFp8KernelVariable);
  if (cap != nullptr) {
    for (const Fp8Kernel kernel : {Fp8Kernel::kPortable, Fp8Kernel::kAvx2, Fp8Kernel::kAvx512}) {
      if (Fp8KernelName(kernel) != cap) continue;
      while (runnable.size() > 1 && runnable.back() > kernel) runnable.pop_back();
    }
  }
  return runnable.back();
}

template <typename A, typename B>
bool SameShape(const A& a, const B& b) {
  return a.experts == b.experts && a.rows == b.rows && a.cols == b.cols;
}

absl::Status CheckArguments(const Fp8Blocking& blocking, DType input_dtype,
                            const ConstRegion& input, const MutableRegion& fp8,
                            const MutableRegion& scales, absl::string_view parameter) {
  const auto fail = [&](auto&&... message) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", parameter, ": ", message...));
  };
  if (input_dtype != DType::kBFloat16 && input_dtype != DType::kFloat32) {
    return fail("FP8 quantization takes bf16 or fp32 input, not ", DTypeName(input_dtype));
  }
  if (blocking.rows < 1 || blocking.cols < 1) {
    return fail("FP8 scale blocks of ", blocking.rows, " x ", blocking.cols);
  }
  if (input.experts < 0 || input.rows < 0 || input.cols < 0) return fail("negative extent");
  if (!SameShape(input, fp8)) {
    return fail("FP8 output of [", fp8.experts, ", ", fp8.rows, ", ", fp8.cols,
                "] for an input of [", input.experts, ", ", input.rows, ", ", input.cols, "]");
  }
  const int64_t block_rows = BlockCount(blocking.rows, input.rows);
  const int64_t block_cols = BlockCount(blocking.cols, input.cols);
  if (scales.experts != input.experts || scales.rows != block_rows || scales.cols != block_cols) {
    return fail("scales of [", scales.experts, ", ", scales.rows, ", ", scales.cols,
                "] where the blocks need [", input.experts, ", ", block_rows, ", ", block_cols,
                "]");
  }
  return absl::OkStatus();
}

}  // namespace

template <typename Pointer>
absl::Status MakeRegion(Pointer base, absl::Span<const int64_t> strides,
                        absl::Span<const int64_t> shape, Region<Pointer>& region) {
  if (strides.size() != shape.size() || (shape.size() != 2 && shape.size() != 3)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an FP8 region has 2 or 3 axes, not ", shape.size(), " (", strides.size(), " strides)"));
  }
  for (const int64_t extent : shape) {
    if (extent < 0) return absl::InvalidArgumentError("negative extent in an FP8 region");
  }
  const size_t first = shape.size() - 2;
  region = Region<Pointer>{};
  region.base = base;
  if (first == 1) {
    region.experts = shape[0];
    region.expert_stride = strides[0];
  }
  region.rows = shape[first];
  region.cols = shape[first + 1];
  region.row_stride = strides[first];
  region.col_stride = strides[first + 1];
  return absl::OkStatus();
}

template absl::Status MakeRegion<const void*>(const void*, absl::Span<const int64_t>,
                                              absl::Span<const int64_t>, ConstRegion&);
template absl::Status MakeRegion<void*>(void*, absl::Span<const int64_t>, absl::Span<const int64_t>,
                                        MutableRegion&);

#ifdef WSYNC_QUANT_X86_KERNELS
namespace internal {

bool CpuHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  }();
  return has;
}

bool CpuHasAvx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return CpuHasAvx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

}  // namespace internal
#endif  // WSYNC_QUANT_X86_KERNELS

absl::string_view Fp8KernelName(Fp8Kernel kernel) {
  switch (kernel) {
    case Fp8Kernel::kPortable:
      return "portable";
    case Fp8Kernel::kAvx2:
      return "avx2";
    case Fp8Kernel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::vector<Fp8Kernel> RunnableFp8Kernels() {
  std::vector<Fp8Kernel> kernels;
  for (const Fp8Kernel kernel : {Fp8Kernel::kPortable, Fp8Kernel::kAvx2, Fp8Kernel::kAvx512}) {
    if (Runnable(kernel)) kernels.push_back(kernel);
  }
  return kernels;
}

Fp8Kernel SelectedFp8Kernel() {
  static const Fp8Kernel selected = ChooseKernel();
  return selected;
}

absl::Status QuantizeFp8WithKernel(Fp8Kernel kernel, const Fp8Blocking& blocking, DType input_dtype,
                                   const ConstRegion& input, const MutableRegion& fp8,
                                   const MutableRegion& scales, absl::string_view parameter) {
  if (!Runnable(kernel)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", Fp8KernelName(kernel), " FP8 kernel is not in this build or not run by this CPU"));
  }
  if (absl::Status status = CheckArguments(blocking, input_dtype, input, fp8, scales, parameter);
      !status.ok()) {
    return status;
  }
  const KernelEntry& entry = EntryOf(kernel);
  return input_dtype == DType::kBFloat16 ? entry.bf16(blocking, input, fp8, scales, parameter)
                                         : entry.fp32(blocking, input, fp8, scales, parameter);
}

absl::Status QuantizeFp8(const Fp8Blocking& blocking, DType input_dtype, const ConstRegion& input,
                         const MutableRegion& fp8, const MutableRegion& scales,
                         absl::string_view parameter) {
  return QuantizeFp8WithKernel(SelectedFp8Kernel(), blocking, input_dtype, input, fp8, scales,
                               parameter);
}

uint8_t EncodeE4m3Saturating(float value) { return Encode(value); }  // Baseline ISA.

AxisRange WholeBlocks(int64_t block, int64_t axis_extent, AxisRange range) {
  if (range.extent == 0) return range;
  if (block >= axis_extent) return {0, axis_extent};
  const int64_t begin = range.origin / block * block;
  const int64_t end = range.origin + range.extent;
  const int64_t rounded_end = std::min(axis_extent, (end + block - 1) / block * block);
  return {begin, rounded_end - begin};
}

bool IsWholeBlocks(int64_t block, int64_t axis_extent, AxisRange range) {
  const AxisRange whole = WholeBlocks(block, axis_extent, range);
  return whole.origin == range.origin && whole.extent == range.extent;
}

AxisRange ScaleRange(int64_t block, int64_t axis_extent, AxisRange range) {
  if (block >= axis_extent) return {0, range.extent == 0 ? 0 : 1};
  return {range.origin / block, BlockCount(block, range.extent)};
}

}  // namespace wsync::quant
