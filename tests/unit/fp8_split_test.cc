// quant/fp8.h on the parts of a parameter that a sync quantizes: a box of whole blocks quantized
// by a sender straight from its shard, or gathered by a receiver from several shards (a TP cut
// inside a block, EP shards of expert tensors), equals the whole parameter's quantization bit for
// bit. Also the format's edges (zero blocks, saturation, subnormals), NaN refused, the dequantized
// error bound, and bad arguments.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
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

using quant::AxisRange;
using ::testing::HasSubstr;
using testing::ReferenceDecodeE4m3;

// A box of a 3-D tensor [experts, rows, cols].
using Box3 = std::array<AxisRange, 3>;

std::array<int64_t, 3> BlockSizes(const Fp8Blocking& blocking) {
  return {1, blocking.rows, blocking.cols};
}

// One TP or EP shard of the trainer: the box it holds and its elements, packed.
struct Shard {
  Box3 box;
  std::vector<uint16_t> bits;
};

std::vector<Shard> Split(const Tensor& t, int axis, int parts) {
  const std::array<int64_t, 3> extent = {t.experts, t.rows, t.cols};
  std::vector<Shard> shards;
  for (int p = 0; p < parts; ++p) {
    Shard shard;
    for (int a = 0; a < 3; ++a) shard.box[a] = {0, extent[a]};
    const int64_t begin = extent[axis] * p / parts, end = extent[axis] * (p + 1) / parts;
    shard.box[axis] = {begin, end - begin};
    const Box3& b = shard.box;
    for (int64_t e = b[0].origin; e < b[0].origin + b[0].extent; ++e) {
      for (int64_t r = b[1].origin; r < b[1].origin + b[1].extent; ++r) {
        for (int64_t c = b[2].origin; c < b[2].origin + b[2].extent; ++c) {
          shard.bits.push_back(t.bits[(e * t.rows + r) * t.cols + c]);
        }
      }
    }
    if (!shard.bits.empty()) shards.push_back(std::move(shard));
  }
  return shards;
}

// What a receiver does for a box whose blocks span several sources: copy each shard's part of
// the box into one packed bf16 buffer (as the executor unpacks pieces into an arena).
std::vector<uint16_t> Gather(const std::vector<Shard>& shards, const Box3& box) {
  std::vector<uint16_t> out(box[0].extent * box[1].extent * box[2].extent);
  for (const Shard& s : shards) {
    std::array<int64_t, 3> lo, hi;
    for (int a = 0; a < 3; ++a) {
      lo[a] = std::max(box[a].origin, s.box[a].origin);
      hi[a] = std::min(box[a].origin + box[a].extent, s.box[a].origin + s.box[a].extent);
    }
    for (int64_t e = lo[0]; e < hi[0]; ++e) {
      for (int64_t r = lo[1]; r < hi[1]; ++r) {
        for (int64_t c = lo[2]; c < hi[2]; ++c) {
          const int64_t from =
              ((e - s.box[0].origin) * s.box[1].extent + r - s.box[1].origin) * s.box[2].extent +
              c - s.box[2].origin;
          const int64_t to =
              ((e - box[0].origin) * box[1].extent + r - box[1].origin) * box[2].extent + c -
              box[2].origin;
          out[to] = s.bits[from];
        }
      }
    }
  }
  return out;
}

// Quantizes the box `box` (whole blocks) of the elements `base` with element strides `strides`.
Quantized QuantizeBox(const Fp8Blocking& blocking, const uint16_t* base,
                      const std::array<int64_t, 3>& strides, const Box3& box) {
  const int64_t e = box[0].extent, r = box[1].extent, c = box[2].extent;
  const int64_t sr = quant::BlockCount(blocking.rows, r), sc = quant::BlockCount(blocking.cols, c);
  Quantized q{std::vector<uint8_t>(e * r * c), std::vector<float>(e * sr * sc)};
  const ConstRegion in{base, e, r, c, strides[0], strides[1], strides[2]};
  const absl::Status status =
      quant::QuantizeFp8(blocking, DType::kBFloat16, in, PackedOut(q.fp8.data(), e, r, c),
                         PackedOut(q.scales.data(), e, sr, sc), "w");
  EXPECT_TRUE(status.ok()) << status;
  return q;
}

// The box's bytes and scales must be the whole tensor's at the same places.
void ExpectPartOfWhole(const Fp8Blocking& blocking, const Tensor& t, const Quantized& whole,
                       const Box3& box, const Quantized& part) {
  const std::array<int64_t, 3> extent = {t.experts, t.rows, t.cols};
  std::array<AxisRange, 3> scale_box;
  for (int a = 0; a < 3; ++a) {
    scale_box[a] = quant::ScaleRange(BlockSizes(blocking)[a], extent[a], box[a]);
  }
  const int64_t sr = quant::BlockCount(blocking.rows, t.rows);
  const int64_t sc = quant::BlockCount(blocking.cols, t.cols);
  int64_t i = 0;
  for (int64_t e = box[0].origin; e < box[0].origin + box[0].extent; ++e) {
    for (int64_t r = box[1].origin; r < box[1].origin + box[1].extent; ++r) {
      for (int64_t c = box[2].origin; c < box[2].origin + box[2].extent; ++c) {
        ASSERT_EQ(part.fp8[i++], whole.fp8[(e * t.rows + r) * t.cols + c])
            << e << " " << r << " " << c;
      }
    }
  }
  ASSERT_EQ(static_cast<int64_t>(part.scales.size()),
            scale_box[0].extent * scale_box[1].extent * scale_box[2].extent);
  i = 0;
  for (int64_t e = scale_box[0].origin; e < scale_box[0].origin + scale_box[0].extent; ++e) {
    for (int64_t r = scale_box[1].origin; r < scale_box[1].origin + scale_box[1].extent; ++r) {
      for (int64_t c = scale_box[2].origin; c < scale_box[2].origin + scale_box[2].extent; ++c) {
        ASSERT_EQ(Bits(part.scales[i++]), Bits(whole.scales[(e * sr + r) * sc + c]));
      }
    }
  }
}

// Random tensors (2-D and 3-D expert tensors), cut by TP along rows or columns or by EP along
// experts at places that are not block boundaries. A receiver's random box, widened to whole
// blocks and gathered from the shards, quantizes to the whole tensor's bytes and scales; so does
// every shard's interior of whole blocks quantized by its sender in place (strided, no copy).
TEST(Fp8SplitTest, SenderAndReceiverQuantizationEqualTheWholeTensors) {
  std::mt19937_64 rng(21);
  for (int iteration = 0; iteration < 120; ++iteration) {
    const int64_t experts = iteration % 3 == 0 ? 1 + rng() % 5 : 1;
    const Fp8Blocking blocking =
        rng() % 2 ? Fp8Blocking::Block() : Fp8Blocking::Block(1 + rng() % 16, 1 + rng() % 16);
    const Tensor t = RandomTensor(rng, experts, 1 + rng() % 320, 1 + rng() % 320);
    const int axis = experts > 1 && rng() % 2 ? 0 : 1 + static_cast<int>(rng() % 2);
    const int parts = 2 + static_cast<int>(rng() % 3);
    SCOPED_TRACE(::testing::Message() << "[" << t.experts << ", " << t.rows << ", " << t.cols
                                      << "] blocks " << blocking.rows << " x " << blocking.cols
                                      << ", axis " << axis << " in " << parts);
    const std::vector<Shard> shards = Split(t, axis, parts);
    const Quantized whole = Fast(blocking, t);
    const std::array<int64_t, 3> extent = {t.experts, t.rows, t.cols};
    const std::array<int64_t, 3> block = BlockSizes(blocking);

    // Receiver side: a random target box, widened to whole blocks, gathered, quantized.
    Box3 target, gathered;
    for (int a = 0; a < 3; ++a) {
      const int64_t begin = rng() % extent[a];
      target[a] = {begin, 1 + static_cast<int64_t>(rng() % (extent[a] - begin))};
      gathered[a] = quant::WholeBlocks(block[a], extent[a], target[a]);
      ASSERT_TRUE(quant::IsWholeBlocks(block[a], extent[a], gathered[a]));
    }
    const std::vector<uint16_t> arena = Gather(shards, gathered);
    const std::array<int64_t, 3> packed = {gathered[1].extent * gathered[2].extent,
                                           gathered[2].extent, 1};
    ExpectPartOfWhole(blocking, t, whole, gathered,
                      QuantizeBox(blocking, arena.data(), packed, gathered));

    // Sender side: each shard's whole blocks, quantized in place from the shard's memory.
    for (const Shard& s : shards) {
      Box3 inner;
      bool empty = false;
      for (int a = 0; a < 3; ++a) {
        const int64_t end = s.box[a].origin + s.box[a].extent;
        int64_t begin = (s.box[a].origin + block[a] - 1) / block[a] * block[a];
        int64_t inner_end = end == extent[a] ? end : end / block[a] * block[a];
        if (block[a] >= extent[a]) begin = 0, inner_end = s.box[a].extent == extent[a] ? end : 0;
        inner[a] = {begin, std::max<int64_t>(0, inner_end - begin)};
        empty = empty || inner[a].extent == 0;
      }
      if (empty) continue;
      const std::array<int64_t, 3> strides = {s.box[1].extent * s.box[2].extent, s.box[2].extent,
                                              1};
      const uint16_t* base = s.bits.data() + (inner[0].origin - s.box[0].origin) * strides[0] +
                             (inner[1].origin - s.box[1].origin) * strides[1] +
                             (inner[2].origin - s.box[2].origin);
      ExpectPartOfWhole(blocking, t, whole, inner, QuantizeBox(blocking, base, strides, inner));
    }
  }
}

TEST(Fp8EdgeTest, AllZeroBlocksGetTheFloorScaleAndZeroBytes) {
  std::mt19937_64 rng(31);
  Tensor t = RandomTensor(rng, 1, 200, 300);
  for (int64_t r = 0; r < 128; ++r) {
    for (int64_t c = 128; c < 256; ++c) t.at(0, r, c) = (r + c) % 2 ? 0x8000 : 0x0000;  // +-0
  }
  const Quantized fast = Fast(Fp8Blocking::Block(), t);
  ExpectIdentical(fast, Reference(Fp8Blocking::Block(), t));
  EXPECT_EQ(Bits(fast.scales[1]), Bits(1e-10f / 448.0f));
  for (int64_t r = 0; r < 128; ++r) {
    for (int64_t c = 128; c < 256; ++c) {
      ASSERT_EQ(fast.fp8[r * 300 + c], (r + c) % 2 ? 0x80 : 0x00);
    }
  }
}

TEST(Fp8EdgeTest, ValuesAtAndPastTheFormatMaximum) {
  Tensor t{1, 3, 4, {}};
  for (const float v :
       {448.0f, -448.0f, 440.0f, 1.0f, 3e4f, 1e4f, -1e4f, -3e4f, 3e38f, 1e38f, -3e38f, 0.0f}) {
    t.bits.push_back(Bf16Bits(v));
  }
  const Quantized fast = Fast(Fp8Blocking::PerChannel(), t);
  ExpectIdentical(fast, Reference(Fp8Blocking::PerChannel(), t));
  EXPECT_EQ(fast.scales[0], 1.0f);  // amax 448: scale exactly 1
  EXPECT_EQ(fast.fp8[0], 0x7e);
  EXPECT_EQ(fast.fp8[1], 0xfe);
  EXPECT_EQ(fast.fp8[2], 0x7e);  // 440 rounds to 448
  EXPECT_EQ(fast.fp8[3], 0x38);  // 1.0
  // Past 448 the scale brings the row's amax to the format's maximum, saturating any fp32
  // rounding of x / scale above it.
  for (const int i : {4, 8}) EXPECT_EQ(fast.fp8[i], 0x7e) << i;
  for (const int i : {7, 10}) EXPECT_EQ(fast.fp8[i], 0xfe) << i;
  EXPECT_NEAR(ReferenceDecodeE4m3(fast.fp8[5]) * fast.scales[1], 1e4, 1e4 * 0.0625);
  EXPECT_NEAR(ReferenceDecodeE4m3(fast.fp8[9]) * fast.scales[2], 1e38, 1e38 * 0.0625);
  EXPECT_EQ(fast.fp8[11], 0x00);
}

TEST(Fp8EdgeTest, SubnormalInputsAndOutputs) {
  Tensor t{1, 2, 4, {}};
  // Row 0: bf16 subnormals only (amax below the floor): zeros, signs kept.
  for (const uint16_t b : {0x0001, 0x8003, 0x007f, 0x0000}) t.bits.push_back(b);
  // Row 1: amax 448 (scale 1): 2^-8 is 2 e4m3 quanta; 1.5 and 0.5 quanta tie to even.
  for (const float v :
       {448.0f, std::ldexp(1.0f, -8), 1.5f * std::ldexp(1.0f, -9), -std::ldexp(1.0f, -10)}) {
    t.bits.push_back(Bf16Bits(v));
  }
  const Quantized fast = Fast(Fp8Blocking::PerChannel(), t);
  ExpectIdentical(fast, Reference(Fp8Blocking::PerChannel(), t));
  EXPECT_EQ(Bits(fast.scales[0]), Bits(1e-10f / 448.0f));
  EXPECT_EQ(fast.fp8[0], 0x00);
  EXPECT_EQ(fast.fp8[1], 0x80);
  EXPECT_EQ(fast.fp8[5], 0x02);
  EXPECT_EQ(fast.fp8[6], 0x02);
  EXPECT_EQ(fast.fp8[7], 0x80);
}

TEST(Fp8EdgeTest, NanAndInfinityAreRefusedNamingTheParameter) {
  const std::string name = "model.layers.3.mlp.experts.w13_weight";
  for (const uint16_t bad : {uint16_t{0x7fc0}, uint16_t{0xff81}, uint16_t{0x7f80}}) {
    std::vector<uint16_t> bits(2 * 5 * 7, Bf16Bits(1.0f));
    bits[(1 * 5 + 2) * 7 + 3] = bad;
    std::vector<uint8_t> fp8(bits.size());
    std::vector<float> scales(2);
    const absl::Status status = quant::QuantizeFp8(
        Fp8Blocking::PerTensor(), DType::kBFloat16, PackedIn(bits.data(), 2, 5, 7),
        PackedOut(fp8.data(), 2, 5, 7), PackedOut(scales.data(), 2, 1, 1), name);
    const std::string what = bad == 0x7f80 ? "infinity" : "NaN";
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(name));
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
    EXPECT_THAT(std::string(status.message()), HasSubstr("(1, 2, 3)"));
    std::vector<double> values;
    for (const uint16_t b : bits) values.push_back(Bf16Value(b));
    const absl::StatusOr<ReferenceFp8> ref = ReferenceQuantizeFp8(values, 2, 5, 7, 5, 7, name);
    EXPECT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(ref.status().message()), HasSubstr(name));
    EXPECT_THAT(std::string(ref.status().message()), HasSubstr(what));
  }
  std::vector<float> values = {1.0f, std::nanf(""), 2.0f};
  std::vector<uint8_t> fp8(3);
  float scale = 0;
  const absl::Status status = quant::QuantizeFp8(
      Fp8Blocking::PerTensor(), DType::kFloat32, PackedIn(values.data(), 1, 1, 3),
      PackedOut(fp8.data(), 1, 1, 3), PackedOut(&scale, 1, 1, 1), "lm_head.weight");
  EXPECT_THAT(std::string(status.message()), HasSubstr("lm_head.weight: cannot quantize NaN"));
}

// dequantized = fp8 * scale is within half an e4m3 quantum of x: |x| * 2^-4 in the normal range,
// 2^-10 * scale in the subnormal range, plus the fp32 division's rounding.
TEST(Fp8EdgeTest, DequantizedIsWithinTheFormatErrorBound) {
  std::mt19937_64 rng(41);
  for (int iteration = 0; iteration < 40; ++iteration) {
    const Fp8Blocking blocking = RandomBlocking(rng);
    const Tensor t = RandomTensor(rng, 1 + rng() % 2, 1 + rng() % 200, 1 + rng() % 200);
    const ReferenceFp8 ref = Reference(blocking, t);
    const Quantized fast = Fast(blocking, t);
    ExpectIdentical(fast, ref);
    const std::vector<double> back = testing::ReferenceDequantizeFp8(ref, t.experts, t.rows, t.cols,
                                                                     blocking.rows, blocking.cols);
    const int64_t block_rows = std::min(blocking.rows, t.rows);
    const int64_t block_cols = std::min(blocking.cols, t.cols);
    const int64_t sr = ref.scale_rows, sc = ref.scale_cols;
    for (int64_t e = 0; e < t.experts; ++e) {
      for (int64_t r = 0; r < t.rows; ++r) {
        for (int64_t c = 0; c < t.cols; ++c) {
          const int64_t i = (e * t.rows + r) * t.cols + c;
          const double x = Bf16Value(t.bits[i]);
          const double scale = ref.scales[(e * sr + r / block_rows) * sc + c / block_cols];
          const double bound =
              std::fabs(x) * (0.0625 + std::ldexp(1.0, -20)) + scale * std::ldexp(1.0, -10);
          ASSERT_LE(std::fabs(back[i] - x), bound) << "x " << x << " scale " << scale;
        }
      }
    }
  }
}

TEST(Fp8ArgumentsTest, BadArgumentsAreRefused) {
  std::vector<uint16_t> in(6);
  std::vector<uint8_t> out(6);
  std::vector<float> scales(2);
  const ConstRegion input = PackedIn(in.data(), 1, 2, 3);
  const MutableRegion fp8 = PackedOut(out.data(), 1, 2, 3);
  const MutableRegion two_scales = PackedOut(scales.data(), 1, 2, 1);
  EXPECT_TRUE(
      quant::QuantizeFp8(Fp8Blocking::PerChannel(), DType::kBFloat16, input, fp8, two_scales, "p")
          .ok());
  const auto message = [](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_THAT(message(quant::QuantizeFp8(Fp8Blocking::PerChannel(), DType::kFloat16, input, fp8,
                                         two_scales, "p")),
              HasSubstr("parameter p: FP8 quantization takes bf16 or fp32 input, not fp16"));
  EXPECT_THAT(message(quant::QuantizeFp8(Fp8Blocking::PerTensor(), DType::kBFloat16, input, fp8,
                                         two_scales, "p")),
              HasSubstr("scales of [1, 2, 1] where the blocks need [1, 1, 1]"));
  EXPECT_THAT(message(quant::QuantizeFp8(Fp8Blocking::PerChannel(), DType::kBFloat16, input,
                                         PackedOut(out.data(), 1, 3, 2), two_scales, "p")),
              HasSubstr("FP8 output of [1, 3, 2] for an input of [1, 2, 3]"));
  EXPECT_THAT(message(quant::QuantizeFp8(Fp8Blocking::Block(0, 128), DType::kBFloat16, input, fp8,
                                         two_scales, "p")),
              HasSubstr("FP8 scale blocks of 0 x 128"));
  ConstRegion region;
  const int64_t strides[] = {3, 1}, shape3[] = {2, 2, 3}, strides3[] = {6, 3, 1};
  EXPECT_FALSE(quant::MakeRegion<const void*>(in.data(), {strides, 1}, {shape3, 1}, region).ok());
  EXPECT_FALSE(quant::MakeRegion<const void*>(in.data(), strides, shape3, region).ok());
  ASSERT_TRUE(quant::MakeRegion<const void*>(in.data(), strides3, shape3, region).ok());
  EXPECT_EQ(region.experts, 2);
  EXPECT_EQ(region.rows, 2);
  EXPECT_EQ(region.cols, 3);
  EXPECT_EQ(region.expert_stride, 6);
  EXPECT_EQ(region.row_stride, 3);
}

TEST(Fp8GeometryTest, WholeBlocksAndScaleRanges) {
  const auto same = [](AxisRange a, AxisRange b) {
    return a.origin == b.origin && a.extent == b.extent;
  };
  EXPECT_TRUE(same(quant::WholeBlocks(128, 300, {100, 50}), {0, 256}));
  EXPECT_TRUE(same(quant::WholeBlocks(128, 300, {130, 170}), {128, 172}));  // ragged last block
  EXPECT_TRUE(same(quant::WholeBlocks(128, 300, {7, 0}), {7, 0}));
  EXPECT_TRUE(same(quant::WholeBlocks(quant::kWholeAxis, 300, {5, 1}), {0, 300}));
  EXPECT_TRUE(quant::IsWholeBlocks(128, 300, {128, 172}));
  EXPECT_TRUE(quant::IsWholeBlocks(128, 300, {128, 128}));
  EXPECT_FALSE(quant::IsWholeBlocks(128, 300, {100, 28}));
  EXPECT_FALSE(quant::IsWholeBlocks(128, 300, {128, 100}));
  EXPECT_TRUE(same(quant::ScaleRange(128, 300, {128, 172}), {1, 2}));
  EXPECT_TRUE(same(quant::ScaleRange(128, 300, {0, 128}), {0, 1}));
  EXPECT_TRUE(same(quant::ScaleRange(quant::kWholeAxis, 300, {0, 300}), {0, 1}));
}

}  // namespace
}  // namespace wsync::fp8_test
