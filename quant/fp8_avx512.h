#ifndef WSYNC_QUANT_FP8_AVX512_H_
#define WSYNC_QUANT_FP8_AVX512_H_

// Internal to quant/ (fp8.cc): the AVX-512 quantization of contiguous bf16 rows, the step of
// QuantizeFp8 that bounds its speed. The same arithmetic as the portable encoder of fp8.cc (one
// IEEE fp32 division per element, the e4m3 rounding in integer code), so the bits are the same;
// fp8_avx512.cc states why.

#include <cstdint>

// Function multiversioning (fp8.cc's target_clones and this AVX-512 path) with GCC on x86-64,
// except in the sanitizer builds: target_clones' ifunc resolvers run before the ThreadSanitizer
// runtime is initialised (quant/CMakeLists.txt). Without it the portable code alone runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(WSYNC_QUANT_NO_CLONES)
#define WSYNC_QUANT_MULTIVERSION 1
#endif

#ifdef WSYNC_QUANT_MULTIVERSION
namespace wsync::quant::internal {

// True when the CPU runs QuantizeBf16RowAvx512 (x86-64-v4: AVX-512 F, BW, CD, DQ, VL).
bool HasAvx512Rows();

// Quantizes one contiguous row of `cols` bf16 elements into `cols` contiguous e4m3 bytes: the
// row's column blocks of `block_cols` elements (the last one ragged) each divided by its scale,
// `scales[block]`, element by element: out[c] = e4m3(clamp(fp32(row[c] / scales[c / block_cols]),
// +-448)), round to nearest even. `next_row` (null, or another row of `cols` elements that the
// caller reads next) is prefetched into the cache alongside. Requires HasAvx512Rows(), finite
// elements, normal positive scales, block_cols >= 1. `row` and `out` must not overlap.
void QuantizeBf16RowAvx512(const uint16_t* row, int64_t cols, int64_t block_cols,
                           const float* scales, uint8_t* out, const uint16_t* next_row);

}  // namespace wsync::quant::internal
#endif  // WSYNC_QUANT_MULTIVERSION

#endif  // WSYNC_QUANT_FP8_AVX512_H_
