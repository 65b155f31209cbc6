#include "quant/fp8_rows.h"

#ifdef WSYNC_QUANT_X86_KERNELS

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

// The e4m3 codes of 64 bf16 elements at a time by fp8_rows.h's steps, on 512-bit vectors (one
// vdivps per 16 elements; the subnormal code selected by a mask; masked loads and stores for the
// tails).

namespace wsync::quant::internal {
namespace {

#define WSYNC_V4_INLINE __attribute__((target("arch=x86-64-v4"), always_inline)) inline

// The codes (dwords, without sign) of 16 non-negative fp32 values divided by `scale`.
WSYNC_V4_INLINE __m512i Codes16(__m512i magnitudes, __m512 scale) {
  const __m512 quotient = _mm512_div_ps(_mm512_castsi512_ps(magnitudes), scale);
  const __m512i m = _mm512_castps_si512(quotient);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(m, kMantissaShift), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_add_epi32(_mm512_add_epi32(m, _mm512_set1_epi32(kRoundHalfDown - kRebias)), lsb);
  const __m512i normal = _mm512_srli_epi32(rounded, kMantissaShift);
  const __m512i subnormal =
      _mm512_castps_si512(_mm512_add_ps(quotient, _mm512_set1_ps(kSubnormalMagic)));
  const __mmask16 is_subnormal = _mm512_cmplt_epu32_mask(m, _mm512_set1_epi32(kBitsMinNormal));
  return _mm512_mask_sub_epi32(normal, is_subnormal, subnormal,
                               _mm512_set1_epi32(kBitsSubnormalMagic));
}

// The 64 code bytes of the bf16 words w0 (elements 0..31) and w1 (32..63), in element order.
WSYNC_V4_INLINE __m512i Encode64(__m512i w0, __m512i w1, __m512 scale) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i signs = _mm512_packus_epi16(_mm512_srli_epi16(w0, 8), _mm512_srli_epi16(w1, 8));
  const __m512i abs0 = _mm512_and_si512(w0, _mm512_set1_epi16(0x7fff));
  const __m512i abs1 = _mm512_and_si512(w1, _mm512_set1_epi16(0x7fff));
  const __m512i max_code = _mm512_set1_epi16(kMaxCode);
  const __m512i codes0 =
      _mm512_min_epu16(_mm512_packus_epi32(Codes16(_mm512_unpacklo_epi16(zero, abs0), scale),
                                           Codes16(_mm512_unpackhi_epi16(zero, abs0), scale)),
                       max_code);
  const __m512i codes1 =
      _mm512_min_epu16(_mm512_packus_epi32(Codes16(_mm512_unpacklo_epi16(zero, abs1), scale),
                                           Codes16(_mm512_unpackhi_epi16(zero, abs1), scale)),
                       max_code);
  // codes | (signs & 0x80); lane j holds elements 8j..8j+7 and 32+8j..32+8j+7.
  const __m512i bytes = _mm512_ternarylogic_epi32(_mm512_packus_epi16(codes0, codes1), signs,
                                                  _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);
  return _mm512_permutexvar_epi64(_mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0), bytes);
}

}  // namespace

__attribute__((target("arch=x86-64-v4"))) void QuantizeBf16RowAvx512(
    const uint16_t* row, int64_t cols, int64_t block_cols, const float* scales, uint8_t* out,
    const uint16_t* next_row) {
  for (int64_t c0 = 0, block = 0; c0 < cols; c0 += block_cols, ++block) {
    const int64_t count = std::min(block_cols, cols - c0);
    const __m512 scale = _mm512_set1_ps(scales[block]);
    const uint16_t* in = row + c0;
    uint8_t* codes = out + c0;
    int64_t i = 0;
    for (; i + 64 <= count; i += 64) {
      if (next_row != nullptr) {  // The two cache lines of the next row's same 64 elements.
        _mm_prefetch(reinterpret_cast<const char*>(next_row + c0 + i), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(next_row + c0 + i + 32), _MM_HINT_T0);
      }
      _mm512_storeu_si512(
          codes + i, Encode64(_mm512_loadu_si512(in + i), _mm512_loadu_si512(in + i + 32), scale));
    }
    if (i < count) {  // Masked: no access past the block (masked stores are slow; tails only).
      const __mmask64 mask = ~uint64_t{0} >> (64 - (count - i));
      const __m512i w0 = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(mask), in + i);
      const uint16_t* upper = in + i + std::min<int64_t>(32, count - i);  // At most the end.
      const __m512i w1 = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(mask >> 32), upper);
      _mm512_mask_storeu_epi8(codes + i, mask, Encode64(w0, w1, scale));
    }
  }
}

}  // namespace wsync::quant::internal

#endif  // WSYNC_QUANT_X86_KERNELS
