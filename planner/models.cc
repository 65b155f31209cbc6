#include "planner/models.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace wsync {
namespace {

// The modules that FP8 checkpoints and vLLM's FP8 linear layers keep in bf16 besides every 1-D
// tensor (norms, biases, DeepSeek-V3's fp32 e_score_correction_bias):
// - DeepSeek-V3 / Kimi-K2 (config.json quantization_config: quant_method "fp8", fmt "e4m3",
//   activation_scheme "dynamic", weight_block_size [128, 128]; deepseek-ai/DeepSeek-V3
//   README_WEIGHTS.md): every linear weight carries a `weight_scale_inv` except
//   model.embed_tokens, lm_head and the MoE router mlp.gate.
// - Qwen FP8 checkpoints (quant_method "fp8", weight_block_size [128, 128]) name
//   modules_to_not_convert ["lm_head", "model.embed_tokens"]; vLLM builds the MoE routers
//   (mlp.gate, and Qwen2-MoE's [1, hidden] mlp.shared_expert_gate) without a quantization config.
std::vector<std::string> DefaultModulesNotConverted() {
  return {"embed_tokens", "lm_head", "mlp.gate", "mlp.shared_expert_gate"};
}

// The fields of a public config.json that determine parameter shapes.
struct Config {
  std::string name;
  int64_t hidden = 0;
  int64_t intermediate = 0;  // Dense MLP.
  int32_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  bool tied = false;
  bool qkv_bias = false;
  bool qk_norm = false;  // Per-head RMS norms of q and k (Qwen3).
  // Mixture of experts: layers [first_dense, layers) route to `experts` experts.
  int64_t experts = 0;
  int64_t moe_intermediate = 0;
  int64_t shared_experts = 0;
  // Qwen2-MoE names its one shared expert "mlp.shared_expert." and scales its output by a
  // sigmoid gate, "mlp.shared_expert_gate.weight" [1, hidden]; DeepSeek-V3 has neither.
  bool qwen2_moe_shared = false;
  int64_t shared_intermediate = 0;  // Qwen2-MoE's shared_expert_intermediate_size.
  int32_t first_dense = 0;
  bool router_bias = false;  // e_score_correction_bias, fp32.
  // Multi-head latent attention (DeepSeek-V3); replaces q/k/v/o when mla is set.
  bool mla = false;
  int64_t q_lora = 0;
  int64_t kv_lora = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
  // quantization_config of the model's FP8 checkpoints (QuantizationConfig); every model uses
  // the defaults below unless its entry in Configs() says otherwise.
  std::vector<std::string> modules_not_converted = DefaultModulesNotConverted();
  int64_t block_rows = 128;  // weight_block_size
  int64_t block_cols = 128;
};

void AddAttention(const Config& c, int32_t layer, const std::string& p, ModelSpec& w) {
  struct Part {
    const char* name;
    int64_t heads;
  };
  const Part parts[] = {{"q_proj", c.heads}, {"k_proj", c.kv_heads}, {"v_proj", c.kv_heads}};
  // q | k | v fused along axis 0: the weights, then the biases where the model has them.
  for (const bool bias : {false, true}) {
    if (bias && !c.qkv_bias) continue;
    const char* suffix = bias ? "bias" : "weight";
    const std::string fused = absl::StrCat(p, "self_attn.qkv_proj.", suffix);
    for (int32_t i = 0; i < 3; ++i) {
      const int64_t rows = parts[i].heads * c.head_dim;
      w.AddFusedTensor(absl::StrCat(p, "self_attn.", parts[i].name, ".", suffix),
                       bias ? Dims{rows} : Dims{rows, c.hidden}, ShardRole::kColumn, layer,
                       FuseKind::kQkv, fused, i)
          .heads = parts[i].heads;
    }
  }
  const int64_t q_rows = c.heads * c.head_dim;
  w.AddTensor(absl::StrCat(p, "self_attn.o_proj.weight"), {c.hidden, q_rows}, ShardRole::kRow,
              layer);
  if (c.qk_norm) {
    w.AddTensor(absl::StrCat(p, "self_attn.q_norm.weight"), {c.head_dim}, ShardRole::kReplicated,
                layer);
    w.AddTensor(absl::StrCat(p, "self_attn.k_norm.weight"), {c.head_dim}, ShardRole::kReplicated,
                layer);
  }
}

void AddLatentAttention(const Config& c, int32_t layer, const std::string& p, ModelSpec& w) {
  const std::string qkv_a = absl::StrCat(p, "self_attn.fused_qkv_a_proj.weight");
  w.AddFusedTensor(absl::StrCat(p, "self_attn.q_a_proj.weight"), {c.q_lora, c.hidden},
                   ShardRole::kReplicated, layer, FuseKind::kMlaQkvA, qkv_a, 0);
  w.AddTensor(absl::StrCat(p, "self_attn.q_a_layernorm.weight"), {c.q_lora}, ShardRole::kReplicated,
              layer);
  w.AddTensor(absl::StrCat(p, "self_attn.q_b_proj.weight"),
              {c.heads * (c.qk_nope + c.qk_rope), c.q_lora}, ShardRole::kColumn, layer)
      .heads = c.heads;
  w.AddFusedTensor(absl::StrCat(p, "self_attn.kv_a_proj_with_mqa.weight"),
                   {c.kv_lora + c.qk_rope, c.hidden}, ShardRole::kReplicated, layer,
                   FuseKind::kMlaQkvA, qkv_a, 1);
  w.AddTensor(absl::StrCat(p, "self_attn.kv_a_layernorm.weight"), {c.kv_lora},
              ShardRole::kReplicated, layer);
  w.AddTensor(absl::StrCat(p, "self_attn.kv_b_proj.weight"),
              {c.heads * (c.qk_nope + c.v_head), c.kv_lora}, ShardRole::kColumn, layer)
      .heads = c.heads;
  w.AddTensor(absl::StrCat(p, "self_attn.o_proj.weight"), {c.hidden, c.heads * c.v_head},
              ShardRole::kRow, layer);
}

// gate_proj / up_proj / down_proj of a dense MLP (prefix "mlp.") or of the shared experts
// (prefix "mlp.shared_experts."), with `inner` intermediate features.
void AddGatedMlp(const Config& c, int32_t layer, const std::string& p, int64_t inner,
                 ModelSpec& w) {
  const std::string gate_up = absl::StrCat(p, "gate_up_proj.weight");
  w.AddFusedTensor(absl::StrCat(p, "gate_proj.weight"), {inner, c.hidden}, ShardRole::kColumn,
                   layer, FuseKind::kGateUp, gate_up, 0);
  w.AddFusedTensor(absl::StrCat(p, "up_proj.weight"), {inner, c.hidden}, ShardRole::kColumn, layer,
                   FuseKind::kGateUp, gate_up, 1);
  w.AddTensor(absl::StrCat(p, "down_proj.weight"), {c.hidden, inner}, ShardRole::kRow, layer);
}

void AddMoe(const Config& c, int32_t layer, const std::string& p, ModelSpec& w) {
  w.AddTensor(absl::StrCat(p, "mlp.gate.weight"), {c.experts, c.hidden}, ShardRole::kReplicated,
              layer);
  if (c.router_bias) {
    w.AddTensor(absl::StrCat(p, "mlp.gate.e_score_correction_bias"), {c.experts},
                ShardRole::kReplicated, layer)
        .dtype = DType::kFloat32;
  }
  const std::string w13 = absl::StrCat(p, "mlp.experts.w13_weight");
  w.AddFusedTensor(absl::StrCat(p, "mlp.experts.gate_proj.weight"),
                   {c.experts, c.moe_intermediate, c.hidden}, ShardRole::kExpertColumn, layer,
                   FuseKind::kExpertW13, w13, 0);
  w.AddFusedTensor(absl::StrCat(p, "mlp.experts.up_proj.weight"),
                   {c.experts, c.moe_intermediate, c.hidden}, ShardRole::kExpertColumn, layer,
                   FuseKind::kExpertW13, w13, 1);
  w.AddTensor(absl::StrCat(p, "mlp.experts.down_proj.weight"),
              {c.experts, c.hidden, c.moe_intermediate}, ShardRole::kExpertRow, layer)
      .fused_name = absl::StrCat(p, "mlp.experts.w2_weight");
  if (c.qwen2_moe_shared) {
    AddGatedMlp(c, layer, absl::StrCat(p, "mlp.shared_expert."), c.shared_intermediate, w);
    w.AddTensor(absl::StrCat(p, "mlp.shared_expert_gate.weight"), {1, c.hidden},
                ShardRole::kReplicated, layer);
  } else if (c.shared_experts > 0) {
    AddGatedMlp(c, layer, absl::StrCat(p, "mlp.shared_experts."),
                c.shared_experts * c.moe_intermediate, w);
  }
}

ModelSpec Build(const Config& c) {
  ModelSpec spec;
  spec.name = c.name;
  spec.num_layers = c.layers;
  spec.vocab = c.vocab;
  spec.tied_embeddings = c.tied;
  spec.quantization.modules_not_converted = c.modules_not_converted;
  spec.quantization.weight_block_rows = c.block_rows;
  spec.quantization.weight_block_cols = c.block_cols;
  ModelSpec& w = spec;
  w.AddTensor("model.embed_tokens.weight", {c.vocab, c.hidden}, ShardRole::kVocab, -1);
  for (int32_t layer = 0; layer < c.layers; ++layer) {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    w.AddTensor(absl::StrCat(p, "input_layernorm.weight"), {c.hidden}, ShardRole::kReplicated,
                layer);
    if (c.mla) {
      AddLatentAttention(c, layer, p, w);
    } else {
      AddAttention(c, layer, p, w);
    }
    w.AddTensor(absl::StrCat(p, "post_attention_layernorm.weight"), {c.hidden},
                ShardRole::kReplicated, layer);
    if (c.experts > 0 && layer >= c.first_dense) {
      AddMoe(c, layer, p, w);
    } else {
      AddGatedMlp(c, layer, absl::StrCat(p, "mlp."), c.intermediate, w);
    }
  }
  w.AddTensor("model.norm.weight", {c.hidden}, ShardRole::kReplicated, -2);
  if (!c.tied) w.AddTensor("lm_head.weight", {c.vocab, c.hidden}, ShardRole::kVocab, -2);
  return spec;
}

// Not published models: each family's structure at a size tests fill and compare element by
// element (tests/python/families.py describes the same models to the Python layouts).
void AddTestConfigs(std::vector<Config>& configs) {
  Config base;
  base.hidden = 64, base.intermediate = 96, base.layers = 2, base.heads = 4, base.kv_heads = 2;
  base.head_dim = 16, base.vocab = 200;
  {
    Config& c = configs.emplace_back(base);
    c.name = "llama-3-tiny";
  }
  {
    Config& c = configs.emplace_back(base);
    c.name = "qwen3-tiny";
    c.qk_norm = true;
  }
  {
    Config& c = configs.emplace_back(base);
    c.name = "qwen3-moe-tiny";
    c.qk_norm = true, c.experts = 6, c.moe_intermediate = 32;
  }
  {
    Config& c = configs.emplace_back(base);
    c.name = "qwen2-moe-tiny";
    c.qkv_bias = true, c.experts = 4, c.moe_intermediate = 32;
    c.qwen2_moe_shared = true, c.shared_intermediate = 64;
  }
  {
    Config& c = configs.emplace_back(base);
    c.name = "deepseek-v3-tiny";
    c.layers = 3, c.experts = 8, c.moe_intermediate = 16, c.shared_experts = 1;
    c.first_dense = 1, c.router_bias = true;
    c.mla = true, c.q_lora = 24, c.kv_lora = 16, c.qk_nope = 8, c.qk_rope = 8, c.v_head = 8;
    // 8 x 8 blocks: every partition of vllm(tp=2, ep=2) and of tp=1 is whole blocks, as vLLM
    // requires of block FP8 (named_quant.h); 128 would exceed the 16 rows of an expert.
    c.block_rows = 8, c.block_cols = 8;
  }
  {
    Config c = configs.back();  // Kimi-K2's structure is DeepSeek-V3's.
    c.name = "kimi-k2-tiny";
    c.layers = 2, c.experts = 6;
    configs.push_back(std::move(c));
  }
}

// From the models' config.json on the Hugging Face hub.
std::vector<Config> Configs() {
  std::vector<Config> configs;
  {
    Config& c = configs.emplace_back();  // Qwen/Qwen2.5-0.5B
    c.name = "qwen2.5-0.5b";
    c.hidden = 896, c.intermediate = 4864, c.layers = 24, c.heads = 14, c.kv_heads = 2;
    c.head_dim = 64, c.vocab = 151936, c.tied = true, c.qkv_bias = true;
  }
  {
    Config& c = configs.emplace_back();  // meta-llama/Meta-Llama-3-8B
    c.name = "llama-3-8b";
    c.hidden = 4096, c.intermediate = 14336, c.layers = 32, c.heads = 32, c.kv_heads = 8;
    c.head_dim = 128, c.vocab = 128256;
  }
  {
    Config& c = configs.emplace_back();  // meta-llama/Llama-3.2-1B
    c.name = "llama-3.2-1b";
    c.hidden = 2048, c.intermediate = 8192, c.layers = 16, c.heads = 32, c.kv_heads = 8;
    c.head_dim = 64, c.vocab = 128256, c.tied = true;
  }
  {
    Config& c = configs.emplace_back();  // Qwen/Qwen3-30B-A3B
    c.name = "qwen3-30b-a3b";
    c.hidden = 2048, c.intermediate = 6144, c.layers = 48, c.heads = 32, c.kv_heads = 4;
    c.head_dim = 128, c.vocab = 151936, c.qk_norm = true;
    c.experts = 128, c.moe_intermediate = 768;
  }
  {
    Config& c = configs.emplace_back();  // deepseek-ai/DeepSeek-V3 (without the MTP layer)
    c.name = "deepseek-v3";
    c.hidden = 7168, c.intermediate = 18432, c.layers = 61, c.heads = 128, c.vocab = 129280;
    c.experts = 256, c.moe_intermediate = 2048, c.shared_experts = 1, c.first_dense = 3;
    c.router_bias = true;
    c.mla = true, c.q_lora = 1536, c.kv_lora = 512, c.qk_nope = 128, c.qk_rope = 64;
    c.v_head = 128;
  }
  {
    Config c = configs.back();  // moonshotai/Kimi-K2-Instruct: DeepSeek-V3's architecture.
    c.name = "kimi-k2";
    c.heads = 64, c.vocab = 163840, c.experts = 384, c.first_dense = 1;
    configs.push_back(std::move(c));
  }
  {
    // Not a published model: the qwen2.5 structure (GQA with qkv biases, tied embeddings) at a size
    // that tests and demos can fill and verify element by element in well under a second.
    Config& c = configs.emplace_back();
    c.name = "qwen2.5-tiny";
    c.hidden = 128, c.intermediate = 320, c.layers = 2, c.heads = 4, c.kv_heads = 2;
    c.head_dim = 32, c.vocab = 1000, c.tied = true, c.qkv_bias = true;
    // Its FP8 checkpoint is ours: 64 x 128 blocks make the rows of q, k and gate whole blocks at
    // vllm(tp=1) (vLLM requires it of fused parts, named_quant.h; 128 rows would cut k's 64),
    // while megatron(tp=2) still cuts k, v, gate, up (rows) and o, down (columns) inside blocks
    // and down's 320 columns end in a ragged block. vllm(tp=2) is refused: k has 32 rows a rank.
    c.block_rows = 64, c.block_cols = 128;
  }
  AddTestConfigs(configs);
  return configs;
}

}  // namespace

TensorSpec& ModelSpec::AddTensor(std::string name, Dims shape, ShardRole role, int32_t layer) {
  TensorSpec& tensor = tensors.emplace_back();
  tensor.name = std::move(name);
  tensor.shape = std::move(shape);
  tensor.role = role;
  tensor.layer = layer;
  return tensor;
}

TensorSpec& ModelSpec::AddFusedTensor(std::string name, Dims shape, ShardRole role, int32_t layer,
                                      FuseKind fuse, std::string fused_name, int32_t fuse_index) {
  TensorSpec& tensor = AddTensor(std::move(name), std::move(shape), role, layer);
  tensor.fuse = fuse;
  tensor.fused_name = std::move(fused_name);
  tensor.fuse_index = fuse_index;
  return tensor;
}

int64_t ModelSpec::TotalElements() const {
  int64_t total = 0;
  for (const TensorSpec& tensor : tensors) total += Volume(tensor.shape);
  return total;
}

int64_t ModelSpec::TotalBytes() const {
  int64_t total = 0;
  for (const TensorSpec& tensor : tensors) total += Volume(tensor.shape) * DTypeSize(tensor.dtype);
  return total;
}

std::vector<std::string> ModelNames() {
  std::vector<std::string> names;
  for (const Config& c : Configs()) names.push_back(c.name);
  return names;
}

absl::StatusOr<ModelSpec> GetModel(absl::string_view name) {
  for (const Config& c : Configs()) {
    if (c.name == name) return Build(c);
  }
  return absl::NotFoundError(absl::StrCat("unknown model \"", name,
                                          "\"; known models: ", absl::StrJoin(ModelNames(), ", ")));
}

absl::string_view WeightQuantName(WeightQuant quant) {
  switch (quant) {
    case WeightQuant::kNone:
      return "none";
    case WeightQuant::kFp8Block:
      return "fp8_block";
    case WeightQuant::kFp8Channel:
      return "fp8_channel";
    case WeightQuant::kFp8Tensor:
      return "fp8_tensor";
  }
  return "invalid";
}

absl::StatusOr<WeightQuant> ParseWeightQuant(absl::string_view name) {
  for (const WeightQuant quant : {WeightQuant::kNone, WeightQuant::kFp8Block,
                                  WeightQuant::kFp8Channel, WeightQuant::kFp8Tensor}) {
    if (WeightQuantName(quant) == name) return quant;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown weight quantization \"", name,
                   "\"; known: none, fp8_block, fp8_channel, fp8_tensor"));
}

absl::StatusOr<bool> IsQuantizedParameter(const ModelSpec& model, absl::string_view parameter,
                                          WeightQuant quant) {
  const TensorSpec* found = nullptr;
  for (const TensorSpec& tensor : model.tensors) {
    if (tensor.name == parameter ||
        (!tensor.fused_name.empty() && tensor.fused_name == parameter)) {
      found = &tensor;
      break;
    }
  }
  if (found == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("model ", model.name, " has no parameter \"", parameter, "\""));
  }
  if (quant == WeightQuant::kNone) return false;
  constexpr absl::string_view kWeight = ".weight";
  const absl::string_view name = found->name;
  if (found->shape.size() < 2 || found->shape.size() > 3 || !absl::EndsWith(name, kWeight)) {
    return false;
  }
  const absl::string_view module = name.substr(0, name.size() - kWeight.size());
  for (const std::string& kept : model.quantization.modules_not_converted) {
    if (module == kept || absl::EndsWith(module, absl::StrCat(".", kept))) return false;
  }
  return true;
}

absl::StatusOr<ModelSpec> TruncateLayers(const ModelSpec& model, int32_t layers) {
  if (layers < 1 || layers > model.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("cannot keep ", layers, " layers of ",
                                                   model.name, ", which has ", model.num_layers));
  }
  ModelSpec out = model;
  out.name = absl::StrCat(model.name, "[", layers, " layers]");
  out.num_layers = layers;
  std::erase_if(out.tensors, [&](const TensorSpec& t) { return t.layer >= layers; });
  return out;
}

}  // namespace wsync
