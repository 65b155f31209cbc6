#ifndef WSYNC_PLANNER_MODELS_H_
#define WSYNC_PLANNER_MODELS_H_

// Model shapes as data, from the models' public configs. A ModelSpec lists the logical parameters
// (HF-style names, one 3-D tensor per layer for routed experts) with the sharding role each plays,
// which the named layouts (named_layouts.h) turn into pieces.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "planner/geometry.h"

namespace wsync {

// How tensor parallelism and expert parallelism cut a tensor.
enum class ShardRole : uint8_t {
  kReplicated,    // Norms, router weights, biases of row-parallel layers: whole on every rank.
  kColumn,        // Split along axis 0 (output features).
  kRow,           // Split along axis 1 (input features).
  kVocab,         // Split along axis 0 with the vocabulary padded per framework rules.
  kExpertColumn,  // [E, I, H]: experts along axis 0 (EP), axis 1 split by TP when EP is off.
  kExpertRow,     // [E, H, I]: experts along axis 0 (EP), axis 2 split by TP when EP is off.
};

// Fusion in the rollout engine's module structure (vLLM names).
enum class FuseKind : uint8_t {
  kNone,
  kQkv,        // qkv_proj = q | k | v along axis 0; k and v replicated when kv heads < TP.
  kGateUp,     // gate_up_proj = gate | up along axis 0.
  kExpertW13,  // w13 [E, 2I, H] = gate | up along axis 1.
  kMlaQkvA,    // fused_qkv_a_proj = q_a_proj | kv_a_proj_with_mqa along axis 0 (replicated).
};

struct TensorSpec {
  std::string name;  // e.g. "model.layers.3.self_attn.q_proj.weight"
  Dims shape;
  DType dtype = DType::kBFloat16;
  ShardRole role = ShardRole::kReplicated;
  int32_t layer = -1;  // Transformer layer, or -1 for embedding (pre) and -2 for final norm/head.
  FuseKind fuse = FuseKind::kNone;
  std::string fused_name;  // Name of the fused module tensor (e.g. "...qkv_proj.weight").
  int32_t fuse_index = 0;  // Position inside the fused tensor (q=0, k=1, v=2; gate=0, up=1).
  // Attention heads along axis 0 (head_dim = shape[0] / heads) for q/k/v parts (kQkv) and MLA's
  // q_b_proj / kv_b_proj; 0 for tensors without head structure.
  int64_t heads = 0;
};

// How a rollout engine stores a model's weights: as trained (bf16), or FP8 e4m3 with fp32 scales
// per 128 x 128 block, per output channel or per tensor (quant/fp8.h states the rules).
enum class WeightQuant : uint8_t { kNone, kFp8Block, kFp8Channel, kFp8Tensor };

// "none", "fp8_block", "fp8_channel", "fp8_tensor" (the named layouts' quant= values).
absl::string_view WeightQuantName(WeightQuant quant);
// Inverse of WeightQuantName; InvalidArgument naming the known values otherwise.
absl::StatusOr<WeightQuant> ParseWeightQuant(absl::string_view name);

// Which weights a model's FP8 checkpoints hold in FP8, from the model's `quantization_config`
// (Hugging Face config.json): the weights of 2 or 3 axes (linear layers and expert tensors) except
// the modules named here, which stay bf16 like every 1-D tensor (norms, biases).
struct QuantizationConfig {
  int64_t weight_block_rows = 128;  // weight_block_size
  int64_t weight_block_cols = 128;
  // Module names (a parameter's name without ".weight") kept bf16: a parameter matches when its
  // module is the entry or ends with "." followed by it ("mlp.gate" matches
  // "model.layers.3.mlp.gate", not "...mlp.gate_proj").
  std::vector<std::string> modules_not_converted;
};

// The facts of a model's Hugging Face config.json that determine its parameters' shapes, in one
// form for every family (integration/model_config reads them from a config.json; GetModel's
// models are built from the same struct). Sizes are elements; 0 means "none".
struct ModelConfig {
  std::string name;
  int64_t hidden = 0;
  int64_t intermediate = 0;  // Dense MLP (and the layers before first_dense).
  int32_t layers = 0;        // Transformer layers, without MTP layers.
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  bool tied = false;
  bool qkv_bias = false;
  bool o_bias = false;   // A bias on o_proj (gpt-oss), replicated like every row-parallel bias.
  bool qk_norm = false;  // Per-head RMS norms of q and k (Qwen3, GLM-4.5).
  bool sinks = false;    // One attention-sink logit per head, "self_attn.sinks" (gpt-oss).
  // Mixture of experts: layers [first_dense, layers) route to `experts` experts.
  int64_t experts = 0;
  int64_t moe_intermediate = 0;
  int64_t shared_experts = 0;  // DeepSeek-style "mlp.shared_experts." of shared * moe_intermediate.
  // Qwen2-MoE names its one shared expert "mlp.shared_expert." and scales its output by a
  // sigmoid gate, "mlp.shared_expert_gate.weight" [1, hidden]; DeepSeek-V3 has neither.
  bool qwen2_moe_shared = false;
  int64_t shared_intermediate = 0;  // Qwen2-MoE's shared_expert_intermediate_size.
  int32_t first_dense = 0;
  bool router_bias = false;         // e_score_correction_bias, fp32 (DeepSeek-V3, GLM).
  bool router_linear_bias = false;  // A bf16 bias of the router itself, "mlp.gate.bias" (gpt-oss).
  // Multi-head latent attention (DeepSeek-V3); replaces q/k/v/o when mla is set.
  bool mla = false;
  int64_t q_lora = 0;
  int64_t kv_lora = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
  // The lightning indexer of DeepSeek sparse attention (GLM-5), "self_attn.indexer.": wq_b
  // [index_heads * index_head_dim, q_lora], wk [index_head_dim, hidden], k_norm (weight and
  // bias) [index_head_dim], weights_proj [index_heads, hidden]; none when index_heads is 0.
  int64_t index_heads = 0;
  int64_t index_head_dim = 0;
  // Multi-token-prediction layers to include, after the `layers` transformer layers (HF names
  // "model.layers.<layers + k>."): a transformer layer (an MoE one when the model has experts)
  // plus enorm, hnorm, eh_proj [hidden, 2 hidden], shared_head.norm and its own copies of the
  // embedding and the head (shared_head.head), as DeepSeek-V3's checkpoint stores them.
  int32_t mtp_layers = 0;
  // quantization_config of the model's FP8 checkpoints (QuantizationConfig). Besides every 1-D
  // tensor, FP8 checkpoints and vLLM's FP8 linear layers keep these modules bf16:
  // - DeepSeek-V3 / Kimi-K2 (quant_method "fp8", weight_block_size [128, 128];
  //   deepseek-ai/DeepSeek-V3 README_WEIGHTS.md): every linear weight carries a
  //   `weight_scale_inv` except model.embed_tokens, lm_head and the MoE router mlp.gate.
  // - Qwen FP8 checkpoints name modules_to_not_convert ["lm_head", "model.embed_tokens"]; vLLM
  //   builds the MoE routers (mlp.gate, Qwen2-MoE's mlp.shared_expert_gate) without a
  //   quantization config.
  std::vector<std::string> modules_not_converted = {"embed_tokens", "lm_head", "mlp.gate",
                                                    "mlp.shared_expert_gate"};
  int64_t block_rows = 128;  // weight_block_size
  int64_t block_cols = 128;
};

struct ModelSpec {
  std::string name;
  int32_t num_layers = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;
  std::vector<TensorSpec> tensors;
  QuantizationConfig quantization;

  int64_t TotalBytes() const;
  int64_t TotalElements() const;

  // Appends a tensor (bf16, not fused, no heads) and returns it for further settings; the
  // reference is valid until the next append.
  TensorSpec& AddTensor(std::string name, Dims shape, ShardRole role, int32_t layer);
  // Appends part `fuse_index` of the rollout engine's fused tensor `fused_name`.
  TensorSpec& AddFusedTensor(std::string name, Dims shape, ShardRole role, int32_t layer,
                             FuseKind fuse, std::string fused_name, int32_t fuse_index);
};

// True when `parameter` (a tensor's name, or the rollout engine's fused name such as
// "...self_attn.qkv_proj.weight" or "...mlp.experts.w13_weight") is stored in FP8 when the rollout
// engine runs `quant`: never for WeightQuant::kNone; otherwise when the tensor is a ".weight" of 2
// or 3 axes whose module is not in model.quantization.modules_not_converted (embeddings, lm_head,
// router gates stay bf16). NotFound when the model has no such parameter.
absl::StatusOr<bool> IsQuantizedParameter(const ModelSpec& model, absl::string_view parameter,
                                          WeightQuant quant);

// The model `config` describes. InvalidArgument naming the field when a size it needs is not
// positive (hidden, layers, heads, head_dim or the MLA ranks, vocab, the dense intermediate
// size when some layer is dense, moe_intermediate with experts), when kv_heads does not divide
// heads, or when first_dense or mtp_layers is out of range.
absl::StatusOr<ModelSpec> BuildModel(const ModelConfig& config);

// Names accepted by GetModel: "qwen2.5-0.5b", "llama-3-8b", "llama-3.2-1b", "qwen3-30b-a3b",
// "deepseek-v3", "kimi-k2", "qwen2.5-tiny" (the qwen2.5 structure at a test size: hidden 128,
// 2 layers, 4 heads, 2 kv heads, vocab 1000), and the test sizes of the other families:
// "llama-3-tiny", "qwen3-tiny", "qwen3-moe-tiny" (6 experts), "qwen2-moe-tiny" (4 experts, a
// shared expert and its gate), "deepseek-v3-tiny" (8 experts, MLA, a first dense layer) and
// "kimi-k2-tiny" (6 experts); see tests/python/families.py. The published models' FP8 blocks are
// their checkpoints' 128 x 128; the test models' are ours: qwen2.5-tiny 64 x 128, deepseek-v3-tiny
// and kimi-k2-tiny 8 x 8, the others 128 x 128, more rows than their q_proj has, so that
// vllm(..., quant=fp8_block) refuses them at every tp as vLLM would (named_quant.h).
std::vector<std::string> ModelNames();

// The embedded model of that name; NotFound otherwise.
absl::StatusOr<ModelSpec> GetModel(absl::string_view name);

// The model cut to its first `layers` transformer layers (embedding, final norm and head kept), for
// benchmarks that need a real model's tensor shapes in less memory. InvalidArgument unless
// 1 <= layers <= model.num_layers.
absl::StatusOr<ModelSpec> TruncateLayers(const ModelSpec& model, int32_t layers);

}  // namespace wsync

#endif  // WSYNC_PLANNER_MODELS_H_
