#ifndef WSYNC_PLANNER_QUANT_LAYOUT_H_
#define WSYNC_PLANNER_QUANT_LAYOUT_H_

// FP8 target parameters in layouts (issue 22): the scale blocks of a quantized parameter per axis,
// its scale tensor's shape, whole-block boxes, and the validation of ParamQuant. Pure functions;
// thread-safe.
//
// A quantized parameter of rank 2 ([rows, cols]) has blocks {block_rows, block_cols}; of rank 3
// ([experts, rows, cols], a routed expert tensor) {1, block_rows, block_cols}: every expert is
// scaled on its own. The scale tensor has BlockCount(block, extent) elements per axis
// (quant/fp8.h).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "planner/geometry.h"
#include "planner/layout.h"

namespace wsync {

// The quantization rule (quant/fp8.h) as the plan digest records it: processes built with another
// rule get other digests and refuse each other.
inline constexpr absl::string_view kQuantRule =
    "fp8_e4m3fn;rne;saturate;scale=fp32(max(amax,1e-10)/448)";

// Block extent per axis of a quantized parameter of rank 2 or 3.
Dims QuantBlockDims(const ParamQuant& quant, int rank);

// The fp32 scale tensor's shape: BlockCount(blocks[a], shape[a]) per axis.
Dims QuantScaleShape(const Dims& shape, const Dims& blocks);

// The smallest box of whole blocks (the last block of an axis ragged) that contains `box`.
Box WholeBlockBox(const Dims& blocks, const Dims& shape, const Box& box);

// True when `box` is made of whole blocks: WholeBlockBox(blocks, shape, box) == box.
bool IsWholeBlockBox(const Dims& blocks, const Dims& shape, const Box& box);

// The scale elements that the whole-block box `whole` owns (ScaleRange per axis).
Box ScaleBox(const Dims& blocks, const Dims& shape, const Box& whole);

// The links between quantized parameters and their scale parameters, by index into
// layout.params: scale_of[q] is q's scale parameter (-1 when q is not quantized) and
// quantized_of[s] the parameter s scales (-1 when s is no scale parameter). For a layout that
// ValidateLayout accepted.
struct QuantLinks {
  std::vector<int32_t> scale_of;
  std::vector<int32_t> quantized_of;
};
QuantLinks LinkQuantParams(const Layout& layout);

// Part of ValidateLayout: a trainer layout quantizes nothing. In a rollout layout a quantized
// parameter is fp8_e4m3 of rank 2 or 3 with blocks >= 1, and its scale_param names another
// parameter, unquantized, fp32, of shape QuantScaleShape, scaling no other parameter. Per process,
// the pieces of a quantized parameter share no scale block, and its scale pieces hold exactly the
// scales of those pieces' whole-block boxes: each piece's ScaleBox lies inside one scale piece of
// its process, and the scale pieces' volumes add up to the ScaleBoxes' volumes.
// InvalidArgument naming the parameter (and process) otherwise.
absl::Status ValidateQuantParams(const Layout& layout);

// Part of ValidatePair: source parameter `source` (a trainer's) may feed target parameter `target`
// when they agree on the shape and either dtype (unquantized) or, for a quantized target, the
// source is bf16 or fp32. InvalidArgument naming the parameter otherwise.
absl::Status CheckPairedParams(const ParamInfo& source, const ParamInfo& target);

}  // namespace wsync

#endif  // WSYNC_PLANNER_QUANT_LAYOUT_H_
