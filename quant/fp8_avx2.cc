#include "quant/fp8_rows.h"

#ifdef WSYNC_QUANT_X86_KERNELS

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

// The e4m3 codes of 32 bf16 elements at a time by fp8_rows.h's steps, on 256-bit vectors:
// - Widening: within each 128-bit lane, unpacklo/unpackhi take words 0-3 and 4-7, and
//   packus_epi32 of their codes puts them back in order, so the 16 dword codes of one vector of
//   words return as 16 words in element order. packus_epi16 of two such vectors (elements 0-15
//   and 16-31) interleaves their lanes (qwords: 0-7, 16-23, 8-15, 24-31): one qword permutation
//   restores the order.
// - The subnormal selection compares m signed: m is the bits of a non-negative value, below 2^31.
// - Quotients of at least 2^-6 only: where every magnitude of the 32 is at least the bf16 x0 =
//   2^-6 * scale (rounded up to bf16; the product is exact), every quotient is (RN is monotone
//   and 2^-6 is an fp32), so the subnormal encoding and its selection are left out. Weights
//   rarely hold such small values beside their block's largest; zeros do and take the full path.
// - Tails (fewer than 32 elements left in a block): copied into a zeroed buffer of 32, encoded the
//   same way, and the codes of the real elements copied out; nothing past the row is touched.

namespace wsync::quant::internal {
namespace {

#define WSYNC_V3_INLINE __attribute__((target("arch=x86-64-v3"), always_inline)) inline

constexpr int kStep = 32;  // Elements per step.

// The codes (dwords, without sign) of 8 non-negative fp32 values divided by `scale`. Without
// `kSubnormals` the caller guarantees every quotient is at least 2^-6 (no subnormal code; a zero
// magnitude is below that).
template <bool kSubnormals>
WSYNC_V3_INLINE __m256i Codes8(__m256i magnitudes, __m256 scale) {
  const __m256 quotient = _mm256_div_ps(_mm256_castsi256_ps(magnitudes), scale);
  const __m256i m = _mm256_castps_si256(quotient);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(m, kMantissaShift), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_add_epi32(_mm256_add_epi32(m, _mm256_set1_epi32(kRoundHalfDown - kRebias)), lsb);
  const __m256i normal = _mm256_srli_epi32(rounded, kMantissaShift);
  if constexpr (!kSubnormals) return normal;
  const __m256i subnormal = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(quotient, _mm256_set1_ps(kSubnormalMagic))),
      _mm256_set1_epi32(kBitsSubnormalMagic));
  const __m256i is_subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(kBitsMinNormal), m);
  return _mm256_blendv_epi8(normal, subnormal, is_subnormal);
}

// The 16 codes (words, without sign, saturated) of the 16 bf16 magnitudes of `magnitudes`, in
// order.
template <bool kSubnormals>
WSYNC_V3_INLINE __m256i Codes16(__m256i magnitudes, __m256 scale) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i codes =
      _mm256_packus_epi32(Codes8<kSubnormals>(_mm256_unpacklo_epi16(zero, magnitudes), scale),
                          Codes8<kSubnormals>(_mm256_unpackhi_epi16(zero, magnitudes), scale));
  return _mm256_min_epu16(codes, _mm256_set1_epi16(kMaxCode));
}

// The 32 code bytes of the bf16 words w0 (elements 0..15) and w1 (16..31), whose magnitudes are
// a0 and a1, in element order.
template <bool kSubnormals>
WSYNC_V3_INLINE __m256i Encode32(__m256i w0, __m256i w1, __m256i a0, __m256i a1, __m256 scale) {
  const __m256i signs =
      _mm256_and_si256(_mm256_packus_epi16(_mm256_srli_epi16(w0, 8), _mm256_srli_epi16(w1, 8)),
                       _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i bytes = _mm256_or_si256(
      _mm256_packus_epi16(Codes16<kSubnormals>(a0, scale), Codes16<kSubnormals>(a1, scale)), signs);
  return _mm256_permute4x64_epi64(bytes, _MM_SHUFFLE(3, 1, 2, 0));
}

// Encode32 of 32 bf16 words, without the subnormal encoding when every magnitude is at least
// `least_normal` (the bf16 bits from which the quotient is at least 2^-6).
WSYNC_V3_INLINE __m256i Encode32(__m256i w0, __m256i w1, __m256 scale, __m256i least_normal) {
  const __m256i a0 = _mm256_and_si256(w0, _mm256_set1_epi16(0x7fff));
  const __m256i a1 = _mm256_and_si256(w1, _mm256_set1_epi16(0x7fff));
  // Magnitudes are at most 0x7f7f (finite), so the signed comparison orders them.
  const __m256i below =
      _mm256_or_si256(_mm256_cmpgt_epi16(least_normal, a0), _mm256_cmpgt_epi16(least_normal, a1));
  if (_mm256_testz_si256(below, below)) return Encode32<false>(w0, w1, a0, a1, scale);
  return Encode32<true>(w0, w1, a0, a1, scale);
}

// The bf16 bits of the least magnitude x with x >= 2^-6 * scale (exact: a power-of-two multiple
// of a normal scale above 1e-10 / 448), from which RN(x / scale) >= 2^-6: bits(x) << 16 >=
// bits(2^-6 * scale) for non-negative x.
inline int16_t LeastNormalBf16(float scale) {
  const float threshold = scale * (1.0f / 64);
  uint32_t bits;
  std::memcpy(&bits, &threshold, sizeof bits);
  return static_cast<int16_t>((bits + 0xffff) >> 16);
}

}  // namespace

__attribute__((target("arch=x86-64-v3"))) void QuantizeBf16RowAvx2(const uint16_t* row,
                                                                   int64_t cols, int64_t block_cols,
                                                                   const float* scales,
                                                                   uint8_t* out,
                                                                   const uint16_t* next_row) {
  for (int64_t c0 = 0, block = 0; c0 < cols; c0 += block_cols, ++block) {
    const int64_t count = std::min(block_cols, cols - c0);
    const __m256 scale = _mm256_set1_ps(scales[block]);
    const __m256i least_normal = _mm256_set1_epi16(LeastNormalBf16(scales[block]));
    const uint16_t* in = row + c0;
    uint8_t* codes = out + c0;
    int64_t i = 0;
    for (; i + kStep <= count; i += kStep) {
      if (next_row != nullptr) {  // The cache line of the next row's same 32 elements.
        _mm_prefetch(reinterpret_cast<const char*>(next_row + c0 + i), _MM_HINT_T0);
      }
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i),
                          Encode32(w0, w1, scale, least_normal));
    }
    if (i < count) {
      alignas(32) uint16_t words[kStep] = {};
      alignas(32) uint8_t bytes[kStep];
      std::memcpy(words, in + i, (count - i) * sizeof(uint16_t));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes),
                         Encode32(_mm256_load_si256(reinterpret_cast<const __m256i*>(words)),
                                  _mm256_load_si256(reinterpret_cast<const __m256i*>(words + 16)),
                                  scale, least_normal));
      std::memcpy(codes + i, bytes, count - i);
    }
  }
}

}  // namespace wsync::quant::internal

#endif  // WSYNC_QUANT_X86_KERNELS
