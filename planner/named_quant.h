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

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/builders.h"
#include "planner/geometry.h"
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

// vLLM's rule for block-FP8 partitions, for one module of `vllm(tp=tp, ...,
// quant=fp8_block)`: `parts` are the module's tensor indices in fuse order (one for an unfused
// module) and rank0_box(i) the box of tensor i that TP rank 0 holds (every rank's sizes are the
// same). OK when the module stays as trained or vLLM accepts its partitions; InvalidArgument,
// naming the model, the tensor, the partition and the block size, when vLLM refuses them
// (vllm-project/vllm at commit 0071b24bf8fe, vllm/model_executor/layers/quantization/fp8.py
// Fp8LinearMethod.create_weights, later vllm/model_executor/layers/quantization/utils/fp8_utils.py
// validate_fp8_block_shape; Fp8MoEMethod.create_weights). With block_n x block_k the model's
// weight_block_size:
//   linear layers   a row-parallel layer split by tp > 1 needs its input partition (columns per
//                   rank) to be whole block_k; a column-parallel layer split by tp > 1 needs each
//                   part's rows per rank (q, k, v of qkv_proj; gate, up of gate_up_proj) to be
//                   whole block_n; a fused module that TP does not split (tp = 1, or MLA's
//                   replicated fused_qkv_a_proj) needs it of every part but the last. Unfused
//                   layers that TP does not split have no rule (a ragged last block is fine).
//                   vLLM since PR #30836 (linear.py _maybe_allow_fp8_block_shape_mismatch) loads a
//                   fused module with a part that is not whole blocks anyway, with blocks that
//                   straddle two parts and one scale for both; no per-part quantization gives
//                   those scales, so such a module stays refused here.
//   routed experts  the intermediate partition I_p (I / tp without expert parallelism, the whole
//                   I with it: experts are whole) must be whole block_n (the rows of gate and up),
//                   and, when tp > 1, whole block_k (the columns of down).
// fp8_channel and fp8_tensor have no such rule (OK for any other `quant`).
absl::Status CheckVllmBlockPartitions(const ModelSpec& model, WeightQuant quant, int32_t tp,
                                      absl::Span<const int32_t> parts,
                                      absl::FunctionRef<Box(int32_t)> rank0_box);

}  // namespace wsync

#endif  // WSYNC_PLANNER_NAMED_QUANT_H_
