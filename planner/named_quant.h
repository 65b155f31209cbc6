#ifndef WSYNC_PLANNER_NAMED_QUANT_H_
#define WSYNC_PLANNER_NAMED_QUANT_H_

// The FP8 parameters of `vllm(..., quant=fp8_block|fp8_channel|fp8_tensor)` (named_layouts.h).
// Internal to the planner.
//
// Which tensors are FP8 is the model's quantization config (IsQuantizedParameter, models.h).
// Each FP8 tensor "<module>.weight" gets an fp32 scale parameter under vLLM's name
// (vllm-project/vllm, vllm/model_executor/layers/quantization/fp8.py at commit 0071b24bf8fe):
//   fp8_block    "<module>.weight_scale_inv": Fp8LinearMethod registers "weight_scale_inv",
//                [ceil(rows / 128), ceil(cols / 128)]; Fp8MoEMethod "w13_weight_scale_inv"
//                [E, 2 * ceil(I / 128), ceil(H / 128)] and "w2_weight_scale_inv"
//                [E, ceil(H / 128), ceil(I / 128)]: per expert, the scales of the fused parts
//                concatenated like the weights (exact when each part's rows are whole blocks,
//                which vLLM requires of block FP8 partitions; otherwise part after part).
//   fp8_channel  "<module>.weight_scale", one scale per output row: [rows, 1] ([E, rows, 1]).
//   fp8_tensor   "<module>.weight_scale", one per logical tensor: [1, 1] ([E, 1, 1]) (vLLM keeps
//                one per fused part too and requantizes them after loading).
// A fused module's scales share one buffer, like its weights.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/builders.h"
#include "planner/models.h"

namespace wsync {

// The scale parameter's name of FP8 weight `weight_name` ("...weight" -> "...weight_scale_inv"
// for fp8_block, "...weight_scale" otherwise).
std::string ScaleParamName(absl::string_view weight_name, WeightQuant quant);

// The ParamQuant blocks of `quant` for a model (fp8_block: the model's weight_block_size;
// fp8_channel: 1 x whole axis; fp8_tensor: whole x whole).
ParamQuant BlocksOf(const ModelSpec& model, WeightQuant quant);

// For a layout whose parameter i is model.tensors[i] (named_layouts.cc AddParams): makes every
// tensor IsQuantizedParameter names fp8_e4m3 with its ParamQuant and appends its scale parameter.
// Returns, per tensor, the index of its scale parameter (-1: stays as trained). InvalidArgument
// when a fused module mixes FP8 and unquantized parts, or a vocabulary tensor would be FP8.
absl::StatusOr<std::vector<int32_t>> AddQuantParams(LayoutBuilder& builder, const ModelSpec& model,
                                                    WeightQuant quant);

}  // namespace wsync

#endif  // WSYNC_PLANNER_NAMED_QUANT_H_
