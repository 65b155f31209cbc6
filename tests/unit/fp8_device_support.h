#ifndef WSYNC_TESTS_UNIT_FP8_DEVICE_SUPPORT_H_
#define WSYNC_TESTS_UNIT_FP8_DEVICE_SUPPORT_H_

// Helpers of the device quantization tests (fp8_device_test.cc on the host emulation,
// tests/gpu/gpu_fp8_quant_test.cc on a GPU): a random request over host images of its buffers
// (strided input, a window of the blocks written into a padded output, strided scales), and the
// bit-for-bit comparison of the result with the reference quantizer and the host kernel
// (quant::QuantizeFp8).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "quant/fp8.h"
#include "quant/fp8_device.h"
#include "tests/unit/fp8_test_support.h"

namespace wsync::fp8_test {

// A request's buffers as host bytes; Request(...) points a request at any copy of them.
struct DeviceCase {
  Tensor tensor;
  Fp8Blocking blocking;
  bool fp32 = false;  // Input elements are fp32 (of the same values) instead of bf16.
  int64_t pad = 0;    // Input row padding (elements).
  int64_t window_origin[3] = {0, 0, 0};
  int64_t window_extent[3] = {0, 0, 0};
  int64_t out_pad = 0;  // Output row padding (bytes).
  int64_t scale_rows = 0, scale_cols = 0;
  std::vector<uint8_t> input;  // experts x rows x (cols + pad) elements.
  std::vector<uint8_t> fp8;    // The window, rows of (extent + out_pad) bytes; 0xff poison.
  std::vector<float> scales;   // [experts, scale_cols, scale_rows] (column-major blocks).

  int64_t InputRow() const { return tensor.cols + pad; }
  int64_t OutputRow() const { return window_extent[2] + out_pad; }

  // The request over base pointers of copies of input, fp8 and scales, and `report`.
  quant::Fp8DeviceQuant Request(const void* in, uint8_t* out, float* scale_out,
                                unsigned long long* report) const {  // NOLINT(runtime/int)
    quant::Fp8DeviceQuant q;
    q.input = in;
    q.input_type = fp32 ? quant::kFp8InputFp32 : quant::kFp8InputBf16;
    q.experts = tensor.experts;
    q.rows = tensor.rows;
    q.cols = tensor.cols;
    q.input_strides[0] = tensor.rows * InputRow();
    q.input_strides[1] = InputRow();
    q.input_strides[2] = 1;
    q.block_rows = blocking.rows;
    q.block_cols = blocking.cols;
    q.fp8 = out;
    q.fp8_strides[0] = window_extent[1] * OutputRow();
    q.fp8_strides[1] = OutputRow();
    q.fp8_strides[2] = 1;
    for (int axis = 0; axis < 3; ++axis) {
      q.window_origin[axis] = window_origin[axis];
      q.window_extent[axis] = window_extent[axis];
    }
    q.scales = scale_out;
    // Blocks stored column-major within each expert: strides that are not row-major.
    q.scale_strides[0] = scale_rows * scale_cols;
    q.scale_strides[1] = 1;
    q.scale_strides[2] = scale_rows;
    q.report = report;
    return q;
  }
};

// Values at and past the e4m3 range and their neighbours, to mix into tensors.
inline uint16_t EdgeBf16(std::mt19937_64& rng) {
  static const float kEdges[] = {448.0f, 464.0f, 480.0f, 447.0f, 449.0f,    1e30f,       3.3895e38f,
                                 0.0f,   1e-10f, 2e-10f, 1e-40f, 0.015625f, 0.001953125f};
  const float value = kEdges[rng() % (sizeof(kEdges) / sizeof(kEdges[0]))];
  return Bf16Bits(rng() % 2 == 0 ? value : -value);
}

// Fills the case's buffers from its tensor and geometry: the input (padding NaNs: a kernel that
// read them would report one), the output poisoned with 0xff, the scales with -1.
inline void FillBuffers(DeviceCase& c) {
  const Tensor& t = c.tensor;
  c.scale_rows = quant::BlockCount(c.blocking.rows, t.rows);
  c.scale_cols = quant::BlockCount(c.blocking.cols, t.cols);
  const int64_t element = c.fp32 ? 4 : 2;
  c.input.resize(t.experts * t.rows * c.InputRow() * element);
  for (int64_t e = 0; e < t.experts; ++e) {
    for (int64_t r = 0; r < t.rows; ++r) {
      for (int64_t col = 0; col < c.InputRow(); ++col) {
        const uint16_t value = col < t.cols ? t.bits[(e * t.rows + r) * t.cols + col] : 0x7fc0;
        const uint32_t bits = c.fp32 ? uint32_t{value} << 16 : value;
        std::memcpy(&c.input[((e * t.rows + r) * c.InputRow() + col) * element], &bits, element);
      }
    }
  }
  c.fp8.assign(c.window_extent[0] * c.window_extent[1] * c.OutputRow(), 0xff);
  c.scales.assign(t.experts * c.scale_rows * c.scale_cols, -1.0f);
}

// The case of `tensor` with `blocking`, packed, the whole region written.
inline DeviceCase WholeCase(Tensor tensor, const Fp8Blocking& blocking) {
  DeviceCase c;
  c.tensor = std::move(tensor);
  c.blocking = blocking;
  c.window_extent[0] = c.tensor.experts;
  c.window_extent[1] = c.tensor.rows;
  c.window_extent[2] = c.tensor.cols;
  FillBuffers(c);
  return c;
}

// A random case: 1 to 3 experts of up to `max_extent` rows and columns, a random blocking (128 x
// 128 and small blocks give ragged last blocks), sometimes all zeros or fp32 input, edge values,
// padded rows, and a random window of whole or partial blocks.
inline DeviceCase RandomDeviceCase(std::mt19937_64& rng, int64_t max_extent) {
  DeviceCase c;
  const int64_t experts = 1 + static_cast<int64_t>(rng() % 3);
  const int64_t rows = 1 + static_cast<int64_t>(rng() % max_extent);
  const int64_t cols = 1 + static_cast<int64_t>(rng() % max_extent);
  c.tensor = RandomTensor(rng, experts, rows, cols);
  if (rng() % 8 == 0) std::fill(c.tensor.bits.begin(), c.tensor.bits.end(), 0);
  for (int i = static_cast<int>(rng() % 6); i > 0; --i) {
    c.tensor.bits[rng() % c.tensor.bits.size()] = EdgeBf16(rng);
  }
  c.blocking = RandomBlocking(rng);
  c.fp32 = rng() % 4 == 0;
  c.pad = static_cast<int64_t>(rng() % 3);
  c.out_pad = static_cast<int64_t>(rng() % 5);
  const int64_t extent[3] = {experts, rows, cols};
  const bool whole = rng() % 2 == 0;
  for (int axis = 0; axis < 3; ++axis) {
    c.window_origin[axis] = whole ? 0 : static_cast<int64_t>(rng() % extent[axis]);
    const int64_t room = extent[axis] - c.window_origin[axis];
    c.window_extent[axis] = whole ? room : 1 + static_cast<int64_t>(rng() % room);
  }
  FillBuffers(c);
  return c;
}

// Every finite bf16 x against partners a >= |x| of several magnitudes: rows (x, a) in blocks of
// one row, so each x is encoded at the scale a / 448 of its row (every bf16 at 448 / 3.39e38 and
// each smaller one at 1, 448, 1e-10 and more).
inline Tensor EveryBf16WithPartners() {
  static const float kPartners[] = {3.3895314e38f, 1e30f, 448.0f, 1.0f, 0.015625f, 1e-10f};
  Tensor t;
  t.cols = 2;
  for (const float partner : kPartners) {
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      if ((bits & 0x7f80) == 0x7f80) continue;
      if (std::fabs(Bf16Value(static_cast<uint16_t>(bits))) > partner) continue;
      t.bits.push_back(static_cast<uint16_t>(bits));
      t.bits.push_back(Bf16Bits(partner));
      ++t.rows;
    }
  }
  return t;
}

// `fp8` and `scales` (the case's buffers after a quantization) hold, in the window, the
// reference's bytes and the host kernel's, and 0xff elsewhere; the scales are the reference's.
inline void ExpectDeviceResult(const DeviceCase& c, const std::vector<uint8_t>& fp8,
                               const std::vector<float>& scales) {
  const ReferenceFp8 ref = Reference(c.blocking, c.tensor);
  const Quantized fast = Fast(c.blocking, c.tensor);
  const Tensor& t = c.tensor;
  ASSERT_EQ(fp8.size(), c.fp8.size());
  for (int64_t e = 0; e < c.window_extent[0]; ++e) {
    for (int64_t r = 0; r < c.window_extent[1]; ++r) {
      for (int64_t col = 0; col < c.OutputRow(); ++col) {
        const uint8_t got = fp8[(e * c.window_extent[1] + r) * c.OutputRow() + col];
        if (col >= c.window_extent[2]) {
          ASSERT_EQ(got, 0xff) << "padding written at (" << e << ", " << r << ", " << col << ")";
          continue;
        }
        const int64_t flat = ((c.window_origin[0] + e) * t.rows + c.window_origin[1] + r) * t.cols +
                             c.window_origin[2] + col;
        ASSERT_EQ(got, ref.fp8[flat])
            << "element " << flat << " (window " << e << ", " << r << ", " << col << ")";
        ASSERT_EQ(got, fast.fp8[flat]) << "element " << flat;
      }
    }
  }
  ASSERT_EQ(scales.size(), ref.scales.size());
  for (int64_t e = 0; e < t.experts; ++e) {
    for (int64_t br = 0; br < c.scale_rows; ++br) {
      for (int64_t bc = 0; bc < c.scale_cols; ++bc) {
        const float got = scales[e * c.scale_rows * c.scale_cols + bc * c.scale_rows + br];
        const int64_t flat = (e * c.scale_rows + br) * c.scale_cols + bc;
        ASSERT_EQ(Bits(got), Bits(ref.scales[flat])) << "scale " << flat;
        ASSERT_EQ(Bits(got), Bits(fast.scales[flat])) << "scale " << flat;
      }
    }
  }
}

}  // namespace wsync::fp8_test

#endif  // WSYNC_TESTS_UNIT_FP8_DEVICE_SUPPORT_H_
