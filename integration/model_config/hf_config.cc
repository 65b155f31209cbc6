#include "integration/model_config/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "planner/models.h"

namespace wsync {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr absl::string_view kFamilies[] = {"llama",     "mistral",     "qwen2",    "qwen3",
                                           "qwen2_moe", "qwen3_moe",   "mixtral",  "deepseek_v3",
                                           "kimi_k2",   "glm_moe_dsa", "glm4_moe", "gpt_oss"};

// Typed access to the top-level keys of one config.json; every error names the config and the key.
class Keys {
 public:
  Keys(const Struct& json, std::string where) : json_(json), where_(std::move(where)) {}

  // The value of `key`, or nullptr when it is absent or null.
  const Value* Find(absl::string_view key) const {
    const auto it = json_.fields().find(std::string(key));
    if (it == json_.fields().end() || it->second.kind_case() == Value::kNullValue) return nullptr;
    return &it->second;
  }

  absl::Status Error(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": key \"", key, "\" ", what));
  }

  absl::StatusOr<int64_t> Int(absl::string_view key) const {
    const Value* value = Find(key);
    if (value == nullptr) return Error(key, "is missing");
    return AsInt(key, *value);
  }

  absl::StatusOr<int64_t> IntOr(absl::string_view key, int64_t fallback) const {
    const Value* value = Find(key);
    return value == nullptr ? absl::StatusOr<int64_t>(fallback) : AsInt(key, *value);
  }

  absl::StatusOr<bool> BoolOr(absl::string_view key, bool fallback) const {
    const Value* value = Find(key);
    if (value == nullptr) return fallback;
    if (value->kind_case() != Value::kBoolValue) return Error(key, "is not true or false");
    return value->bool_value();
  }

  absl::StatusOr<std::string> String(absl::string_view key) const {
    const Value* value = Find(key);
    if (value == nullptr) return Error(key, "is missing");
    if (value->kind_case() != Value::kStringValue) return Error(key, "is not a string");
    return value->string_value();
  }

  // Refuse `key` when it is present with another value than the one the mapping describes.
  absl::Status RequireIntIs(absl::string_view key, int64_t expected) const {
    WSYNC_ASSIGN_OR_RETURN(const int64_t value, IntOr(key, expected));
    if (value == expected) return absl::OkStatus();
    return Error(key, absl::StrCat("is ", value, "; only ", expected, " is supported"));
  }
  absl::Status RequireEmptyList(absl::string_view key) const {
    const Value* value = Find(key);
    if (value == nullptr ||
        (value->kind_case() == Value::kListValue && value->list_value().values_size() == 0)) {
      return absl::OkStatus();
    }
    return Error(key, "is not empty; only an empty list is supported");
  }

  const std::string& where() const { return where_; }

 private:
  absl::StatusOr<int64_t> AsInt(absl::string_view key, const Value& value) const {
    // JSON numbers arrive as doubles; every size below 2^53 is exact.
    constexpr double kLimit = 9007199254740992.0;
    if (value.kind_case() != Value::kNumberValue) return Error(key, "is not a number");
    const double number = value.number_value();
    if (std::trunc(number) != number || std::fabs(number) >= kLimit) {
      return Error(key, absl::StrCat("is not an integer: ", number));
    }
    return static_cast<int64_t>(number);
  }

  const Struct& json_;
  std::string where_;
};

// hidden, layers, heads, kv heads, head_dim, vocab, tied embeddings, attention biases.
absl::Status ReadDecoder(const Keys& k, ModelConfig& c) {
  WSYNC_ASSIGN_OR_RETURN(c.hidden, k.Int("hidden_size"));
  WSYNC_ASSIGN_OR_RETURN(const int64_t layers, k.Int("num_hidden_layers"));
  c.layers = static_cast<int32_t>(layers);
  if (c.layers != layers) return k.Error("num_hidden_layers", "is out of range");
  WSYNC_ASSIGN_OR_RETURN(c.heads, k.Int("num_attention_heads"));
  WSYNC_ASSIGN_OR_RETURN(c.kv_heads, k.IntOr("num_key_value_heads", c.heads));
  WSYNC_ASSIGN_OR_RETURN(c.vocab, k.Int("vocab_size"));
  WSYNC_ASSIGN_OR_RETURN(c.tied, k.BoolOr("tie_word_embeddings", false));
  WSYNC_ASSIGN_OR_RETURN(c.qkv_bias, k.BoolOr("attention_bias", false));
  return absl::OkStatus();
}

absl::Status ReadQwenMoe(const Keys& k, ModelConfig& c) {
  WSYNC_ASSIGN_OR_RETURN(c.experts, k.Int("num_experts"));
  WSYNC_ASSIGN_OR_RETURN(c.moe_intermediate, k.Int("moe_intermediate_size"));
  WSYNC_RETURN_IF_ERROR(k.RequireIntIs("decoder_sparse_step", 1));
  return k.RequireEmptyList("mlp_only_layers");
}

// DeepSeek-V3's MoE keys (also GLM-4.5's and GLM-5's), and its MTP layers.
absl::Status ReadDeepSeekMoe(const Keys& k, bool include_mtp, ModelConfig& c) {
  WSYNC_ASSIGN_OR_RETURN(c.intermediate, k.Int("intermediate_size"));
  WSYNC_ASSIGN_OR_RETURN(c.experts, k.Int("n_routed_experts"));
  WSYNC_ASSIGN_OR_RETURN(c.shared_experts, k.IntOr("n_shared_experts", 0));
  WSYNC_ASSIGN_OR_RETURN(c.moe_intermediate, k.Int("moe_intermediate_size"));
  WSYNC_ASSIGN_OR_RETURN(const int64_t first_dense, k.IntOr("first_k_dense_replace", 0));
  c.first_dense = static_cast<int32_t>(first_dense);
  if (c.first_dense != first_dense) return k.Error("first_k_dense_replace", "is out of range");
  WSYNC_RETURN_IF_ERROR(k.RequireIntIs("moe_layer_freq", 1));
  c.router_bias = true;  // Their routers all carry e_score_correction_bias.
  if (include_mtp) {
    WSYNC_ASSIGN_OR_RETURN(const int64_t mtp, k.IntOr("num_nextn_predict_layers", 0));
    c.mtp_layers = static_cast<int32_t>(mtp);
    if (c.mtp_layers != mtp) return k.Error("num_nextn_predict_layers", "is out of range");
  }
  return absl::OkStatus();
}

absl::Status ReadLatentAttention(const Keys& k, ModelConfig& c) {
  c.mla = true;
  WSYNC_ASSIGN_OR_RETURN(c.q_lora, k.Int("q_lora_rank"));
  WSYNC_ASSIGN_OR_RETURN(c.kv_lora, k.Int("kv_lora_rank"));
  WSYNC_ASSIGN_OR_RETURN(c.qk_nope, k.Int("qk_nope_head_dim"));
  WSYNC_ASSIGN_OR_RETURN(c.qk_rope, k.Int("qk_rope_head_dim"));
  WSYNC_ASSIGN_OR_RETURN(c.v_head, k.Int("v_head_dim"));
  return absl::OkStatus();
}

absl::Status ReadFamily(const Keys& k, absl::string_view type, bool include_mtp, ModelConfig& c) {
  if (std::find(std::begin(kFamilies), std::end(kFamilies), type) == std::end(kFamilies)) {
    return k.Error("model_type", absl::StrCat("is \"", type, "\", not a known family (",
                                              absl::StrJoin(kFamilies, ", "), ")"));
  }
  WSYNC_RETURN_IF_ERROR(ReadDecoder(k, c));
  WSYNC_ASSIGN_OR_RETURN(const bool mlp_bias, k.BoolOr("mlp_bias", false));
  if (mlp_bias) return k.Error("mlp_bias", "is true; MLP biases are not supported");
  if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3") {
    c.qkv_bias = c.qkv_bias || type == "qwen2";
    c.qk_norm = type == "qwen3";
    WSYNC_ASSIGN_OR_RETURN(c.intermediate, k.Int("intermediate_size"));
  } else if (type == "qwen2_moe") {
    c.qkv_bias = true;
    c.qwen2_moe_shared = true;
    WSYNC_ASSIGN_OR_RETURN(c.shared_intermediate, k.Int("shared_expert_intermediate_size"));
    WSYNC_RETURN_IF_ERROR(ReadQwenMoe(k, c));
  } else if (type == "qwen3_moe") {
    c.qk_norm = true;
    WSYNC_RETURN_IF_ERROR(ReadQwenMoe(k, c));
  } else if (type == "mixtral") {
    WSYNC_ASSIGN_OR_RETURN(c.experts, k.Int("num_local_experts"));
    WSYNC_ASSIGN_OR_RETURN(c.moe_intermediate, k.Int("intermediate_size"));
  } else if (type == "deepseek_v3" || type == "kimi_k2" || type == "glm_moe_dsa") {
    WSYNC_RETURN_IF_ERROR(ReadLatentAttention(k, c));
    WSYNC_RETURN_IF_ERROR(ReadDeepSeekMoe(k, include_mtp, c));
    if (type == "glm_moe_dsa") {
      WSYNC_ASSIGN_OR_RETURN(c.index_heads, k.Int("index_n_heads"));
      WSYNC_ASSIGN_OR_RETURN(c.index_head_dim, k.Int("index_head_dim"));
    }
  } else if (type == "glm4_moe") {
    WSYNC_ASSIGN_OR_RETURN(c.qk_norm, k.BoolOr("use_qk_norm", false));
    WSYNC_RETURN_IF_ERROR(ReadDeepSeekMoe(k, include_mtp, c));
  } else {  // gpt_oss
    c.o_bias = c.qkv_bias;
    c.sinks = true;
    c.router_linear_bias = true;
    WSYNC_ASSIGN_OR_RETURN(c.experts, k.Int("num_local_experts"));
    WSYNC_ASSIGN_OR_RETURN(c.moe_intermediate, k.Int("intermediate_size"));
  }
  if (c.mla) return absl::OkStatus();
  // Without head_dim, transformers divides the hidden size by the heads.
  if (k.Find("head_dim") == nullptr && c.heads > 0 && c.hidden % c.heads != 0) {
    return k.Error("head_dim", "is missing and num_attention_heads does not divide hidden_size");
  }
  WSYNC_ASSIGN_OR_RETURN(c.head_dim, k.IntOr("head_dim", c.heads > 0 ? c.hidden / c.heads : 0));
  return absl::OkStatus();
}

// quantization_config.weight_block_size [rows, cols], when the config has one.
absl::Status ReadWeightBlock(const Keys& k, ModelConfig& c) {
  const Value* quant = k.Find("quantization_config");
  if (quant == nullptr || quant->kind_case() != Value::kStructValue) return absl::OkStatus();
  const auto it = quant->struct_value().fields().find("weight_block_size");
  if (it == quant->struct_value().fields().end()) return absl::OkStatus();
  const Value& block = it->second;
  const auto positive_int = [](const Value& v) {
    return v.kind_case() == Value::kNumberValue && v.number_value() >= 1 &&
           v.number_value() < 1e9 && std::trunc(v.number_value()) == v.number_value();
  };
  if (block.kind_case() != Value::kListValue || block.list_value().values_size() != 2 ||
      !positive_int(block.list_value().values(0)) || !positive_int(block.list_value().values(1))) {
    return k.Error("quantization_config.weight_block_size", "is not two positive integers");
  }
  c.block_rows = static_cast<int64_t>(block.list_value().values(0).number_value());
  c.block_cols = static_cast<int64_t>(block.list_value().values(1).number_value());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(absl::string_view json, const HfConfigOptions& options) {
  const std::string where = absl::StrCat("config.json ", options.name);
  Struct root;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not a JSON object: ", parsed.message().as_string()));
  }
  const Keys keys(root, where);
  WSYNC_ASSIGN_OR_RETURN(const std::string type, keys.String("model_type"));
  ModelConfig config;
  config.name = options.name;
  WSYNC_RETURN_IF_ERROR(ReadFamily(keys, type, options.include_mtp, config));
  WSYNC_RETURN_IF_ERROR(ReadWeightBlock(keys, config));
  return config;
}

absl::StatusOr<ModelSpec> LoadModel(absl::string_view name_or_path, bool include_mtp) {
  for (const std::string& name : ModelNames()) {
    if (name == name_or_path) return GetModel(name);
  }
  std::ifstream file{std::string(name_or_path)};
  if (!file) {
    return absl::NotFoundError(absl::StrCat("\"", name_or_path, "\" is neither a built-in model (",
                                            absl::StrJoin(ModelNames(), ", "),
                                            ") nor a readable config.json"));
  }
  std::ostringstream text;
  text << file.rdbuf();
  if (!file.good() && !file.eof()) {
    return absl::DataLossError(absl::StrCat("cannot read ", name_or_path));
  }
  WSYNC_ASSIGN_OR_RETURN(const ModelConfig config,
                         ParseHfConfig(text.str(), {std::string(name_or_path), include_mtp}));
  return BuildModel(config);
}

std::string ModelFlagHelp() {
  return absl::StrCat("a built-in model (", absl::StrJoin(ModelNames(), ", "),
                      ") or the path of a Hugging Face config.json (model_type ",
                      absl::StrJoin(kFamilies, ", "), ")");
}

}  // namespace wsync
