#ifndef WSYNC_TESTS_UNIT_FP8_TEST_SUPPORT_H_
#define WSYNC_TESTS_UNIT_FP8_TEST_SUPPORT_H_

// Helpers of the FP8 quantization tests: random bf16 tensors, the fast kernel and the reference
// over a packed tensor, and a bit-for-bit comparison.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "quant/fp8.h"
#include "integration/fill/fp8_reference.h"

namespace wsync::fp8_test {

using quant::ConstRegion;
using quant::Fp8Blocking;
using quant::MutableRegion;
using testing::Bf16Bits;
using testing::Bf16Value;
using testing::ReferenceFp8;
using testing::ReferenceQuantizeFp8;

inline uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// A bf16 tensor [experts, rows, cols], row-major.
struct Tensor {
  int64_t experts = 1, rows = 0, cols = 0;
  std::vector<uint16_t> bits;

  uint16_t& at(int64_t e, int64_t r, int64_t c) { return bits[(e * rows + r) * cols + c]; }
  std::vector<double> Values() const {
    std::vector<double> values;
    for (const uint16_t b : bits) values.push_back(Bf16Value(b));
    return values;
  }
};

// Values spread over the whole bf16 range: mostly normal numbers of random binade (2^-30..2^20),
// some zeros (both signs), bf16 subnormals, huge values, and exactly +-448.
inline uint16_t RandomBf16(std::mt19937_64& rng) {
  const int kind = std::uniform_int_distribution<int>(0, 99)(rng);
  const bool negative = rng() & 1;
  float value;
  if (kind < 5) {
    value = 0;
  } else if (kind < 10) {
    return static_cast<uint16_t>((negative ? 0x8000 : 0) | (1 + rng() % 0x7f));  // subnormal
  } else if (kind < 13) {
    value = std::ldexp(1.0f + (rng() % 128) / 128.0f, 100 + static_cast<int>(rng() % 27));
  } else if (kind < 15) {
    value = 448;
  } else {
    const int binade = std::uniform_int_distribution<int>(-30, 20)(rng);
    value = std::ldexp(1.0f + (rng() % 128) / 128.0f, binade);
  }
  return Bf16Bits(negative ? -value : value);
}

inline Tensor RandomTensor(std::mt19937_64& rng, int64_t experts, int64_t rows, int64_t cols) {
  Tensor t{experts, rows, cols, {}};
  // Blocks of one magnitude as well as mixed ones: a narrow range in some tensors.
  const bool narrow = rng() % 3 == 0;
  const int binade = std::uniform_int_distribution<int>(-12, 12)(rng);
  t.bits.resize(experts * rows * cols);
  for (uint16_t& b : t.bits) {
    b = narrow ? Bf16Bits(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), binade))
               : RandomBf16(rng);
  }
  return t;
}

inline ConstRegion PackedIn(const void* base, int64_t experts, int64_t rows, int64_t cols) {
  return {base, experts, rows, cols, rows * cols, cols, 1};
}
inline MutableRegion PackedOut(void* base, int64_t experts, int64_t rows, int64_t cols) {
  return {base, experts, rows, cols, rows * cols, cols, 1};
}

struct Quantized {
  std::vector<uint8_t> fp8;
  std::vector<float> scales;
};

inline Quantized Fast(const Fp8Blocking& blocking, const Tensor& t) {
  Quantized q;
  const int64_t sr = quant::BlockCount(blocking.rows, t.rows);
  const int64_t sc = quant::BlockCount(blocking.cols, t.cols);
  q.fp8.assign(t.bits.size(), 0xff);
  q.scales.assign(t.experts * sr * sc, -1.0f);
  const absl::Status status = quant::QuantizeFp8(
      blocking, DType::kBFloat16, PackedIn(t.bits.data(), t.experts, t.rows, t.cols),
      PackedOut(q.fp8.data(), t.experts, t.rows, t.cols),
      PackedOut(q.scales.data(), t.experts, sr, sc), "w");
  EXPECT_TRUE(status.ok()) << status;
  return q;
}

inline ReferenceFp8 Reference(const Fp8Blocking& blocking, const Tensor& t) {
  absl::StatusOr<ReferenceFp8> ref = ReferenceQuantizeFp8(t.Values(), t.experts, t.rows, t.cols,
                                                          blocking.rows, blocking.cols, "w");
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? *ref : ReferenceFp8{};
}

inline void ExpectIdentical(const Quantized& fast, const ReferenceFp8& ref) {
  ASSERT_EQ(fast.fp8.size(), ref.fp8.size());
  ASSERT_EQ(fast.scales.size(), ref.scales.size());
  for (size_t i = 0; i < ref.fp8.size(); ++i) {
    ASSERT_EQ(fast.fp8[i], ref.fp8[i]) << "element " << i;
  }
  for (size_t i = 0; i < ref.scales.size(); ++i) {
    ASSERT_EQ(Bits(fast.scales[i]), Bits(ref.scales[i])) << "scale " << i;
  }
}

inline Fp8Blocking RandomBlocking(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      return Fp8Blocking::Block();
    case 1:
      return Fp8Blocking::PerChannel();
    case 2:
      return Fp8Blocking::PerTensor();
    default:  // Small blocks: many ragged blocks in a small tensor.
      return Fp8Blocking::Block(1 + rng() % 9, 1 + rng() % 9);
  }
}

}  // namespace wsync::fp8_test

#endif  // WSYNC_TESTS_UNIT_FP8_TEST_SUPPORT_H_
