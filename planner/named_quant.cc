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

}  // namespace wsync
