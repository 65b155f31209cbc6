#ifndef WSYNC_INTEGRATION_MODEL_CONFIG_HF_CONFIG_H_
#define WSYNC_INTEGRATION_MODEL_CONFIG_HF_CONFIG_H_

// Models from their Hugging Face config.json: the shape facts of each family turned into the
// planner's ModelConfig (planner/models.h), which BuildModel makes a ModelSpec of, as it does for
// the built-in models. JSON is parsed by protobuf (google.protobuf.Struct); keys a family does not
// use are ignored.
//
// Families, by `model_type`:
//   llama, mistral      GQA attention (attention_bias), gated MLP.
//   qwen2               llama's with q/k/v biases.
//   qwen3               llama's with per-head q/k norms.
//   qwen2_moe           qwen2 attention; every layer routes to num_experts experts plus one gated
//                       shared expert (shared_expert_intermediate_size).
//   qwen3_moe           qwen3 attention; every layer routes to num_experts experts.
//   mixtral             llama attention; every layer routes to num_local_experts experts of
//                       intermediate_size.
//   deepseek_v3, kimi_k2  MLA (q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim, v_head_dim);
//                       first_k_dense_replace dense layers, then n_routed_experts experts plus
//                       n_shared_experts shared ones; the router's e_score_correction_bias.
//   glm_moe_dsa         deepseek_v3's plus the sparse-attention indexer (index_n_heads,
//                       index_head_dim) (GLM-5).
//   glm4_moe            GQA attention with q/k/v biases (attention_bias) and q/k norms
//                       (use_qk_norm); deepseek_v3's MoE (GLM-4.5).
//   gpt_oss             GQA attention with biases on q/k/v/o and per-head sinks; every layer
//                       routes to num_local_experts experts of intermediate_size with a router
//                       bias. The experts' biases (gate_up_proj_bias [E, 2I], down_proj_bias
//                       [E, H]; 0.03 % of gpt-oss-120b) are left out: no ShardRole describes
//                       a 2-D tensor split by experts and not by TP.
// Tied embeddings: tie_word_embeddings (default false). vocab_size is taken as given; the named
// layouts pad it per framework. MTP layers (num_nextn_predict_layers of deepseek_v3, kimi_k2,
// glm_moe_dsa, glm4_moe) are left out unless HfConfigOptions::include_mtp.
// A config.json with quantization_config.weight_block_size takes its FP8 block from it.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/models.h"

namespace wsync {

struct HfConfigOptions {
  std::string name;          // The model's name in reports (ModelSpec::name).
  bool include_mtp = false;  // Append the config's MTP layers (ModelConfig::mtp_layers).
};

// The ModelConfig of config.json text. InvalidArgument naming the input and the cause: text that
// is not a JSON object, a missing `model_type` or one not listed above, a key the family needs that
// is missing (or null), a value of the wrong type or not an integer, or a feature this mapping
// does not describe (decoder_sparse_step other than 1, mlp_only_layers, mlp_bias, moe_layer_freq
// other than 1, q_lora_rank null).
absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json, const HfConfigOptions& options);

// The model `name_or_path` names: a built-in model (GetModel), else the config.json at that path
// (its name the path). NotFound naming both readings when it is neither; ParseHfConfig's and
// BuildModel's errors otherwise.
absl::StatusOr<ModelSpec> LoadModel(absl::string_view name_or_path, bool include_mtp = false);

// What `--model` accepts, for usage texts: the built-in names and the config.json families.
std::string ModelFlagHelp();

}  // namespace wsync

#endif  // WSYNC_INTEGRATION_MODEL_CONFIG_HF_CONFIG_H_
