#include "quant/fp8_device_host.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace wsync::quant {

absl::Status CheckFp8DeviceQuant(const Fp8DeviceQuant& q, absl::string_view parameter) {
  const auto fail = [&](auto&&... message) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", parameter, ": device FP8 quantization: ", message...));
  };
  if (q.input_type != kFp8InputBf16 && q.input_type != kFp8InputFp32) {
    return fail("input type ", q.input_type, " (bf16 or fp32 only)");
  }
  if (q.experts < 0 || q.rows < 0 || q.cols < 0) return fail("negative extent");
  if (q.block_rows < 1 || q.block_cols < 1) {
    return fail("scale blocks of ", q.block_rows, " x ", q.block_cols);
  }
  const int64_t extent[3] = {q.experts, q.rows, q.cols};
  bool window_empty = false;
  for (int axis = 0; axis < 3; ++axis) {
    if (q.window_origin[axis] < 0 || q.window_extent[axis] < 0 ||
        q.window_origin[axis] + q.window_extent[axis] > extent[axis]) {
      return fail("window axis ", axis, " [", q.window_origin[axis], ", +", q.window_extent[axis],
                  ") outside [0, ", extent[axis], ")");
    }
    window_empty = window_empty || q.window_extent[axis] == 0;
  }
  if (MakeFp8Tiling(q).tiles == 0) return absl::OkStatus();
  if (q.input == nullptr || q.scales == nullptr || q.report == nullptr ||
      (q.fp8 == nullptr && !window_empty)) {
    return fail("null input, output, scales or report");
  }
  return absl::OkStatus();
}

absl::Status Fp8ReportStatus(unsigned long long report,  // NOLINT(runtime/int)
                             const Fp8DeviceQuant& q, absl::string_view parameter) {
  if (report == kFp8NoNonFinite) return absl::OkStatus();
  const bool infinity = (report & 1) != 0;
  const int64_t index = static_cast<int64_t>(report >> 1);
  const int64_t matrix = std::max<int64_t>(q.rows * q.cols, 1);
  const int64_t cols = std::max<int64_t>(q.cols, 1);
  return absl::InvalidArgumentError(absl::StrCat("parameter ", parameter, ": cannot quantize ",
                                                 infinity ? "an infinity" : "NaN", " at element (",
                                                 index / matrix, ", ", index % matrix / cols, ", ",
                                                 index % cols, ") of the region to FP8"));
}

void QuantizeFp8DeviceOnHost(const Fp8DeviceQuant& q) {
  const Fp8Tiling t = MakeFp8Tiling(q);
  if (q.report != nullptr) *q.report = kFp8NoNonFinite;
  // The scale slots hold the blocks' amax bits until the last pass, as on the device.
  auto get = [&](int64_t scale) { return Fp8FloatBits(*Fp8ScaleSlot(q, t, scale)); };
  auto set = [&](int64_t scale, uint32_t bits) { *Fp8ScaleSlot(q, t, scale) = Fp8BitsFloat(bits); };
  for (int64_t s = 0; s < t.scales; ++s) set(s, 0);
  Fp8Tile tile;
  for (int64_t index = 0; index < t.tiles; ++index) {
    if (!Fp8TileAt(q, t, index, tile)) continue;
    uint32_t amax = 0;
    for (int64_t r = tile.r0; r < tile.r1; ++r) {
      for (int64_t c = tile.c0; c < tile.c1; ++c) {
        const uint32_t bits = Fp8InputBits(q, Fp8InputOffset(q, tile.expert, r, c)) & 0x7fffffffu;
        if (bits >= kFp8NonFiniteBits) {
          *q.report = std::min(*q.report, Fp8NonFiniteKey(q, tile.expert, r, c, bits));
        }
        amax = std::max(amax, bits);
      }
    }
    set(tile.scale, std::max(get(tile.scale), amax));
  }
  for (int64_t index = 0; index < t.tiles; ++index) {
    if (!Fp8TileAt(q, t, index, tile)) continue;
    const uint32_t amax = get(tile.scale);
    if (amax >= kFp8NonFiniteBits) continue;
    const float scale = Fp8ScaleOf(amax);
    for (int64_t r = tile.r0; r < tile.r1; ++r) {
      for (int64_t c = tile.c0; c < tile.c1; ++c) {
        uint8_t* out = Fp8OutputAt(q, tile.expert, r, c);
        if (out == nullptr) continue;
        const float x = Fp8BitsFloat(Fp8InputBits(q, Fp8InputOffset(q, tile.expert, r, c)));
        *out = Fp8EncodeE4m3(Fp8Divide(x, scale));
      }
    }
  }
  for (int64_t s = 0; s < t.scales; ++s) {
    const uint32_t amax = get(s);
    if (amax < kFp8NonFiniteBits) *Fp8ScaleSlot(q, t, s) = Fp8ScaleOf(amax);
  }
}

}  // namespace wsync::quant
