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
#include "common/status.h"

namespace wsync {
namespace {

void AddAttention(const ModelConfig& c, int32_t layer, const std::string& p, ModelSpec& w) {
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
  if (c.o_bias) {
    w.AddTensor(absl::StrCat(p, "self_attn.o_proj.bias"), {c.hidden}, ShardRole::kReplicated,
                layer);
  }
  if (c.sinks) {
    w.AddTensor(absl::StrCat(p, "self_attn.sinks"), {c.heads}, ShardRole::kColumn, layer).dtype =
        DType::kFloat32;
  }
  if (c.qk_norm) {
    w.AddTensor(absl::StrCat(p, "self_attn.q_norm.weight"), {c.head_dim}, ShardRole::kReplicated,
                layer);
    w.AddTensor(absl::StrCat(p, "self_attn.k_norm.weight"), {c.head_dim}, ShardRole::kReplicated,
                layer);
  }
}

void AddLatentAttention(const ModelConfig& c, int32_t layer, const std::string& p, ModelSpec& w) {
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
  if (c.index_heads > 0) {
    const std::string x = absl::StrCat(p, "self_attn.indexer.");
    w.AddTensor(absl::StrCat(x, "wq_b.weight"), {c.index_heads * c.index_head_dim, c.q_lora},
                ShardRole::kReplicated, layer);
    w.AddTensor(absl::StrCat(x, "wk.weight"), {c.index_head_dim, c.hidden}, ShardRole::kReplicated,
                layer);
    w.AddTensor(absl::StrCat(x, "k_norm.weight"), {c.index_head_dim}, ShardRole::kReplicated,
                layer);
    w.AddTensor(absl::StrCat(x, "k_norm.bias"), {c.index_head_dim}, ShardRole::kReplicated, layer);
    w.AddTensor(absl::StrCat(x, "weights_proj.weight"), {c.index_heads, c.hidden},
                ShardRole::kReplicated, layer);
  }
}

// gate_proj / up_proj / down_proj of a dense MLP (prefix "mlp.") or of the shared experts
// (prefix "mlp.shared_experts."), with `inner` intermediate features.
void AddGatedMlp(const ModelConfig& c, int32_t layer, const std::string& p, int64_t inner,
                 ModelSpec& w) {
  const std::string gate_up = absl::StrCat(p, "gate_up_proj.weight");
  w.AddFusedTensor(absl::StrCat(p, "gate_proj.weight"), {inner, c.hidden}, ShardRole::kColumn,
                   layer, FuseKind::kGateUp, gate_up, 0);
  w.AddFusedTensor(absl::StrCat(p, "up_proj.weight"), {inner, c.hidden}, ShardRole::kColumn, layer,
                   FuseKind::kGateUp, gate_up, 1);
  w.AddTensor(absl::StrCat(p, "down_proj.weight"), {c.hidden, inner}, ShardRole::kRow, layer);
}

void AddMoe(const ModelConfig& c, int32_t layer, const std::string& p, ModelSpec& w) {
  w.AddTensor(absl::StrCat(p, "mlp.gate.weight"), {c.experts, c.hidden}, ShardRole::kReplicated,
              layer);
  if (c.router_bias) {
    w.AddTensor(absl::StrCat(p, "mlp.gate.e_score_correction_bias"), {c.experts},
                ShardRole::kReplicated, layer)
        .dtype = DType::kFloat32;
  }
  if (c.router_linear_bias) {
    w.AddTensor(absl::StrCat(p, "mlp.gate.bias"), {c.experts}, ShardRole::kReplicated, layer);
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

void AddLayer(const ModelConfig& c, int32_t layer, ModelSpec& w) {
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  w.AddTensor(absl::StrCat(p, "input_layernorm.weight"), {c.hidden}, ShardRole::kReplicated, layer);
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

// What an MTP layer holds besides its transformer layer (DeepSeek-V3's checkpoint names).
void AddMtpExtras(const ModelConfig& c, int32_t layer, ModelSpec& w) {
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  w.AddTensor(absl::StrCat(p, "embed_tokens.weight"), {c.vocab, c.hidden}, ShardRole::kVocab,
              layer);
  w.AddTensor(absl::StrCat(p, "enorm.weight"), {c.hidden}, ShardRole::kReplicated, layer);
  w.AddTensor(absl::StrCat(p, "hnorm.weight"), {c.hidden}, ShardRole::kReplicated, layer);
  w.AddTensor(absl::StrCat(p, "eh_proj.weight"), {c.hidden, 2 * c.hidden}, ShardRole::kReplicated,
              layer);
  w.AddTensor(absl::StrCat(p, "shared_head.norm.weight"), {c.hidden}, ShardRole::kReplicated,
              layer);
  w.AddTensor(absl::StrCat(p, "shared_head.head.weight"), {c.vocab, c.hidden}, ShardRole::kVocab,
              layer);
}

absl::Status Positive(const ModelConfig& c, absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("model ", c.name, ": ", field, " must be positive, not ", value));
}

absl::Status CheckConfig(const ModelConfig& c) {
  WSYNC_RETURN_IF_ERROR(Positive(c, "hidden size", c.hidden));
  WSYNC_RETURN_IF_ERROR(Positive(c, "layers", c.layers));
  WSYNC_RETURN_IF_ERROR(Positive(c, "attention heads", c.heads));
  WSYNC_RETURN_IF_ERROR(Positive(c, "vocabulary size", c.vocab));
  if (c.mla) {
    for (const auto& [field, value] :
         {std::pair<absl::string_view, int64_t>{"q_lora_rank", c.q_lora},
          {"kv_lora_rank", c.kv_lora},
          {"qk_nope_head_dim", c.qk_nope},
          {"qk_rope_head_dim", c.qk_rope},
          {"v_head_dim", c.v_head}}) {
      WSYNC_RETURN_IF_ERROR(Positive(c, field, value));
    }
    if (c.index_heads > 0) WSYNC_RETURN_IF_ERROR(Positive(c, "index_head_dim", c.index_head_dim));
  } else {
    WSYNC_RETURN_IF_ERROR(Positive(c, "head_dim", c.head_dim));
    WSYNC_RETURN_IF_ERROR(Positive(c, "key-value heads", c.kv_heads));
    if (c.heads % c.kv_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat("model ", c.name, ": ", c.kv_heads,
                                                     " key-value heads do not divide ", c.heads,
                                                     " attention heads"));
    }
  }
  if (c.experts > 0) {
    WSYNC_RETURN_IF_ERROR(Positive(c, "MoE intermediate size", c.moe_intermediate));
    if (c.qwen2_moe_shared) {
      WSYNC_RETURN_IF_ERROR(Positive(c, "shared expert intermediate size", c.shared_intermediate));
    }
  }
  if (c.first_dense < 0 || c.first_dense > c.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", c.name, ": ", c.first_dense, " first dense layers of ", c.layers));
  }
  if (c.experts == 0 || c.first_dense > 0) {
    WSYNC_RETURN_IF_ERROR(Positive(c, "intermediate size", c.intermediate));
  }
  if (c.mtp_layers < 0 || c.mtp_layers > c.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", c.name, ": ", c.mtp_layers, " MTP layers are out of range"));
  }
  return absl::OkStatus();
}

// Not published models: each family's structure at a size tests fill and compare element by
// element (tests/python/families.py describes the same models to the Python layouts).
void AddTestConfigs(std::vector<ModelConfig>& configs) {
  ModelConfig base;
  base.hidden = 64, base.intermediate = 96, base.layers = 2, base.heads = 4, base.kv_heads = 2;
  base.head_dim = 16, base.vocab = 200;
  {
    ModelConfig& c = configs.emplace_back(base);
    c.name = "llama-3-tiny";
  }
  {
    ModelConfig& c = configs.emplace_back(base);
    c.name = "qwen3-tiny";
    c.qk_norm = true;
  }
  {
    ModelConfig& c = configs.emplace_back(base);
    c.name = "qwen3-moe-tiny";
    c.qk_norm = true, c.experts = 6, c.moe_intermediate = 32;
  }
  {
    ModelConfig& c = configs.emplace_back(base);
    c.name = "qwen2-moe-tiny";
    c.qkv_bias = true, c.experts = 4, c.moe_intermediate = 32;
    c.qwen2_moe_shared = true, c.shared_intermediate = 64;
  }
  {
    ModelConfig& c = configs.emplace_back(base);
    c.name = "deepseek-v3-tiny";
    c.layers = 3, c.experts = 8, c.moe_intermediate = 16, c.shared_experts = 1;
    c.first_dense = 1, c.router_bias = true;
    c.mla = true, c.q_lora = 24, c.kv_lora = 16, c.qk_nope = 8, c.qk_rope = 8, c.v_head = 8;
    // 8 x 8 blocks: every partition of vllm(tp=2, ep=2) and of tp=1 is whole blocks, as vLLM
    // requires of block FP8 (named_quant.h); 128 would exceed the 16 rows of an expert.
    c.block_rows = 8, c.block_cols = 8;
  }
  {
    ModelConfig c = configs.back();  // Kimi-K2's structure is DeepSeek-V3's.
    c.name = "kimi-k2-tiny";
    c.layers = 2, c.experts = 6;
    configs.push_back(std::move(c));
  }
}

// From the models' config.json on the Hugging Face hub.
std::vector<ModelConfig> Configs() {
  std::vector<ModelConfig> configs;
  {
    ModelConfig& c = configs.emplace_back();  // Qwen/Qwen2.5-0.5B
    c.name = "qwen2.5-0.5b";
    c.hidden = 896, c.intermediate = 4864, c.layers = 24, c.heads = 14, c.kv_heads = 2;
    c.head_dim = 64, c.vocab = 151936, c.tied = true, c.qkv_bias = true;
  }
  {
    ModelConfig& c = configs.emplace_back();  // meta-llama/Meta-Llama-3-8B
    c.name = "llama-3-8b";
    c.hidden = 4096, c.intermediate = 14336, c.layers = 32, c.heads = 32, c.kv_heads = 8;
    c.head_dim = 128, c.vocab = 128256;
  }
  {
    ModelConfig& c = configs.emplace_back();  // meta-llama/Llama-3.2-1B
    c.name = "llama-3.2-1b";
    c.hidden = 2048, c.intermediate = 8192, c.layers = 16, c.heads = 32, c.kv_heads = 8;
    c.head_dim = 64, c.vocab = 128256, c.tied = true;
  }
  {
    ModelConfig& c = configs.emplace_back();  // Qwen/Qwen3-30B-A3B
    c.name = "qwen3-30b-a3b";
    c.hidden = 2048, c.intermediate = 6144, c.layers = 48, c.heads = 32, c.kv_heads = 4;
    c.head_dim = 128, c.vocab = 151936, c.qk_norm = true;
    c.experts = 128, c.moe_intermediate = 768;
  }
  {
    ModelConfig& c = configs.emplace_back();  // deepseek-ai/DeepSeek-V3 (without the MTP layer)
    c.name = "deepseek-v3";
    c.hidden = 7168, c.intermediate = 18432, c.layers = 61, c.heads = 128, c.vocab = 129280;
    c.experts = 256, c.moe_intermediate = 2048, c.shared_experts = 1, c.first_dense = 3;
    c.router_bias = true;
    c.mla = true, c.q_lora = 1536, c.kv_lora = 512, c.qk_nope = 128, c.qk_rope = 64;
    c.v_head = 128;
  }
  {
    ModelConfig c = configs.back();  // moonshotai/Kimi-K2-Instruct: DeepSeek-V3's architecture.
    c.name = "kimi-k2";
    c.heads = 64, c.vocab = 163840, c.experts = 384, c.first_dense = 1;
    configs.push_back(std::move(c));
  }
  {
    // Not a published model: the qwen2.5 structure (GQA with qkv biases, tied embeddings) at a size
    // that tests and demos can fill and verify element by element in well under a second.
    ModelConfig& c = configs.emplace_back();
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

absl::StatusOr<ModelSpec> BuildModel(const ModelConfig& c) {
  WSYNC_RETURN_IF_ERROR(CheckConfig(c));
  ModelSpec spec;
  spec.name = c.name;
  spec.num_layers = c.layers + c.mtp_layers;
  spec.vocab = c.vocab;
  spec.tied_embeddings = c.tied;
  spec.quantization.modules_not_converted = c.modules_not_converted;
  spec.quantization.weight_block_rows = c.block_rows;
  spec.quantization.weight_block_cols = c.block_cols;
  spec.AddTensor("model.embed_tokens.weight", {c.vocab, c.hidden}, ShardRole::kVocab, -1);
  for (int32_t layer = 0; layer < c.layers + c.mtp_layers; ++layer) {
    AddLayer(c, layer, spec);
    if (layer >= c.layers) AddMtpExtras(c, layer, spec);
  }
  spec.AddTensor("model.norm.weight", {c.hidden}, ShardRole::kReplicated, -2);
  if (!c.tied) spec.AddTensor("lm_head.weight", {c.vocab, c.hidden}, ShardRole::kVocab, -2);
  return spec;
}

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
  for (const ModelConfig& c : Configs()) names.push_back(c.name);
  return names;
}

absl::StatusOr<ModelSpec> GetModel(absl::string_view name) {
  for (const ModelConfig& c : Configs()) {
    if (c.name == name) return BuildModel(c);
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
