#include "integration/model_config/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

namespace wsync {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string ConfigPath(const std::string& name) {
  return absl::StrCat(WSYNC_HF_CONFIG_DIR, "/", name, ".json");
}

std::string ReadConfig(const std::string& name) {
  std::ifstream file(ConfigPath(name));
  EXPECT_TRUE(file.good()) << ConfigPath(name);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

google::protobuf::Struct ParseJson(const std::string& text) {
  google::protobuf::Struct json;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &json).ok());
  return json;
}

std::string ToJson(const google::protobuf::Struct& json) {
  std::string text;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(json, &text).ok());
  return text;
}

absl::StatusOr<ModelSpec> Parse(const std::string& text, bool include_mtp = false) {
  absl::StatusOr<ModelConfig> config = ParseHfConfig(text, {"test", include_mtp});
  if (!config.ok()) return config.status();
  return BuildModel(*config);
}

// Published totals, from each model's card (tests/data/hf_configs/<name>.json names the repo).
struct Published {
  const char* config;
  double total;
  bool include_mtp;
  double tolerance;  // Relative.
  const char* source;
};

constexpr double kTolerance = 0.005;

const Published kPublished[] = {
    {"llama-3.1-8b", 8.03e9, false, kTolerance, "HF model page: 8.03B params"},
    {"llama-3.1-70b", 70.6e9, false, kTolerance, "HF model page: 70.6B params"},
    {"qwen2.5-7b", 7.61e9, false, kTolerance, "model card: Number of Parameters: 7.61B"},
    {"qwen3-8b", 8.2e9, false, kTolerance, "model card: Number of Parameters: 8.2B"},
    {"qwen3-30b-a3b", 30.5e9, false, kTolerance, "model card: 30.5B in total"},
    {"qwen3-235b-a22b", 235e9, false, kTolerance, "model card: 235B in total"},
    {"deepseek-v3", 671e9, false, kTolerance, "README: 671B of the main model"},
    {"deepseek-v3", 685e9, true, kTolerance, "README: 685B with the 14B MTP module"},
    {"mixtral-8x7b", 46.7e9, false, kTolerance, "Mistral AI, Mixtral of experts: 46.7B"},
    {"gpt-oss-120b", 116.83e9, false, kTolerance, "gpt-oss model card: 116.83B total"},
    {"gpt-oss-20b", 20.91e9, false, kTolerance, "gpt-oss model card: 20.91B total"},
    {"glm-5", 744e9, false, kTolerance, "model card: 744B (40B active)"},
    // The card's 355B does not say what it counts; without the MTP layer the count is 0.62 %
    // under it (352.8B), with it (and its own embedding and head) 0.9 % over.
    {"glm-4.5", 355e9, false, 0.01, "model card: 355B total"},
    // Published to one digit only ("1T"): 1.026T counted.
    {"kimi-k2", 1e12, false, 0.05, "model card: 1T total"},
};

TEST(HfConfigTest, ParameterCountsMatchThePublishedTotals) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(absl::StrCat(p.config, p.include_mtp ? " with MTP" : "", " (", p.source, ")"));
    const absl::StatusOr<ModelSpec> model = LoadModel(ConfigPath(p.config), p.include_mtp);
    ASSERT_TRUE(model.ok()) << model.status();
    const double total = static_cast<double>(model->TotalElements());
    EXPECT_LE(std::fabs(total - p.total) / p.total, p.tolerance) << total;
  }
}

// The six published built-in models are built by the same code: their config.json facts give the
// same tensors (name, shape, dtype, role, fusion), in the same order.
TEST(HfConfigTest, BuiltInModelsEqualTheirConfigFiles) {
  for (const char* name :
       {"qwen2.5-0.5b", "llama-3-8b", "llama-3.2-1b", "qwen3-30b-a3b", "deepseek-v3", "kimi-k2"}) {
    SCOPED_TRACE(name);
    const absl::StatusOr<ModelSpec> a = GetModel(name);
    const absl::StatusOr<ModelSpec> b = LoadModel(ConfigPath(name));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->num_layers, b->num_layers);
    EXPECT_EQ(a->TotalBytes(), b->TotalBytes());
    ASSERT_EQ(a->tensors.size(), b->tensors.size());
    for (size_t i = 0; i < a->tensors.size(); ++i) {
      const TensorSpec& x = a->tensors[i];
      const TensorSpec& y = b->tensors[i];
      EXPECT_TRUE(x.name == y.name && x.shape == y.shape && x.dtype == y.dtype &&
                  x.role == y.role && x.fuse == y.fuse && x.fused_name == y.fused_name &&
                  x.heads == y.heads)
          << x.name << " vs " << y.name;
    }
  }
}

TEST(HfConfigTest, BuiltInNamesStillLoad) {
  const absl::StatusOr<ModelSpec> model = LoadModel("qwen2.5-tiny");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->name, "qwen2.5-tiny");
}

TEST(HfConfigTest, MtpLayersOnlyWhenAsked) {
  const absl::StatusOr<ModelSpec> plain = LoadModel(ConfigPath("deepseek-v3"));
  const absl::StatusOr<ModelSpec> mtp = LoadModel(ConfigPath("deepseek-v3"), true);
  ASSERT_TRUE(plain.ok() && mtp.ok());
  EXPECT_EQ(plain->num_layers, 61);
  EXPECT_EQ(mtp->num_layers, 62);
  int mtp_tensors = 0;
  for (const TensorSpec& t : mtp->tensors) mtp_tensors += t.layer == 61;
  EXPECT_GT(mtp_tensors, 0);
  for (const TensorSpec& t : plain->tensors) EXPECT_LT(t.layer, 61) << t.name;
  const auto has = [&](const std::string& name) {
    for (const TensorSpec& t : mtp->tensors) {
      if (t.name == name) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("model.layers.61.eh_proj.weight"));
  EXPECT_TRUE(has("model.layers.61.shared_head.head.weight"));
  EXPECT_TRUE(has("model.layers.61.mlp.experts.gate_proj.weight"));
}

TEST(HfConfigTest, FamilyFeaturesReachTheTensors) {
  const absl::StatusOr<ModelSpec> oss = LoadModel(ConfigPath("gpt-oss-20b"));
  const absl::StatusOr<ModelSpec> glm5 = LoadModel(ConfigPath("glm-5"));
  const absl::StatusOr<ModelSpec> qwen = LoadModel(ConfigPath("qwen2.5-7b"));
  ASSERT_TRUE(oss.ok() && glm5.ok() && qwen.ok());
  const auto shape_of = [](const ModelSpec& m, const std::string& name) {
    for (const TensorSpec& t : m.tensors) {
      if (t.name == name) return t.shape;
    }
    return Dims{};
  };
  EXPECT_EQ(shape_of(*oss, "model.layers.0.self_attn.sinks"), (Dims{64}));
  EXPECT_EQ(shape_of(*oss, "model.layers.0.self_attn.o_proj.bias"), (Dims{2880}));
  EXPECT_EQ(shape_of(*oss, "model.layers.0.mlp.gate.bias"), (Dims{32}));
  EXPECT_EQ(shape_of(*glm5, "model.layers.0.self_attn.indexer.wq_b.weight"),
            (Dims{32 * 128, 2048}));
  EXPECT_EQ(shape_of(*glm5, "model.layers.3.mlp.experts.gate_proj.weight"),
            (Dims{256, 2048, 6144}));
  EXPECT_EQ(shape_of(*glm5, "model.layers.2.mlp.gate_proj.weight"), (Dims{12288, 6144}));
  EXPECT_EQ(shape_of(*qwen, "model.layers.0.self_attn.k_proj.bias"), (Dims{512}));
  EXPECT_EQ(shape_of(*qwen, "lm_head.weight"), (Dims{152064, 3584}));
}

TEST(HfConfigTest, NamedLayoutsBuildForEveryConfig) {
  for (const Published& p : kPublished) {
    SCOPED_TRACE(p.config);
    const absl::StatusOr<ModelSpec> model = LoadModel(ConfigPath(p.config));
    ASSERT_TRUE(model.ok()) << model.status();
    const absl::StatusOr<Layout> layout = BuildNamedLayout(*model, "vllm(tp=2)");
    EXPECT_TRUE(layout.ok()) << layout.status();
  }
}

TEST(HfConfigTest, RefusesTextThatIsNotAJsonObject) {
  for (const char* text : {"", "[1, 2]", "{\"model_type\": ", "not json"}) {
    const absl::StatusOr<ModelSpec> model = Parse(text);
    ASSERT_FALSE(model.ok()) << text;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(model.status().message()), HasSubstr("not a JSON object"));
  }
}

TEST(HfConfigTest, RefusesAMissingOrUnknownModelType) {
  google::protobuf::Struct json = ParseJson(ReadConfig("llama-3.1-8b"));
  json.mutable_fields()->erase("model_type");
  absl::StatusOr<ModelSpec> model = Parse(ToJson(json));
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()),
              AllOf(HasSubstr("\"model_type\""), HasSubstr("missing")));

  // An unknown family is named before any key it lacks.
  (*json.mutable_fields())["model_type"].set_string_value("gpt2");
  json.mutable_fields()->erase("hidden_size");
  model = Parse(ToJson(json));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()),
              AllOf(HasSubstr("\"gpt2\""), HasSubstr("model_type"), HasSubstr("qwen3_moe")));
}

// Every key of every config: without it, the config still builds (the key has a default) or is
// refused naming it. The keys a family cannot do without are refused.
TEST(HfConfigTest, AMissingKeyIsNamedOrDefaulted) {
  const std::vector<std::pair<const char*, std::vector<const char*>>> required = {
      {"llama-3.1-8b",
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "vocab_size"}},
      {"qwen3-235b-a22b", {"num_experts", "moe_intermediate_size"}},
      {"deepseek-v3",
       {"n_routed_experts", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size"}},
      {"glm-5", {"index_n_heads", "index_head_dim"}},
      {"mixtral-8x7b", {"num_local_experts"}},
      {"gpt-oss-120b", {"num_local_experts"}},
      {"glm-4.5", {"n_routed_experts"}},
      {"qwen2.5-7b", {"intermediate_size"}},
  };
  for (const auto& [config, keys] : required) {
    const google::protobuf::Struct json = ParseJson(ReadConfig(config));
    for (const auto& [key, value] : json.fields()) {
      SCOPED_TRACE(absl::StrCat(config, " without ", key));
      google::protobuf::Struct cut = json;
      cut.mutable_fields()->erase(key);
      const absl::StatusOr<ModelSpec> model = Parse(ToJson(cut));
      if (!model.ok()) {
        EXPECT_THAT(std::string(model.status().message()), HasSubstr(absl::StrCat("\"", key)));
      }
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
        EXPECT_FALSE(model.ok());
      }
    }
  }
}

TEST(HfConfigTest, RefusesBadValuesNamingTheKey) {
  const google::protobuf::Struct json = ParseJson(ReadConfig("qwen3-30b-a3b"));
  struct Case {
    const char* key;
    const char* value;  // JSON
    const char* message;
  };
  const Case cases[] = {
      {"hidden_size", "\"2048\"", "\"hidden_size\" is not a number"},
      {"hidden_size", "2048.5", "\"hidden_size\" is not an integer"},
      {"hidden_size", "0", "hidden size must be positive"},
      {"num_key_value_heads", "5", "5 key-value heads do not divide 32"},
      {"tie_word_embeddings", "1", "\"tie_word_embeddings\" is not true or false"},
      {"decoder_sparse_step", "2", "\"decoder_sparse_step\" is 2"},
      {"mlp_only_layers", "[0, 5]", "\"mlp_only_layers\" is not empty"},
      {"mlp_bias", "true", "\"mlp_bias\" is true"},
      {"num_hidden_layers", "-3", "layers must be positive"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.key, " = ", c.value));
    google::protobuf::Struct bad = json;
    (*bad.mutable_fields())[c.key] =
        ParseJson(absl::StrCat("{\"v\": ", c.value, "}")).fields().at("v");
    const absl::StatusOr<ModelSpec> model = Parse(ToJson(bad));
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(c.message));
  }
}

TEST(HfConfigTest, WeightBlockComesFromTheQuantizationConfig) {
  google::protobuf::Struct json = ParseJson(ReadConfig("deepseek-v3"));
  absl::StatusOr<ModelSpec> model = Parse(ToJson(json));
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->quantization.weight_block_rows, 128);
  google::protobuf::Value& quant = (*json.mutable_fields())["quantization_config"];
  (*quant.mutable_struct_value()->mutable_fields())["weight_block_size"] =
      ParseJson("{\"v\": [64, 32]}").fields().at("v");
  model = Parse(ToJson(json));
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->quantization.weight_block_rows, 64);
  EXPECT_EQ(model->quantization.weight_block_cols, 32);
  (*quant.mutable_struct_value()->mutable_fields())["weight_block_size"] =
      ParseJson("{\"v\": [64]}").fields().at("v");
  model = Parse(ToJson(json));
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("weight_block_size"));
}

TEST(HfConfigTest, AnUnreadablePathIsNotFoundNamingIt) {
  const absl::StatusOr<ModelSpec> model = LoadModel("/nonexistent/config.json");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()),
              AllOf(HasSubstr("/nonexistent/config.json"), HasSubstr("qwen2.5-0.5b")));
}

}  // namespace
}  // namespace wsync
