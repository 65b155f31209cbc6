#include "planner/named_quant.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "planner/quant_layout.h"
#include "quant/fp8.h"

namespace wsync {

std::string ScaleParamName(absl::string_view weight_name, WeightQuant quant) {
  return absl::StrCat(weight_name, quant == WeightQuant::kFp8Block ? "_scale_inv" : "_scale");
}

ParamQuant BlocksOf(const ModelSpec& model, WeightQuant quant) {
  switch (quant) {
    case WeightQuant::kFp8Block:
      return ParamQuant{model.quantization.weight_block_rows, model.quantization.weight_block_cols,
                        ""};
    case WeightQuant::kFp8Channel:
      return ParamQuant{1, quant::kWholeAxis, ""};
    case WeightQuant::kFp8Tensor:
      return ParamQuant{quant::kWholeAxis, quant::kWholeAxis, ""};
    case WeightQuant::kNone:
      break;
  }
  return ParamQuant{};
}

absl::StatusOr<std::vector<int32_t>> AddQuantParams(LayoutBuilder& builder, const ModelSpec& model,
                                                    WeightQuant quant) {
  std::vector<int32_t> scale_of(model.tensors.size(), -1);
  if (quant == WeightQuant::kNone) return scale_of;
  const ParamQuant blocks = BlocksOf(model, quant);
  absl::flat_hash_map<absl::string_view, bool> fused_quantized;
  for (int32_t i = 0; i < static_cast<int32_t>(model.tensors.size()); ++i) {
    const TensorSpec& t = model.tensors[i];
    WSYNC_ASSIGN_OR_RETURN(const bool quantized, IsQuantizedParameter(model, t.name, quant));
    if (!t.fused_name.empty()) {
      auto [it, inserted] = fused_quantized.try_emplace(t.fused_name, quantized);
      if (it->second != quantized) {
        return absl::InvalidArgumentError(
            absl::StrCat("vllm: quant=", WeightQuantName(quant), " would make part ", t.name,
                         " of ", t.fused_name, " differ from its other parts"));
      }
    }
    if (!quantized) continue;
    if (t.role == ShardRole::kVocab) {
      return absl::InvalidArgumentError(absl::StrCat("vllm: quant=", WeightQuantName(quant),
                                                     " would quantize the vocabulary tensor ",
                                                     t.name, "; keep it in modules_not_converted"));
    }
    const std::string scale_name = ScaleParamName(t.name, quant);
    ParamInfo& param = builder.mutable_layout().params[i];
    param.dtype = DType::kFloat8E4M3;
    param.quant = blocks;
    param.quant.scale_param = scale_name;
    const Dims scale_shape =
        QuantScaleShape(t.shape, QuantBlockDims(blocks, static_cast<int>(t.shape.size())));
    scale_of[i] = builder.AddParam(scale_name, DType::kFloat32, scale_shape);
  }
  return scale_of;
}

namespace {

// The refusal of CheckVllmBlockPartitions: `what` says which partition of tensor `t` is not whole
// blocks, `vllm_says` quotes vLLM's error.
absl::Status BlockRefusal(const ModelSpec& model, int32_t tp, const TensorSpec& t,
                          absl::string_view what, int64_t size, absl::string_view block_axis,
                          int64_t block, absl::string_view vllm_says) {
  const std::string tensor =
      t.fused_name.empty() ? t.name : absl::StrCat(t.name, " (in vLLM's ", t.fused_name, ")");
  return absl::InvalidArgumentError(
      absl::StrCat("vllm: quant=fp8_block at tp=", tp, ": ", model.name, "'s ", tensor, " has ",
                   what, " of ", size, " per rank, not a whole number of ", block, "-", block_axis,
                   " FP8 blocks, and vLLM refuses to build it (\"", vllm_says, " = ", size,
                   " is not divisible by weight quantization block_",
                   block_axis == "row" ? "n" : "k", " = ", block, "\")"));
}

}  // namespace

absl::Status CheckVllmBlockPartitions(const ModelSpec& model, WeightQuant quant, int32_t tp,
                                      absl::Span<const int32_t> parts,
                                      absl::FunctionRef<Box(int32_t)> rank0_box) {
  if (quant != WeightQuant::kFp8Block || parts.empty()) return absl::OkStatus();
  const TensorSpec& first = model.tensors[parts.front()];
  WSYNC_ASSIGN_OR_RETURN(const bool quantized, IsQuantizedParameter(model, first.name, quant));
  if (!quantized) return absl::OkStatus();
  const int64_t block_n = model.quantization.weight_block_rows;
  const int64_t block_k = model.quantization.weight_block_cols;
  for (size_t k = 0; k < parts.size(); ++k) {
    const TensorSpec& t = model.tensors[parts[k]];
    const Box box = rank0_box(parts[k]);
    switch (t.role) {
      case ShardRole::kExpertColumn:  // [E, I_p, H]
        if (box.extent[1] % block_n != 0) {
          return BlockRefusal(model, tp, t, "an intermediate partition (rows of each expert)",
                              box.extent[1], "row", block_n,
                              "The output_size of gate's and up's weight");
        }
        break;
      case ShardRole::kExpertRow:  // [E, H, I_p]
        if (tp > 1 && box.extent[2] % block_k != 0) {
          return BlockRefusal(model, tp, t, "an intermediate partition (columns of each expert)",
                              box.extent[2], "column", block_k, "The input_size of down's weight");
        }
        break;
      case ShardRole::kRow:
        if (tp > 1 && box.extent[1] % block_k != 0) {
          return BlockRefusal(model, tp, t, "an input partition", box.extent[1], "column", block_k,
                              "Weight input_size_per_partition");
        }
        break;
      default: {
        // Column-parallel split by TP: every part; otherwise every fused part but the last.
        const bool tp_split = tp > 1 && t.role == ShardRole::kColumn;
        const bool checked = tp_split || (parts.size() > 1 && k + 1 < parts.size());
        if (checked && box.extent[0] % block_n != 0) {
          return BlockRefusal(model, tp, t, "an output partition", box.extent[0], "row", block_n,
                              "Weight output_partition_size");
        }
        break;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace wsync
