// The device quantization's code on the host (quant/fp8_device.h, fp8_device_host.h): the integer
// e4m3 encoder against the reference and the host kernel's for every bf16 at several scales and
// a sample of all fp32 values, the tiling covering every element once within its block, and the
// host emulation of the CUDA kernels (the code the fake device runs) against the reference and
// quant::QuantizeFp8 bit for bit on random shapes, windows and strides; the NaN/infinity report
// and the request checks. The same comparisons run on a GPU in tests/gpu/gpu_fp8_quant_test.cc.

#include "quant/fp8_device.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quant/fp8.h"
#include "quant/fp8_device_host.h"
#include "integration/fill/fp8_reference.h"
#include "tests/unit/fp8_device_support.h"
#include "tests/unit/fp8_test_support.h"

namespace wsync::fp8_test {
namespace {

using ::testing::HasSubstr;
using testing::ReferenceEncodeE4m3;

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// One encoder input: the device encoder equals the reference and the host kernel's encoder.
void ExpectSameCode(float value) {
  const uint8_t device = quant::Fp8EncodeE4m3(value);
  ASSERT_EQ(device, ReferenceEncodeE4m3(value)) << value << " bits " << std::hex << Bits(value);
  ASSERT_EQ(device, quant::EncodeE4m3Saturating(value)) << value;
}

// Every finite bf16 x, divided by scales of the rule (amax / 448 for amax of many binades and the
// all-zero floor) and by 1: what the kernels encode for every element of every block.
TEST(Fp8DeviceEncodeTest, EveryBf16AtSeveralScalesMatchesTheReference) {
  const float amaxes[] = {0.0f,   1e-12f, 1e-10f, 6e-5f, 0.015625f, 0.3f,         1.0f,
                          448.0f, 449.0f, 3.5f,   1e4f,  1e30f,     3.3895314e38f};
  std::vector<float> scales = {1.0f};
  for (const float amax : amaxes) scales.push_back(quant::Fp8ScaleOf(Bits(amax)));
  int64_t checked = 0;
  for (const float scale : scales) {
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      if ((bits & 0x7f80) == 0x7f80) continue;  // NaN and infinity: refused before encoding.
      const float x = FromBits(bits << 16);
      ExpectSameCode(quant::Fp8Divide(x, scale));
      ++checked;
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(checked, static_cast<int64_t>(scales.size()) * (65536 - 2 * 128));
}

// A sample of every fp32 (every 4099th pattern, a prime stride that visits every exponent and
// mantissa pattern class) and both sides of every e4m3 rounding boundary.
TEST(Fp8DeviceEncodeTest, Fp32SampleAndEveryRoundingBoundaryMatchTheReference) {
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4099) {
    const float value = FromBits(static_cast<uint32_t>(bits));
    if (!std::isfinite(value)) continue;
    ExpectSameCode(value);
    if (HasFatalFailure()) return;
  }
  for (int code = 0; code < 0x7e; ++code) {
    const double low = testing::ReferenceDecodeE4m3(code);
    const double high = testing::ReferenceDecodeE4m3(code + 1);
    const float mid = static_cast<float>((low + high) / 2);
    for (const float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      ExpectSameCode(v);
      ExpectSameCode(-v);
    }
  }
  for (const float v : {448.0f, 464.0f, std::nextafter(464.0f, 0.0f), 480.0f, 1e38f, 0.0f,
                        std::numeric_limits<float>::denorm_min(), std::ldexp(1.0f, -10),
                        std::nextafter(std::ldexp(1.0f, -10), 1.0f)}) {
    ExpectSameCode(v);
    ExpectSameCode(-v);
  }
}

TEST(Fp8DeviceEncodeTest, KnownCodes) {
  EXPECT_EQ(quant::Fp8EncodeE4m3(1.0f), 0x38);
  EXPECT_EQ(quant::Fp8EncodeE4m3(-0.0f), 0x80);
  EXPECT_EQ(quant::Fp8EncodeE4m3(500.0f), 0x7e);
  EXPECT_EQ(quant::Fp8EncodeE4m3(-1e30f), 0xfe);
  EXPECT_EQ(quant::Fp8EncodeE4m3(std::ldexp(1.0f, -10)), 0x00);  // Tie to even.
  EXPECT_EQ(quant::Fp8EncodeE4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 steps: to even 2.
  EXPECT_EQ(quant::Fp8EncodeE4m3(std::ldexp(1.0f, -6)), 0x08);
}

// Every element lies in exactly one tile, inside the tile's block; tiles past a ragged block's
// end are the only ones skipped, and no tile exceeds the tile limits.
TEST(Fp8DeviceTilingTest, TilesCoverEveryElementOnceWithinItsBlock) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    quant::Fp8DeviceQuant q;
    q.experts = 1 + static_cast<int64_t>(rng() % 3);
    const bool wide = i % 10 == 0;  // Rows wider than a tile: several tiles across a block.
    q.rows = 1 + static_cast<int64_t>(rng() % (wide ? 4 : 400));
    q.cols = 1 + static_cast<int64_t>(rng() % (wide ? 20000 : 400));
    const Fp8Blocking blocking = RandomBlocking(rng);
    q.block_rows = blocking.rows;
    q.block_cols = blocking.cols;
    SCOPED_TRACE(::testing::Message() << q.experts << "x" << q.rows << "x" << q.cols << " blocks "
                                      << q.block_rows << "x" << q.block_cols);
    const quant::Fp8Tiling t = quant::MakeFp8Tiling(q);
    ASSERT_EQ(t.scales, q.experts * quant::BlockCount(q.block_rows, q.rows) *
                            quant::BlockCount(q.block_cols, q.cols));
    std::vector<uint8_t> covered(q.experts * q.rows * q.cols, 0);
    quant::Fp8Tile tile;
    for (int64_t index = 0; index < t.tiles; ++index) {
      if (!quant::Fp8TileAt(q, t, index, tile)) continue;
      ASSERT_LE((tile.r1 - tile.r0) * (tile.c1 - tile.c0), quant::kFp8TileElements);
      ASSERT_LE(tile.r1 - tile.r0, quant::kFp8TileRows);
      ASSERT_EQ(tile.scale,
                (tile.expert * t.scale_rows + tile.block_row) * t.scale_cols + tile.block_col);
      for (int64_t r = tile.r0; r < tile.r1; ++r) {
        ASSERT_EQ(r / t.block_rows, tile.block_row);
        for (int64_t c = tile.c0; c < tile.c1; ++c) {
          ASSERT_EQ(c / t.block_cols, tile.block_col);
          ASSERT_EQ(++covered[(tile.expert * q.rows + r) * q.cols + c], 1);
        }
      }
    }
    for (const uint8_t count : covered) ASSERT_EQ(count, 1);
  }
}

// The host emulation of the kernels (what the fake device runs, and the same code as the CUDA
// kernels) writes the reference's bytes into the window only and the reference's scales.
TEST(Fp8DeviceHostTest, RandomCasesMatchTheReferenceAndTheHostKernel) {
  std::mt19937_64 rng(22);
  int windows = 0, ragged = 0;
  for (int i = 0; i < 400; ++i) {
    DeviceCase c = RandomDeviceCase(rng, i % 20 == 0 ? 300 : 40);
    SCOPED_TRACE(::testing::Message()
                 << "case " << i << ": " << c.tensor.experts << "x" << c.tensor.rows << "x"
                 << c.tensor.cols << " blocks " << c.blocking.rows << "x" << c.blocking.cols
                 << (c.fp32 ? " fp32" : " bf16"));
    std::vector<uint8_t> fp8 = c.fp8;
    std::vector<float> scales = c.scales;
    unsigned long long report = 0;  // NOLINT(runtime/int)
    const quant::Fp8DeviceQuant q = c.Request(c.input.data(), fp8.data(), scales.data(), &report);
    ASSERT_TRUE(quant::CheckFp8DeviceQuant(q, "w").ok());
    quant::QuantizeFp8DeviceOnHost(q);
    ASSERT_EQ(report, quant::kFp8NoNonFinite);
    ExpectDeviceResult(c, fp8, scales);
    if (HasFatalFailure()) return;
    windows += c.window_extent[1] < c.tensor.rows || c.window_extent[2] < c.tensor.cols;
    ragged += c.tensor.cols % std::min(c.blocking.cols, c.tensor.cols) != 0 ||
              c.tensor.rows % std::min(c.blocking.rows, c.tensor.rows) != 0;
  }
  EXPECT_GT(windows, 100);
  EXPECT_GT(ragged, 80);
}

// Every finite bf16 quantized at the scale of a partner element of its row (several
// magnitudes), through the emulation's per-element path.
TEST(Fp8DeviceHostTest, EveryBf16AtSeveralRowScalesMatchesTheReference) {
  const DeviceCase c = WholeCase(EveryBf16WithPartners(), Fp8Blocking::PerChannel());
  ASSERT_GT(c.tensor.rows, 65000 * 2);
  std::vector<uint8_t> fp8 = c.fp8;
  std::vector<float> scales = c.scales;
  unsigned long long report = 0;  // NOLINT(runtime/int)
  quant::QuantizeFp8DeviceOnHost(c.Request(c.input.data(), fp8.data(), scales.data(), &report));
  ASSERT_EQ(report, quant::kFp8NoNonFinite);
  ExpectDeviceResult(c, fp8, scales);
}

// The report names the first NaN or infinity in row-major order; the status names the parameter.
TEST(Fp8DeviceHostTest, NonFiniteElementsAreReportedWithTheParameterAndElement) {
  std::mt19937_64 rng(9);
  for (const uint16_t bad : {uint16_t{0x7fc0}, uint16_t{0xff80}, uint16_t{0x7f80}}) {
    DeviceCase c = RandomDeviceCase(rng, 40);
    const int64_t e = 0, r = c.tensor.rows / 2, col = c.tensor.cols / 2;
    // A second one later in row-major order (the last element) when that is another element.
    c.tensor.bits.back() = 0x7f80;
    c.tensor.at(e, r, col) = bad;
    FillBuffers(c);
    std::vector<uint8_t> fp8 = c.fp8;
    std::vector<float> scales = c.scales;
    unsigned long long report = 0;  // NOLINT(runtime/int)
    const quant::Fp8DeviceQuant q = c.Request(c.input.data(), fp8.data(), scales.data(), &report);
    quant::QuantizeFp8DeviceOnHost(q);
    const absl::Status status = quant::Fp8ReportStatus(report, q, "layers.0.w");
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("parameter layers.0.w"));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(bad == 0x7fc0 ? "cannot quantize NaN" : "cannot quantize an infinity"));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("at element (", e, ", ", r, ", ", col, ")")));
  }
  const quant::Fp8DeviceQuant empty;
  EXPECT_TRUE(quant::Fp8ReportStatus(quant::kFp8NoNonFinite, empty, "w").ok());
}

TEST(Fp8DeviceHostTest, BadRequestsAreRefusedNamingTheParameter) {
  std::mt19937_64 rng(1);
  DeviceCase c = RandomDeviceCase(rng, 20);
  std::vector<uint8_t> fp8 = c.fp8;
  std::vector<float> scales = c.scales;
  unsigned long long report = 0;  // NOLINT(runtime/int)
  const quant::Fp8DeviceQuant good = c.Request(c.input.data(), fp8.data(), scales.data(), &report);
  ASSERT_TRUE(quant::CheckFp8DeviceQuant(good, "w").ok());
  std::vector<quant::Fp8DeviceQuant> bad(5, good);
  bad[0].input_type = 7;
  bad[1].block_rows = 0;
  bad[2].window_extent[2] = c.tensor.cols + 1;
  bad[3].report = nullptr;
  bad[4].rows = -1;
  for (const quant::Fp8DeviceQuant& q : bad) {
    const absl::Status status = quant::CheckFp8DeviceQuant(q, "w9");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("parameter w9"));
  }
}

}  // namespace
}  // namespace wsync::fp8_test
