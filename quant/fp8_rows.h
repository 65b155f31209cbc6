#ifndef WSYNC_QUANT_FP8_ROWS_H_
#define WSYNC_QUANT_FP8_ROWS_H_

// Internal to quant/ (fp8.cc): the hand-vectorized quantization of contiguous bf16 rows, the step
// of QuantizeFp8 that bounds its speed, for AVX2 (fp8_avx2.cc, 32 elements a step) and AVX-512
// (fp8_avx512.cc, 64 a step). The same arithmetic as the portable encoder of fp8.cc (one IEEE
// fp32 division per element, the e4m3 rounding in integer code), so the bits are the same; each
// file states why.
//
// Built on x86-64 with GCC or clang, in every build type (the sanitizer builds too): each kernel
// is compiled for its instruction set with a target attribute and chosen at run time
// (fp8_kernels.cc), with no ifunc resolver (which would run before the ThreadSanitizer runtime is
// initialised).

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#define WSYNC_QUANT_X86_KERNELS 1
#endif

#ifdef WSYNC_QUANT_X86_KERNELS
namespace wsync::quant::internal {

// The steps both kernels take for each element, bit for bit those of fp8.cc's portable Encode of
// the same IEEE fp32 quotient q = x / scale:
// - Sign apart: RN(x / s) = sign(x) * RN(|x| / s) for s > 0 (rounding to nearest is symmetric),
//   and Encode takes the quotient's sign bit, which is x's (-0 included: code 0x80). The kernels
//   divide |x| (one IEEE division per element, as the scalar code) and OR x's sign bit into the
//   code byte.
// - Widening: interleaving a zero word below each bf16 word gives the dword whose fp32 value is
//   the bf16 value; packing the dword codes back (packus, lane by lane) and one permutation of
//   qwords restores the element order.
// - Normal range (|q| >= 2^-6): Encode's (m + 0x7ffff + lsb) >> 20, less the exponent rebias
//   0x3c0, where m = bits of |q| and lsb = bit 20 of m; m >= 0x3c800000 there, so the rebias
//   0x3c0 << 20 is subtracted before the shift without a borrow.
// - Subnormal range (|q| < 2^-6): Encode's fp32 addition |q| + 2^14 (rounds to a multiple of 2^-9,
//   ties to even), less the bits of 2^14, selected by the same comparison m < 0x3c800000.
// - Saturation: Encode clamps m to 448 first (code 0x7e). Rounding is monotone, so the unclamped
//   code is >= 0x7e exactly where |q| >= 448; every dword code lies in 0 .. 0x438 (0x438: |q| =
//   infinity), packs without saturation, and min(code, 0x7e) is Encode's.
// - Division, not a reciprocal multiply (x * (1 / s), with an exact fallback where the product
//   lies within a few ulps of an e4m3 rounding tie, or corrected by fused multiply-adds): both were
//   measured and ran slower (quant/README.md).
constexpr int kMantissaShift = 20;                               // fp32 mantissa bits below e4m3's
constexpr int32_t kRoundHalfDown = 0x7ffff;                      // 2^19 - 1
constexpr int32_t kRebias = static_cast<int32_t>(0x3c0u << 20);  // (127 - 7) << 3, at bit 20
constexpr int32_t kBitsMinNormal = 0x3c800000;                   // 2^-6, e4m3's smallest normal
constexpr float kSubnormalMagic = 16384.0f;                      // 2^14: its ulp is 2^-9
constexpr int32_t kBitsSubnormalMagic = 0x46800000;              // bits of 2^14
constexpr int16_t kMaxCode = 0x7e;                               // 448

// True when the CPU runs the x86-64-v3 code (AVX2, FMA, BMI1/2): QuantizeBf16RowAvx2 and
// fp8.cc's v3 build of the element loops.
bool CpuHasAvx2();
// True when the CPU runs the x86-64-v4 code (AVX-512 F, BW, CD, DQ, VL): QuantizeBf16RowAvx512
// and fp8.cc's v4 build of the element loops.
bool CpuHasAvx512();

// Each quantizes one contiguous row of `cols` bf16 elements into `cols` contiguous e4m3 bytes:
// the row's column blocks of `block_cols` elements (the last one ragged) each divided by its
// scale, `scales[block]`, element by element: out[c] = e4m3(clamp(fp32(row[c] / scales[c /
// block_cols]), +-448)), round to nearest even. `next_row` (null, or another row of `cols`
// elements that the caller reads next) is prefetched into the cache alongside. Require finite
// elements, normal positive scales, block_cols >= 1, and the CPU features above. `row` and `out`
// must not overlap. Neither reads or writes past the row.
void QuantizeBf16RowAvx2(const uint16_t* row, int64_t cols, int64_t block_cols, const float* scales,
                         uint8_t* out, const uint16_t* next_row);
void QuantizeBf16RowAvx512(const uint16_t* row, int64_t cols, int64_t block_cols,
                           const float* scales, uint8_t* out, const uint16_t* next_row);

}  // namespace wsync::quant::internal
#endif  // WSYNC_QUANT_X86_KERNELS

#endif  // WSYNC_QUANT_FP8_ROWS_H_
