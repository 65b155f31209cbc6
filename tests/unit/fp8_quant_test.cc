// quant/fp8.h against the reference quantizer (integration/fill/fp8_reference.h), bit for bit, over
// random shapes and values, strided regions, TP and EP cuts, and the edge values of the format.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quant/fp8.h"
#include "integration/fill/fp8_reference.h"
#include "tests/unit/fp8_test_support.h"

namespace wsync::fp8_test {
namespace {

using ::testing::HasSubstr;
using testing::ReferenceDecodeE4m3;
using testing::ReferenceEncodeE4m3;

TEST(Fp8ReferenceTest, EncodesKnownValues) {
  EXPECT_EQ(ReferenceEncodeE4m3(1.0), 0x38);
  EXPECT_EQ(ReferenceEncodeE4m3(-2.0), 0xc0);
  EXPECT_EQ(ReferenceEncodeE4m3(448.0), 0x7e);
  EXPECT_EQ(ReferenceEncodeE4m3(std::ldexp(1.0, -6)), 0x08);   // smallest normal
  EXPECT_EQ(ReferenceEncodeE4m3(std::ldexp(1.0, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(ReferenceEncodeE4m3(std::ldexp(1.0, -10)), 0x00);  // tie to even (0)
  EXPECT_EQ(ReferenceEncodeE4m3(-0.0), 0x80);
  EXPECT_EQ(ReferenceDecodeE4m3(0x7e), 448.0);
  EXPECT_EQ(ReferenceDecodeE4m3(0x01), std::ldexp(1.0, -9));
  EXPECT_TRUE(std::isnan(ReferenceDecodeE4m3(0x7f)));
  EXPECT_TRUE(std::isnan(ReferenceDecodeE4m3(0xff)));
}

// Every finite code round-trips; every midpoint between neighbours goes to the even code, and a
// hair either side of it to the nearer one; in the kernels' encoder and the reference alike.
TEST(Fp8EncodeTest, EveryCodeAndEveryMidpointAgreeWithTheReference) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;
    const double value = ReferenceDecodeE4m3(code);
    EXPECT_EQ(ReferenceEncodeE4m3(value), code);
    EXPECT_EQ(quant::EncodeE4m3Saturating(static_cast<float>(value)), code) << value;
    if ((code & 0x7f) == 0x7e) continue;  // 448: no larger neighbour
    const double next = ReferenceDecodeE4m3(code + 1);
    const float mid = static_cast<float>((value + next) / 2);  // 5 significant bits: exact
    ASSERT_EQ(mid, (value + next) / 2);
    const int even = (code & 1) == 0 ? code : code + 1;
    EXPECT_EQ(ReferenceEncodeE4m3(mid), even);
    EXPECT_EQ(quant::EncodeE4m3Saturating(mid), even) << mid;
    const float toward_next = std::nextafter(mid, static_cast<float>(next));
    const float toward_value = std::nextafter(mid, static_cast<float>(value));
    EXPECT_EQ(quant::EncodeE4m3Saturating(toward_next), code + 1) << toward_next;
    EXPECT_EQ(quant::EncodeE4m3Saturating(toward_value), code) << toward_value;
    EXPECT_EQ(ReferenceEncodeE4m3(toward_next), code + 1);
    EXPECT_EQ(ReferenceEncodeE4m3(toward_value), code);
  }
}

TEST(Fp8EncodeTest, RandomFloatsAgreeWithTheReference) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    if (i % 2 == 0) bits = (bits & 0x807fffff) | ((110 + rng() % 30) << 23);  // near e4m3 range
    float value;
    std::memcpy(&value, &bits, sizeof value);
    if (!std::isfinite(value)) continue;
    ASSERT_EQ(quant::EncodeE4m3Saturating(value), ReferenceEncodeE4m3(value)) << value;
  }
}

TEST(Fp8EncodeTest, SaturatesAtTheFormatMaximum) {
  for (const float value :
       {448.0f, 463.9f, 464.0f, 480.0f, 1e9f, std::numeric_limits<float>::max()}) {
    EXPECT_EQ(quant::EncodeE4m3Saturating(value), 0x7e) << value;
    EXPECT_EQ(quant::EncodeE4m3Saturating(-value), 0xfe) << value;
    EXPECT_EQ(ReferenceEncodeE4m3(value), 0x7e) << value;
    EXPECT_EQ(ReferenceEncodeE4m3(-value), 0xfe) << value;
  }
}

TEST(Fp8QuantizeTest, RandomShapesAndBlockingsMatchTheReference) {
  std::mt19937_64 rng(11);
  for (int iteration = 0; iteration < 150; ++iteration) {
    const int64_t experts = 1 + rng() % 3;
    const int64_t rows = 1 + rng() % 300;
    const int64_t cols = 1 + rng() % 300;
    const Fp8Blocking blocking = RandomBlocking(rng);
    SCOPED_TRACE(::testing::Message() << "[" << experts << ", " << rows << ", " << cols
                                      << "] blocks " << blocking.rows << " x " << blocking.cols);
    const Tensor t = RandomTensor(rng, experts, rows, cols);
    ExpectIdentical(Fast(blocking, t), Reference(blocking, t));
  }
}

TEST(Fp8QuantizeTest, Fp32InputMatchesTheReference) {
  std::mt19937_64 rng(12);
  for (int iteration = 0; iteration < 40; ++iteration) {
    const int64_t rows = 1 + rng() % 200, cols = 1 + rng() % 200;
    const Fp8Blocking blocking = RandomBlocking(rng);
    std::vector<float> values(rows * cols);
    std::vector<double> exact;
    for (float& v : values) {
      v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                     std::uniform_int_distribution<int>(-40, 40)(rng));
      exact.push_back(v);
    }
    const int64_t sr = quant::BlockCount(blocking.rows, rows);
    const int64_t sc = quant::BlockCount(blocking.cols, cols);
    Quantized fast{std::vector<uint8_t>(values.size()), std::vector<float>(sr * sc)};
    ASSERT_TRUE(quant::QuantizeFp8(blocking, DType::kFloat32,
                                   PackedIn(values.data(), 1, rows, cols),
                                   PackedOut(fast.fp8.data(), 1, rows, cols),
                                   PackedOut(fast.scales.data(), 1, sr, sc), "w")
                    .ok());
    absl::StatusOr<ReferenceFp8> ref =
        ReferenceQuantizeFp8(exact, 1, rows, cols, blocking.rows, blocking.cols, "w");
    ASSERT_TRUE(ref.ok()) << ref.status();
    ExpectIdentical(fast, *ref);
  }
}

// Strided input (padded rows; a transposed, column-major tensor), strided FP8 output (a part of a
// fused buffer) and strided scales give the packed result.
TEST(Fp8QuantizeTest, StridedRegionsGiveThePackedResult) {
  std::mt19937_64 rng(13);
  for (int iteration = 0; iteration < 30; ++iteration) {
    const int64_t experts = 1 + rng() % 2, rows = 1 + rng() % 260, cols = 1 + rng() % 260;
    const Fp8Blocking blocking = RandomBlocking(rng);
    const Tensor t = RandomTensor(rng, experts, rows, cols);
    const Quantized packed = Fast(blocking, t);
    const bool transposed = iteration % 2 == 1;
    const int64_t pad = 1 + rng() % 5;
    // Input: padded rows, or column-major matrices (row stride 1, column stride rows + pad).
    const int64_t matrix = transposed ? cols * (rows + pad) : rows * (cols + pad);
    std::vector<uint16_t> input(experts * matrix, Bf16Bits(1e30f));
    ConstRegion in{input.data(),
                   experts,
                   rows,
                   cols,
                   matrix,
                   transposed ? 1 : cols + pad,
                   transposed ? rows + pad : 1};
    // Output: the second part of a fused [experts, 2 * rows + 3, cols] buffer.
    const int64_t fused_rows = 2 * rows + 3;
    std::vector<uint8_t> fused(experts * fused_rows * cols, 0xaa);
    MutableRegion out{
        fused.data() + (rows + 3) * cols, experts, rows, cols, fused_rows * cols, cols, 1};
    const int64_t sr = quant::BlockCount(blocking.rows, rows);
    const int64_t sc = quant::BlockCount(blocking.cols, cols);
    std::vector<float> scales(experts * sr * sc * 2, -1.0f);
    MutableRegion scale_out{scales.data(), experts, sr, sc, sr * sc * 2, sc * 2, 2};
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          input[e * in.expert_stride + r * in.row_stride + c * in.col_stride] =
              t.bits[(e * rows + r) * cols + c];
        }
      }
    }
    ASSERT_TRUE(quant::QuantizeFp8(blocking, DType::kBFloat16, in, out, scale_out, "w").ok());
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t i = 0; i < (rows + 3) * cols; ++i)
        ASSERT_EQ(fused[e * fused_rows * cols + i], 0xaa);
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_EQ(fused[e * fused_rows * cols + (rows + 3) * cols + i],
                  packed.fp8[e * rows * cols + i]);
      }
      for (int64_t i = 0; i < sr * sc; ++i) {
        ASSERT_EQ(Bits(scales[e * sr * sc * 2 + i * 2]), Bits(packed.scales[e * sr * sc + i]));
        ASSERT_EQ(scales[e * sr * sc * 2 + i * 2 + 1], -1.0f);
      }
    }
  }
}

}  // namespace
}  // namespace wsync::fp8_test
