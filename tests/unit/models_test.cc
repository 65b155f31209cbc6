#include "planner/models.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelSpec Model(const std::string& name) {
  absl::StatusOr<ModelSpec> model = GetModel(name);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

const TensorSpec* Find(const ModelSpec& model, const std::string& name) {
  for (const TensorSpec& tensor : model.tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

int CountWithSuffix(const ModelSpec& model, const std::string& suffix) {
  int count = 0;
  for (const TensorSpec& tensor : model.tensors) {
    if (tensor.name.size() >= suffix.size() &&
        tensor.name.compare(tensor.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      ++count;
    }
  }
  return count;
}

TEST(ModelsTest, NamesAreTheSixEmbeddedModelsAndTheTestModels) {
  EXPECT_THAT(ModelNames(),
              ElementsAre("qwen2.5-0.5b", "llama-3-8b", "llama-3.2-1b", "qwen3-30b-a3b",
                          "deepseek-v3", "kimi-k2", "qwen2.5-tiny", "llama-3-tiny", "qwen3-tiny",
                          "qwen3-moe-tiny", "qwen2-moe-tiny", "deepseek-v3-tiny", "kimi-k2-tiny"));
}

TEST(ModelsTest, UnknownNameIsNotFound) {
  const absl::StatusOr<ModelSpec> model = GetModel("gpt-2");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("gpt-2"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("kimi-k2"));
}

// Published totals (model cards); the counts leave out DeepSeek-V3's multi-token-prediction layer
// as the published 671B does. Tolerance: 1%.
TEST(ModelsTest, ParameterCountsMatchPublishedTotals) {
  const std::vector<std::pair<std::string, double>> published = {
      {"qwen2.5-0.5b", 0.494e9}, {"llama-3-8b", 8.03e9}, {"llama-3.2-1b", 1.24e9},
      {"qwen3-30b-a3b", 30.5e9}, {"deepseek-v3", 671e9}, {"kimi-k2", 1.03e12},
  };
  for (const auto& [name, total] : published) {
    const ModelSpec model = Model(name);
    EXPECT_NEAR(static_cast<double>(model.TotalElements()) / total, 1.0, 0.01) << name;
  }
}

// Closed-form counts from each config.json: embedding (and head when untied), per layer
// attention + MLP + norms, final norm.
TEST(ModelsTest, ParameterCountsMatchClosedForm) {
  EXPECT_EQ(Model("qwen2.5-0.5b").TotalElements(), 494032768);
  EXPECT_EQ(Model("llama-3-8b").TotalElements(), 8030261248);
  EXPECT_EQ(Model("llama-3.2-1b").TotalElements(), 1235814400);
  EXPECT_EQ(Model("qwen3-30b-a3b").TotalElements(), 30532122624);
  EXPECT_EQ(Model("deepseek-v3").TotalElements(), 671026419200);
  EXPECT_EQ(Model("kimi-k2").TotalElements(), 1026408232448);
}

TEST(ModelsTest, TotalBytesCountFp32RouterBiasesAtFourBytes) {
  const ModelSpec dense = Model("llama-3-8b");
  EXPECT_EQ(dense.TotalBytes(), 2 * dense.TotalElements());
  // 58 MoE layers with a [256] fp32 e_score_correction_bias each.
  const ModelSpec deepseek = Model("deepseek-v3");
  EXPECT_EQ(deepseek.TotalBytes(), 2 * deepseek.TotalElements() + 2 * 58 * 256);
}

TEST(ModelsTest, NamesAreUniqueAndLayersInRange) {
  for (const std::string& name : ModelNames()) {
    const ModelSpec model = Model(name);
    EXPECT_EQ(model.name, name);
    absl::flat_hash_set<std::string> names;
    for (const TensorSpec& tensor : model.tensors) {
      EXPECT_TRUE(names.insert(tensor.name).second) << tensor.name;
      EXPECT_GE(tensor.layer, -2) << tensor.name;
      EXPECT_LT(tensor.layer, model.num_layers) << tensor.name;
      if (tensor.fuse == FuseKind::kNone) {
        EXPECT_EQ(tensor.fuse_index, 0) << tensor.name;
      } else {
        EXPECT_FALSE(tensor.fused_name.empty()) << tensor.name;
      }
    }
    const TensorSpec* embed = Find(model, "model.embed_tokens.weight");
    ASSERT_NE(embed, nullptr) << name;
    EXPECT_EQ(embed->role, ShardRole::kVocab);
    EXPECT_EQ(embed->layer, -1);
    EXPECT_EQ(embed->shape[0], model.vocab);
    EXPECT_EQ(Find(model, "lm_head.weight") == nullptr, model.tied_embeddings) << name;
    EXPECT_EQ(Find(model, "model.norm.weight")->layer, -2);
  }
}

TEST(ModelsTest, Qwen25HalfBillion) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  EXPECT_EQ(model.num_layers, 24);
  EXPECT_TRUE(model.tied_embeddings);
  EXPECT_EQ(Find(model, "model.embed_tokens.weight")->shape, (Dims{151936, 896}));
  const TensorSpec* q = Find(model, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q->shape, (Dims{896, 896}));
  EXPECT_EQ(q->heads, 14);
  const TensorSpec* k = Find(model, "model.layers.23.self_attn.k_proj.weight");
  EXPECT_EQ(k->shape, (Dims{128, 896}));
  EXPECT_EQ(k->heads, 2);
  EXPECT_EQ(k->fuse, FuseKind::kQkv);
  EXPECT_EQ(k->fuse_index, 1);
  EXPECT_EQ(k->fused_name, "model.layers.23.self_attn.qkv_proj.weight");
  const TensorSpec* v_bias = Find(model, "model.layers.5.self_attn.v_proj.bias");
  ASSERT_NE(v_bias, nullptr);
  EXPECT_EQ(v_bias->shape, (Dims{128}));
  EXPECT_EQ(v_bias->fuse_index, 2);
  EXPECT_EQ(v_bias->heads, 2);
  EXPECT_EQ(v_bias->fused_name, "model.layers.5.self_attn.qkv_proj.bias");
  const TensorSpec* up = Find(model, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up->shape, (Dims{4864, 896}));
  EXPECT_EQ(up->fuse, FuseKind::kGateUp);
  EXPECT_EQ(up->fuse_index, 1);
  EXPECT_EQ(up->fused_name, "model.layers.0.mlp.gate_up_proj.weight");
  const TensorSpec* down = Find(model, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(down->shape, (Dims{896, 4864}));
  EXPECT_EQ(down->role, ShardRole::kRow);
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.o_proj.bias"), nullptr);
  EXPECT_EQ(Find(model, "model.layers.0.input_layernorm.weight")->role, ShardRole::kReplicated);
}

TEST(ModelsTest, Llama3Models) {
  const ModelSpec big = Model("llama-3-8b");
  EXPECT_FALSE(big.tied_embeddings);
  EXPECT_EQ(Find(big, "lm_head.weight")->shape, (Dims{128256, 4096}));
  EXPECT_EQ(Find(big, "lm_head.weight")->layer, -2);
  EXPECT_EQ(Find(big, "model.layers.31.self_attn.v_proj.weight")->shape, (Dims{1024, 4096}));
  EXPECT_EQ(Find(big, "model.layers.31.mlp.gate_proj.weight")->shape, (Dims{14336, 4096}));
  EXPECT_EQ(Find(big, "model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(CountWithSuffix(big, "input_layernorm.weight"), 32);

  const ModelSpec small = Model("llama-3.2-1b");
  EXPECT_TRUE(small.tied_embeddings);
  EXPECT_EQ(Find(small, "model.layers.0.self_attn.q_proj.weight")->shape, (Dims{2048, 2048}));
  EXPECT_EQ(Find(small, "model.layers.15.self_attn.k_proj.weight")->shape, (Dims{512, 2048}));
  EXPECT_EQ(Find(small, "model.layers.15.self_attn.k_proj.weight")->heads, 8);
  EXPECT_EQ(Find(small, "model.layers.15.mlp.down_proj.weight")->shape, (Dims{2048, 8192}));
}

TEST(ModelsTest, Qwen3MoeExpertsAreOneTensorPerLayerAndProjection) {
  const ModelSpec model = Model("qwen3-30b-a3b");
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.q_norm.weight")->shape, (Dims{128}));
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.q_proj.weight")->shape, (Dims{4096, 2048}));
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.k_proj.weight")->shape, (Dims{512, 2048}));
  EXPECT_EQ(Find(model, "model.layers.0.mlp.gate.weight")->shape, (Dims{128, 2048}));
  EXPECT_EQ(Find(model, "model.layers.0.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_EQ(Find(model, "model.layers.0.mlp.shared_experts.gate_proj.weight"), nullptr);
  EXPECT_EQ(Find(model, "model.layers.0.mlp.gate_proj.weight"), nullptr);
  const TensorSpec* gate = Find(model, "model.layers.47.mlp.experts.gate_proj.weight");
  EXPECT_EQ(gate->shape, (Dims{128, 768, 2048}));
  EXPECT_EQ(gate->role, ShardRole::kExpertColumn);
  EXPECT_EQ(gate->fuse, FuseKind::kExpertW13);
  EXPECT_EQ(gate->fuse_index, 0);
  EXPECT_EQ(gate->fused_name, "model.layers.47.mlp.experts.w13_weight");
  const TensorSpec* down = Find(model, "model.layers.47.mlp.experts.down_proj.weight");
  EXPECT_EQ(down->shape, (Dims{128, 2048, 768}));
  EXPECT_EQ(down->role, ShardRole::kExpertRow);
  EXPECT_EQ(down->fuse, FuseKind::kNone);
  EXPECT_EQ(down->fused_name, "model.layers.47.mlp.experts.w2_weight");
  EXPECT_EQ(CountWithSuffix(model, "mlp.experts.up_proj.weight"), 48);
}

TEST(ModelsTest, DeepSeekV3LatentAttentionAndExperts) {
  const ModelSpec model = Model("deepseek-v3");
  EXPECT_EQ(model.num_layers, 61);
  EXPECT_EQ(model.vocab, 129280);
  const TensorSpec* q_a = Find(model, "model.layers.0.self_attn.q_a_proj.weight");
  EXPECT_EQ(q_a->shape, (Dims{1536, 7168}));
  EXPECT_EQ(q_a->role, ShardRole::kReplicated);
  EXPECT_EQ(q_a->fuse, FuseKind::kMlaQkvA);
  EXPECT_EQ(q_a->fused_name, "model.layers.0.self_attn.fused_qkv_a_proj.weight");
  const TensorSpec* kv_a = Find(model, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_EQ(kv_a->shape, (Dims{576, 7168}));
  EXPECT_EQ(kv_a->fuse_index, 1);
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.q_a_layernorm.weight")->shape, (Dims{1536}));
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.kv_a_layernorm.weight")->shape, (Dims{512}));
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.q_b_proj.weight")->shape, (Dims{24576, 1536}));
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.kv_b_proj.weight")->shape, (Dims{32768, 512}));
  EXPECT_EQ(Find(model, "model.layers.0.self_attn.o_proj.weight")->shape, (Dims{7168, 16384}));
  // Layers 0..2 are dense, 3..60 route.
  EXPECT_EQ(Find(model, "model.layers.2.mlp.gate_proj.weight")->shape, (Dims{18432, 7168}));
  EXPECT_EQ(Find(model, "model.layers.3.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(CountWithSuffix(model, "mlp.experts.gate_proj.weight"), 58);
  EXPECT_EQ(Find(model, "model.layers.3.mlp.experts.up_proj.weight")->shape,
            (Dims{256, 2048, 7168}));
  const TensorSpec* bias = Find(model, "model.layers.60.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(bias->shape, (Dims{256}));
  EXPECT_EQ(bias->dtype, DType::kFloat32);
  const TensorSpec* shared = Find(model, "model.layers.3.mlp.shared_experts.up_proj.weight");
  EXPECT_EQ(shared->shape, (Dims{2048, 7168}));
  EXPECT_EQ(shared->fused_name, "model.layers.3.mlp.shared_experts.gate_up_proj.weight");
  EXPECT_EQ(Find(model, "model.layers.3.mlp.shared_experts.down_proj.weight")->role,
            ShardRole::kRow);
  EXPECT_EQ(Find(model, "lm_head.weight")->shape, (Dims{129280, 7168}));
}

TEST(ModelsTest, KimiK2DiffersFromDeepSeekV3InExpertsHeadsAndVocab) {
  const ModelSpec model = Model("kimi-k2");
  EXPECT_EQ(Find(model, "model.embed_tokens.weight")->shape, (Dims{163840, 7168}));
  EXPECT_EQ(Find(model, "model.layers.0.mlp.down_proj.weight")->shape, (Dims{7168, 18432}));
  EXPECT_EQ(Find(model, "model.layers.1.mlp.experts.down_proj.weight")->shape,
            (Dims{384, 7168, 2048}));
  EXPECT_EQ(Find(model, "model.layers.1.mlp.gate.e_score_correction_bias")->shape, (Dims{384}));
  EXPECT_EQ(CountWithSuffix(model, "mlp.experts.gate_proj.weight"), 60);
  const TensorSpec* q_b = Find(model, "model.layers.7.self_attn.q_b_proj.weight");
  EXPECT_EQ(q_b->shape, (Dims{12288, 1536}));
  EXPECT_EQ(q_b->heads, 64);
  EXPECT_EQ(Find(model, "model.layers.7.self_attn.o_proj.weight")->shape, (Dims{7168, 8192}));
}

}  // namespace
}  // namespace wsync

namespace wsync {
namespace {

TEST(ModelsTest, TruncateLayersKeepsEmbeddingHeadAndTheFirstLayers) {
  const ModelSpec full = *GetModel("llama-3-8b");
  const ModelSpec two = *TruncateLayers(full, 2);
  EXPECT_EQ(two.num_layers, 2);
  int64_t layer_tensors = 0;
  for (const TensorSpec& t : two.tensors) {
    EXPECT_LT(t.layer, 2) << t.name;
    layer_tensors += t.layer >= 0;
  }
  int64_t full_first_two = 0;
  for (const TensorSpec& t : full.tensors) full_first_two += t.layer == 0 || t.layer == 1;
  EXPECT_EQ(layer_tensors, full_first_two);
  // Embedding, final norm and lm_head stay: 128256 * 4096 * 2 + 4096 elements outside the layers.
  const int64_t per_layer = (full.TotalElements() - two.TotalElements()) / 30;
  EXPECT_EQ(two.TotalElements(), 2 * 128256 * 4096 + 4096 + 2 * per_layer);
  EXPECT_FALSE(TruncateLayers(full, 0).ok());
  EXPECT_FALSE(TruncateLayers(full, 33).ok());
}

bool Quantized(const ModelSpec& model, const std::string& name,
               WeightQuant quant = WeightQuant::kFp8Block) {
  const absl::StatusOr<bool> quantized = IsQuantizedParameter(model, name, quant);
  EXPECT_TRUE(quantized.ok()) << quantized.status();
  return quantized.ok() && *quantized;
}

// DeepSeek-V3 and Kimi-K2 ship block-FP8 checkpoints: every linear weight (attention, dense MLP,
// shared and routed experts) is FP8; embeddings, lm_head, norms, the router and its bias are not.
TEST(ModelQuantizationTest, DeepSeekV3AndKimiK2KeepEmbeddingsHeadNormsAndRoutersBf16) {
  for (const std::string name : {"deepseek-v3", "kimi-k2"}) {
    SCOPED_TRACE(name);
    const ModelSpec model = Model(name);
    EXPECT_EQ(model.quantization.weight_block_rows, 128);
    EXPECT_EQ(model.quantization.weight_block_cols, 128);
    const std::string moe = name == "kimi-k2" ? "model.layers.1." : "model.layers.3.";
    for (const std::string& bf16 :
         {std::string("model.embed_tokens.weight"), std::string("lm_head.weight"),
          std::string("model.norm.weight"), std::string("model.layers.0.input_layernorm.weight"),
          std::string("model.layers.0.self_attn.q_a_layernorm.weight"),
          std::string("model.layers.0.self_attn.kv_a_layernorm.weight"), moe + "mlp.gate.weight",
          moe + "mlp.gate.e_score_correction_bias"}) {
      EXPECT_FALSE(Quantized(model, bf16)) << bf16;
    }
    for (const std::string& fp8 :
         {std::string("model.layers.0.self_attn.q_a_proj.weight"),
          std::string("model.layers.0.self_attn.q_b_proj.weight"),
          std::string("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"),
          std::string("model.layers.0.self_attn.kv_b_proj.weight"),
          std::string("model.layers.0.self_attn.o_proj.weight"),
          std::string("model.layers.0.self_attn.fused_qkv_a_proj.weight"),
          std::string("model.layers.0.mlp.gate_proj.weight"),
          std::string("model.layers.0.mlp.gate_up_proj.weight"), moe + "mlp.experts.w13_weight",
          moe + "mlp.experts.w2_weight", moe + "mlp.experts.up_proj.weight",
          moe + "mlp.shared_experts.down_proj.weight"}) {
      EXPECT_TRUE(Quantized(model, fp8)) << fp8;
    }
    // Every weight of 2 or 3 axes but the embeddings, the head and one router per MoE layer.
    int64_t quantized = 0, matrices = 0, quantized_elements = 0;
    for (const TensorSpec& tensor : model.tensors) {
      if (tensor.shape.size() >= 2) ++matrices;
      if (Quantized(model, tensor.name)) {
        ++quantized;
        quantized_elements += Volume(tensor.shape);
        EXPECT_GE(tensor.shape.size(), 2u) << tensor.name;
      }
    }
    EXPECT_EQ(quantized, matrices - 2 - CountWithSuffix(model, "mlp.gate.weight"));
    EXPECT_GT(quantized_elements, model.TotalElements() * 99 / 100);
    EXPECT_FALSE(Quantized(model, "model.layers.0.self_attn.o_proj.weight", WeightQuant::kNone));
  }
}

TEST(ModelQuantizationTest, QwenModelsKeepBiasesNormsRoutersAndSharedExpertGateBf16) {
  const ModelSpec dense = Model("qwen2.5-0.5b");  // tied embeddings: no lm_head
  EXPECT_TRUE(Quantized(dense, "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(Quantized(dense, "model.layers.0.self_attn.qkv_proj.weight"));
  EXPECT_TRUE(Quantized(dense, "model.layers.0.mlp.down_proj.weight", WeightQuant::kFp8Channel));
  EXPECT_TRUE(Quantized(dense, "model.layers.0.mlp.up_proj.weight", WeightQuant::kFp8Tensor));
  EXPECT_FALSE(Quantized(dense, "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(Quantized(dense, "model.layers.0.self_attn.qkv_proj.bias"));
  EXPECT_FALSE(Quantized(dense, "model.embed_tokens.weight"));
  EXPECT_FALSE(Quantized(dense, "model.layers.0.post_attention_layernorm.weight"));
  const ModelSpec moe = Model("qwen3-30b-a3b");
  EXPECT_FALSE(Quantized(moe, "lm_head.weight"));
  EXPECT_FALSE(Quantized(moe, "model.layers.5.self_attn.q_norm.weight"));
  EXPECT_FALSE(Quantized(moe, "model.layers.5.mlp.gate.weight"));
  EXPECT_TRUE(Quantized(moe, "model.layers.5.mlp.experts.down_proj.weight"));
  EXPECT_TRUE(Quantized(moe, "model.layers.5.self_attn.k_proj.weight"));
  const ModelSpec shared = Model("qwen2-moe-tiny");
  EXPECT_FALSE(Quantized(shared, "model.layers.0.mlp.shared_expert_gate.weight"));
  EXPECT_TRUE(Quantized(shared, "model.layers.0.mlp.shared_expert.gate_proj.weight"));
}

TEST(ModelQuantizationTest, UnknownParameterAndQuantNames) {
  const ModelSpec model = Model("qwen2.5-tiny");
  const absl::StatusOr<bool> missing =
      IsQuantizedParameter(model, "model.layers.9.mlp.up_proj.weight", WeightQuant::kFp8Block);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("model.layers.9.mlp.up_proj"));
  for (const WeightQuant quant : {WeightQuant::kNone, WeightQuant::kFp8Block,
                                  WeightQuant::kFp8Channel, WeightQuant::kFp8Tensor}) {
    const absl::StatusOr<WeightQuant> parsed = ParseWeightQuant(WeightQuantName(quant));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, quant);
  }
  EXPECT_THAT(std::string(ParseWeightQuant("fp4").status().message()), HasSubstr("fp8_block"));
}

}  // namespace
}  // namespace wsync
