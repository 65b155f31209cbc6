#include "integration/fill/fp8_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wsync::testing {
namespace {

// `value` rounded to an integer, halves to the even integer. `value` >= 0 with few significant
// bits, so every step below is exact in double.
double RoundHalfToEven(double value) {
  const double floor = std::floor(value);
  const double fraction = value - floor;
  if (fraction > 0.5) return floor + 1;
  if (fraction < 0.5) return floor;
  return std::fmod(floor, 2.0) == 0 ? floor : floor + 1;
}

int64_t Blocks(int64_t block, int64_t extent) { return (extent + block - 1) / block; }

}  // namespace

uint8_t ReferenceEncodeE4m3(double value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::fabs(value);
  if (magnitude == 0) return sign;
  if (magnitude >= 448) return sign | 0x7e;
  int frexp_exponent = 0;
  std::frexp(magnitude, &frexp_exponent);  // magnitude in [2^(exponent-1), 2^exponent)
  int exponent = frexp_exponent - 1;       // magnitude in [2^exponent, 2^(exponent+1))
  if (exponent < -6) {
    // Subnormal: a multiple m of 2^-9, m in 0..8 (8 is the smallest normal, code 0x08).
    const double steps = RoundHalfToEven(std::ldexp(magnitude, 9));
    return sign | static_cast<uint8_t>(steps);
  }
  // Normal: 2^exponent * significand / 8 with the significand in 8..16 after rounding.
  double significand = RoundHalfToEven(std::ldexp(magnitude, 3 - exponent));
  if (significand == 16) {
    significand = 8;
    ++exponent;
  }
  if (exponent > 8 || (exponent == 8 && significand > 14)) return sign | 0x7e;
  const int biased = exponent + 7;
  return sign | static_cast<uint8_t>((biased << 3) | (static_cast<int>(significand) - 8));
}

double ReferenceDecodeE4m3(uint8_t code) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int biased = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  if (biased == 0xf && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (biased == 0) return sign * std::ldexp(mantissa, -9);
  return sign * std::ldexp(8 + mantissa, biased - 10);
}

double Bf16Value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

uint16_t Bf16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

absl::StatusOr<ReferenceFp8> ReferenceQuantizeFp8(absl::Span<const double> values, int64_t experts,
                                                  int64_t rows, int64_t cols, int64_t block_rows,
                                                  int64_t block_cols, absl::string_view parameter) {
  if (static_cast<int64_t>(values.size()) != experts * rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", parameter, ": ", values.size(),
                                                   " values for [", experts, ", ", rows, ", ", cols,
                                                   "]"));
  }
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    if (std::isfinite(values[i])) continue;
    const int64_t e = i / (rows * cols), r = i / cols % rows, c = i % cols;
    return absl::InvalidArgumentError(absl::StrCat("parameter ", parameter, ": cannot quantize ",
                                                   std::isnan(values[i]) ? "NaN" : "an infinity",
                                                   " at element (", e, ", ", r, ", ", c,
                                                   ") of the region to FP8"));
  }
  block_rows = std::min(block_rows, std::max<int64_t>(rows, 1));
  block_cols = std::min(block_cols, std::max<int64_t>(cols, 1));
  ReferenceFp8 out;
  out.scale_rows = Blocks(block_rows, rows);
  out.scale_cols = Blocks(block_cols, cols);
  out.fp8.resize(values.size());
  out.scales.resize(experts * out.scale_rows * out.scale_cols);
  const auto at = [&](int64_t e, int64_t r, int64_t c) { return (e * rows + r) * cols + c; };
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t br = 0; br < out.scale_rows; ++br) {
      for (int64_t bc = 0; bc < out.scale_cols; ++bc) {
        const int64_t r_end = std::min(rows, (br + 1) * block_rows);
        const int64_t c_end = std::min(cols, (bc + 1) * block_cols);
        double amax = 0;
        for (int64_t r = br * block_rows; r < r_end; ++r) {
          for (int64_t c = bc * block_cols; c < c_end; ++c) {
            amax = std::max(amax, std::fabs(values[at(e, r, c)]));
          }
        }
        // amax is an fp32 value; the floor and the division are fp32 operations.
        const float scale = std::max(static_cast<float>(amax), 1e-10f) / 448.0f;
        out.scales[(e * out.scale_rows + br) * out.scale_cols + bc] = scale;
        for (int64_t r = br * block_rows; r < r_end; ++r) {
          for (int64_t c = bc * block_cols; c < c_end; ++c) {
            const float quotient = static_cast<float>(values[at(e, r, c)]) / scale;
            out.fp8[at(e, r, c)] = ReferenceEncodeE4m3(quotient);
          }
        }
      }
    }
  }
  return out;
}

std::vector<double> ReferenceDequantizeFp8(const ReferenceFp8& quantized, int64_t experts,
                                           int64_t rows, int64_t cols, int64_t block_rows,
                                           int64_t block_cols) {
  block_rows = std::min(block_rows, std::max<int64_t>(rows, 1));
  block_cols = std::min(block_cols, std::max<int64_t>(cols, 1));
  std::vector<double> out(quantized.fp8.size());
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = (e * rows + r) * cols + c;
        const float scale =
            quantized.scales[(e * quantized.scale_rows + r / block_rows) * quantized.scale_cols +
                             c / block_cols];
        out[i] = ReferenceDecodeE4m3(quantized.fp8[i]) * scale;
      }
    }
  }
  return out;
}

}  // namespace wsync::testing
