// quant/fp8.h's element quotient against the reference quantizer, bit for bit, where rounding is
// hardest: every finite bf16 at every bf16 amax significand (the quotient x / scale depends on the
// significands of x and amax and on their exponent difference only, so one binade of amax covers
// every case away from the fp32 range's ends, which the largest binade and the amax floor cover),
// quotients exactly at and a few ulps beside the e4m3 rounding ties (bf16 and fp32 input, in
// 128 x 128 blocks and per channel), and row lengths around the AVX2 kernel's 32-element and the
// AVX-512 kernel's 64-element step. Each case runs with every kernel this build has and this CPU
// runs (quant::RunnableFp8Kernels: portable, and AVX2 and AVX-512 where the CPU has them), packed
// (contiguous rows: each kernel's intrinsic rows) and with a strided output (its per-element
// loops), so every path of QuantizeFp8 is compared.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "quant/fp8.h"
#include "integration/fill/fp8_reference.h"
#include "tests/unit/fp8_test_support.h"

namespace wsync::fp8_test {
namespace {

using testing::ReferenceDecodeE4m3;

// Input elements of one dtype (bf16 or fp32 bits) of a tensor [experts, rows, cols].
struct Input {
  DType dtype = DType::kBFloat16;
  int64_t experts = 1, rows = 0, cols = 0;
  std::vector<uint32_t> bits;  // bf16 bits in the low half, or fp32 bits

  double Value(size_t i) const {
    if (dtype == DType::kBFloat16) return Bf16Value(static_cast<uint16_t>(bits[i]));
    float value;
    std::memcpy(&value, &bits[i], sizeof value);
    return value;
  }
};

// QuantizeFp8 by `kernel` of `input` with the FP8 output at a column stride of `out_stride` bytes
// (1: packed; more: the strided per-element path), compared with the reference; guard bytes after
// every row must stay untouched.
void ExpectKernelMatchesReference(quant::Fp8Kernel kernel, const Input& input,
                                  const Fp8Blocking& blocking, int64_t out_stride) {
  SCOPED_TRACE(::testing::Message() << "kernel " << quant::Fp8KernelName(kernel));
  const int64_t count = input.experts * input.rows * input.cols;
  std::vector<uint16_t> bf16;
  for (const uint32_t b : input.bits) bf16.push_back(static_cast<uint16_t>(b));
  const void* base = input.dtype == DType::kBFloat16 ? static_cast<const void*>(bf16.data())
                                                     : static_cast<const void*>(input.bits.data());
  const int64_t out_row = input.cols * out_stride + 3;  // 3 guard bytes per row
  std::vector<uint8_t> fp8(input.experts * input.rows * out_row, 0xa5);
  const int64_t sr = quant::BlockCount(blocking.rows, input.rows);
  const int64_t sc = quant::BlockCount(blocking.cols, input.cols);
  std::vector<float> scales(input.experts * sr * sc, -1.0f);
  const MutableRegion out{fp8.data(),           input.experts, input.rows, input.cols,
                          input.rows * out_row, out_row,       out_stride};
  ASSERT_TRUE(quant::QuantizeFp8WithKernel(kernel, blocking, input.dtype,
                                           PackedIn(base, input.experts, input.rows, input.cols),
                                           out, PackedOut(scales.data(), input.experts, sr, sc),
                                           "w")
                  .ok());
  std::vector<double> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(input.Value(i));
  absl::StatusOr<ReferenceFp8> ref = ReferenceQuantizeFp8(
      values, input.experts, input.rows, input.cols, blocking.rows, blocking.cols, "w");
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (int64_t e = 0; e < input.experts; ++e) {
    for (int64_t r = 0; r < input.rows; ++r) {
      const uint8_t* row = fp8.data() + (e * input.rows + r) * out_row;
      for (int64_t c = 0; c < out_row; ++c) {
        const int64_t i = (e * input.rows + r) * input.cols + c / out_stride;
        if (c >= input.cols * out_stride || c % out_stride != 0) {
          ASSERT_EQ(row[c], 0xa5) << "byte " << c << " of row " << r << " written";
        } else {
          ASSERT_EQ(row[c], ref->fp8[i]) << "x = " << values[i] << " (element " << i << ", scale "
                                         << scales[0] << ", stride " << out_stride << ")";
        }
      }
    }
  }
  for (size_t i = 0; i < scales.size(); ++i) ASSERT_EQ(Bits(scales[i]), Bits(ref->scales[i]));
}

// ExpectKernelMatchesReference with every runnable kernel.
void ExpectMatchesReference(const Input& input, const Fp8Blocking& blocking, int64_t out_stride) {
  for (const quant::Fp8Kernel kernel : quant::RunnableFp8Kernels()) {
    ExpectKernelMatchesReference(kernel, input, blocking, out_stride);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void ExpectBothPathsMatch(const Input& input, const Fp8Blocking& blocking) {
  ExpectMatchesReference(input, blocking, 1);
  if (::testing::Test::HasFatalFailure()) return;
  ExpectMatchesReference(input, blocking, 2);
}

// The kernels this CPU runs are the ones the tests above compare: on x86-64 every CPU that runs
// the AVX-512 kernel also runs AVX2's, and QuantizeFp8 runs one of them (the fastest, unless
// WSYNC_FP8_KERNEL caps it).
TEST(Fp8ExactTest, EveryRunnableKernelIsComparedAndOneOfThemIsSelected) {
  const std::vector<quant::Fp8Kernel> kernels = quant::RunnableFp8Kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.front(), quant::Fp8Kernel::kPortable);
  EXPECT_TRUE(std::is_sorted(kernels.begin(), kernels.end()));
  EXPECT_NE(std::find(kernels.begin(), kernels.end(), quant::SelectedFp8Kernel()), kernels.end());
  if (std::getenv(quant::kFp8KernelVariable) == nullptr) {
    EXPECT_EQ(quant::SelectedFp8Kernel(), kernels.back());
  }
  const auto runnable = [&](quant::Fp8Kernel kernel) {
    return std::find(kernels.begin(), kernels.end(), kernel) != kernels.end();
  };
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi2");
  EXPECT_EQ(runnable(quant::Fp8Kernel::kAvx2), avx2);
  EXPECT_EQ(runnable(quant::Fp8Kernel::kAvx512), avx2 && __builtin_cpu_supports("avx512bw") &&
                                                     __builtin_cpu_supports("avx512vl") &&
                                                     __builtin_cpu_supports("avx512dq"));
#endif
  // A kernel this CPU does not run is refused, not run.
  if (kernels.back() != quant::Fp8Kernel::kAvx512) {
    std::vector<uint16_t> in(4, 0x3f80);
    std::vector<uint8_t> out(4);
    float scale = 0;
    EXPECT_EQ(quant::QuantizeFp8WithKernel(quant::Fp8Kernel::kAvx512, Fp8Blocking::PerTensor(),
                                           DType::kBFloat16, PackedIn(in.data(), 1, 2, 2),
                                           PackedOut(out.data(), 1, 2, 2),
                                           PackedOut(&scale, 1, 1, 1), "w")
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// One row per amax: every finite bf16 x with |x| <= amax (both signs; amax itself among them),
// zero-padded to the longest row: each x at the scale of its row, amax / 448.
Input EveryBf16Below(const std::vector<uint16_t>& amaxes) {
  Input input;
  input.rows = static_cast<int64_t>(amaxes.size());
  input.cols = 2 * (*std::max_element(amaxes.begin(), amaxes.end()) + 1);
  for (const uint16_t amax : amaxes) {
    for (uint32_t sign : {0u, 0x8000u}) {
      for (uint32_t b = 0; b <= amax; ++b) input.bits.push_back(sign | b);
    }
    input.bits.resize(input.bits.size() + input.cols - 2 * (amax + 1), 0);
  }
  return input;
}

TEST(Fp8ExactTest, EveryBf16AtEveryAmaxSignificandMatchesTheReference) {
  std::vector<uint16_t> one_binade;  // amax in [1, 2): all 128 significands
  for (uint16_t amax = 0x3f80; amax <= 0x3fff; ++amax) one_binade.push_back(amax);
  ExpectBothPathsMatch(EveryBf16Below(one_binade), Fp8Blocking::PerChannel());
  if (HasFatalFailure()) return;
  // The largest binade (quotients of the smallest x underflow to fp32 subnormals) and amax below
  // the floor 1e-10 (the floor's scale): a sample of significands.
  ExpectBothPathsMatch(EveryBf16Below({0x7f00, 0x7f13, 0x7f5a, 0x7f7f, 0x2edb, 0x2e00, 0}),
                       Fp8Blocking::PerChannel());
}

// The e4m3 rounding ties: midpoints between neighbouring codes (5 significant bits: exact).
std::vector<double> Ties() {
  std::vector<double> ties;
  for (int code = 0; code < 0x7e; ++code) {
    ties.push_back((ReferenceDecodeE4m3(code) + ReferenceDecodeE4m3(code + 1)) / 2);
  }
  return ties;
}

// A block of fp32 elements whose quotients lie at and up to 3 ulps beside every tie: amax (a
// random significand, or one of few bits so that some quotients are exactly ties) first, then
// x = fp32(tie * scale) and its neighbours, random signs. Returns how many quotients are ties.
int64_t AppendTieBlockFp32(std::mt19937_64& rng, int64_t cols, std::vector<uint32_t>& bits) {
  const int exponent = std::uniform_int_distribution<int>(-30, 30)(rng);
  const float significand =
      rng() % 2 == 0 ? std::uniform_real_distribution<float>(1, 2)(rng)
                     : 1.0f + static_cast<float>(rng() % 16) / 16;  // few bits: exact ties
  const float amax = std::ldexp(significand, exponent);
  const float scale = amax / 448.0f;
  const std::vector<double> ties = Ties();
  int64_t exact_ties = 0;
  bits.push_back(Bits(amax));
  for (int64_t c = 1; c < cols; ++c) {
    const double tie = ties[rng() % ties.size()];
    float x = static_cast<float>(tie * scale);
    const int steps = static_cast<int>(rng() % 7) - 3;
    for (int s = 0; s < std::abs(steps); ++s) x = std::nextafter(x, steps > 0 ? amax : 0.0f);
    x = std::min(x, amax);
    exact_ties += static_cast<double>(x) == tie * static_cast<double>(scale);
    bits.push_back(Bits(rng() % 2 == 0 ? x : -x));
  }
  return exact_ties;
}

TEST(Fp8ExactTest, Fp32QuotientsAtAndBesideTheRoundingTiesMatchTheReference) {
  std::mt19937_64 rng(23);
  Input input;
  input.dtype = DType::kFloat32;
  input.rows = 400;
  input.cols = 1000;
  int64_t exact_ties = 0;
  for (int64_t r = 0; r < input.rows; ++r) {
    exact_ties += AppendTieBlockFp32(rng, input.cols, input.bits);
  }
  EXPECT_GT(exact_ties, 1000);
  ExpectBothPathsMatch(input, Fp8Blocking::PerChannel());
}

// bf16 blocks of 128 x 128 whose scales have few significant bits (amax = 7 m 2^k: scale
// m 2^(k-6)), so that many quotients are exactly ties: x = tie * scale where that is a bf16, and
// its bf16 neighbours; three experts, ragged last blocks.
TEST(Fp8ExactTest, Bf16BlocksWithQuotientsOnTheTiesMatchTheReference) {
  std::mt19937_64 rng(29);
  Input input;
  input.experts = 3;
  input.rows = 300;
  input.cols = 290;
  input.bits.assign(input.experts * input.rows * input.cols, 0);
  const std::vector<double> ties = Ties();
  int64_t exact_ties = 0;
  const int64_t row_blocks = quant::BlockCount(128, input.rows);
  const int64_t col_blocks = quant::BlockCount(128, input.cols);
  for (int64_t e = 0; e < input.experts; ++e) {
    for (int64_t br = 0; br < row_blocks; ++br) {
      for (int64_t bc = 0; bc < col_blocks; ++bc) {
        const int m = 1 + 2 * static_cast<int>(rng() % 18);  // odd, 7 m < 256
        const float amax = std::ldexp(7.0f * m, std::uniform_int_distribution<int>(-40, 40)(rng));
        const double scale = static_cast<double>(amax / 448.0f);
        const int64_t r1 = std::min(input.rows, (br + 1) * 128);
        const int64_t c1 = std::min(input.cols, (bc + 1) * 128);
        for (int64_t r = br * 128; r < r1; ++r) {
          for (int64_t c = bc * 128; c < c1; ++c) {
            const double x = ties[rng() % ties.size()] * scale;
            uint16_t b = Bf16Bits(static_cast<float>(x));
            exact_ties += Bf16Value(b) == x;
            b = static_cast<uint16_t>(b + static_cast<int>(rng() % 3) - 1);  // a neighbour
            if (Bf16Value(b) > amax || Bf16Value(b) < 0) b = Bf16Bits(amax);
            input.bits[(e * input.rows + r) * input.cols + c] = b | (rng() % 2 ? 0x8000 : 0);
          }
        }
        input.bits[(e * input.rows + br * 128) * input.cols + bc * 128] = Bf16Bits(amax);
      }
    }
  }
  EXPECT_GT(exact_ties, 10000);
  ExpectBothPathsMatch(input, Fp8Blocking::Block());
}

// Rows of every length up to 200 (and a few past 256) in blocks of widths around 32, 64 and 128:
// the AVX2 rows' 32-element and the AVX-512 rows' 64-element steps and their tails, one block or
// many per row.
TEST(Fp8ExactTest, RowLengthsAroundTheVectorWidthMatchTheReference) {
  std::mt19937_64 rng(31);
  std::vector<int64_t> lengths;
  for (int64_t cols = 1; cols <= 200; ++cols) lengths.push_back(cols);
  for (const int64_t cols : {255, 256, 257, 300, 1000}) lengths.push_back(cols);
  for (const int64_t cols : lengths) {
    for (const Fp8Blocking blocking :
         {Fp8Blocking::PerChannel(), Fp8Blocking::Block(2, 64), Fp8Blocking::Block(3, 65),
          Fp8Blocking::Block(128, 128), Fp8Blocking::Block(1, 7), Fp8Blocking::Block(2, 33)}) {
      SCOPED_TRACE(::testing::Message()
                   << cols << " columns, blocks " << blocking.rows << " x " << blocking.cols);
      const Tensor t = RandomTensor(rng, 1, 5, cols);
      Input input;
      input.rows = t.rows;
      input.cols = t.cols;
      input.bits.assign(t.bits.begin(), t.bits.end());
      ExpectMatchesReference(input, blocking, 1);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace wsync::fp8_test
