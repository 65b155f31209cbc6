#ifndef WSYNC_INTEGRATION_FILL_FP8_REFERENCE_H_
#define WSYNC_INTEGRATION_FILL_FP8_REFERENCE_H_

// The reference FP8 quantizer that the fast kernels (quant/fp8.h) and, later, the CUDA kernel and
// the sync's transform segments are compared against bit for bit. Written to be read, not to be
// fast: one element at a time, the e4m3 code built from the value's binary exponent and an
// integer significand rounded by hand, sharing no code or table with quant/.
//
// The rules (the same as quant/fp8.h states):
// - e4m3 is OCP FP8 E4M3 "fn" (torch.float8_e4m3fn): value = (-1)^s * 2^(e-7) * (1 + m/8) for
//   exponent field e in 1..15 (except e = 15, m = 7: NaN, 0x7f / 0xff), and (-1)^s * 2^-6 * m/8
//   for e = 0. The largest finite value is 448 (0x7e); there are no infinities.
// - Each block of `block_rows` x `block_cols` elements of each matrix (the last block of an axis
//   ragged) has scale = fp32(max(amax, 1e-10f) / 448), with amax the largest |x| of the block; the
//   floor is vLLM's eps of per_token_group_quant_fp8
//   (vllm/model_executor/layers/quantization/utils/fp8_utils.py), so an all-zero block has the
//   scale 1e-10f / 448 and all-zero bytes.
// - Each element becomes e4m3(fp32(x / scale)) rounded to nearest (ties to even), saturated at
//   +-448. The scale is DeepSeek-V3's `weight_scale_inv`: dequantized = fp8 * scale
//   (deepseek-ai/DeepSeek-V3, inference/kernel.py, weight_dequant: y = x * s).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace wsync::testing {

// The e4m3 byte nearest to `value` (ties to the even code), saturating at +-448. `value` must be
// finite. Signed zeros keep their sign (-0 -> 0x80).
uint8_t ReferenceEncodeE4m3(double value);

// The value of an e4m3 byte; NaN for 0x7f and 0xff.
double ReferenceDecodeE4m3(uint8_t code);

// bf16 bits <-> value (bf16 is the high half of an fp32).
double Bf16Value(uint16_t bits);
// The bf16 nearest to a finite `value` that is exactly an fp32 (truncated mantissa, round to
// nearest even).
uint16_t Bf16Bits(float value);

struct ReferenceFp8 {
  std::vector<uint8_t> fp8;   // [experts, rows, cols], row-major
  std::vector<float> scales;  // [experts, block rows, block cols], row-major
  int64_t scale_rows = 0;
  int64_t scale_cols = 0;
};

// Quantizes the row-major tensor [experts, rows, cols] of `values` (each exactly a bf16 or an
// fp32 value) with blocks of `block_rows` x `block_cols` (any value >= the axis: the whole axis).
// InvalidArgument naming `parameter` for a NaN or infinity, or a size that disagrees.
absl::StatusOr<ReferenceFp8> ReferenceQuantizeFp8(absl::Span<const double> values, int64_t experts,
                                                  int64_t rows, int64_t cols, int64_t block_rows,
                                                  int64_t block_cols, absl::string_view parameter);

// fp8 * scale for every element, [experts, rows, cols] row-major.
std::vector<double> ReferenceDequantizeFp8(const ReferenceFp8& quantized, int64_t experts,
                                           int64_t rows, int64_t cols, int64_t block_rows,
                                           int64_t block_cols);

}  // namespace wsync::testing

#endif  // WSYNC_INTEGRATION_FILL_FP8_REFERENCE_H_
