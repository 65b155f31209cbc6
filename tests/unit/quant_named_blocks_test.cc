// vllm(..., quant=fp8_block) refuses exactly the partitions vLLM refuses (named_quant.h
// CheckVllmBlockPartitions): fused parts per part per rank, row-parallel inputs, experts per
// intermediate partition without EP and whole with it.

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/models.h"
#include "planner/named_layouts.h"

namespace wsync {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ModelSpec Model(absl::string_view name) {
  absl::StatusOr<ModelSpec> model = GetModel(name);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

std::string Refusal(const ModelSpec& model, absl::string_view spec) {
  const absl::StatusOr<Layout> layout = BuildNamedLayout(model, spec);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << spec;
  return std::string(layout.status().message());
}

TEST(QuantNamedBlocksTest, Qwen25HalfBAtTp2IsRefusedLikeVllm) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  // q has 14 heads of 64: 448 rows a rank at tp=2 (k and v 64, o_proj's input 448).
  EXPECT_THAT(Refusal(model, "vllm(tp=2,quant=fp8_block)"),
              AllOf(HasSubstr("vllm: quant=fp8_block at tp=2: qwen2.5-0.5b's "),
                    HasSubstr("model.layers.0.self_attn.q_proj.weight (in vLLM's "
                              "model.layers.0.self_attn.qkv_proj.weight)"),
                    HasSubstr("output partition of 448 per rank"), HasSubstr("128-row"),
                    HasSubstr("vLLM refuses"),
                    HasSubstr("Weight output_partition_size = 448 is not divisible by weight "
                              "quantization block_n = 128"),
                    HasSubstr("whole blocks: vllm(tp=1,ep=1,dp=2,quant=fp8_block)"),
                    HasSubstr("fp8_channel and fp8_tensor have no such rule")));
  for (const char* spec :
       {"vllm(quant=fp8_block)", "vllm(dp=2,quant=fp8_block)", "vllm(tp=2,quant=fp8_channel)",
        "vllm(tp=2,quant=fp8_tensor)", "vllm(tp=2)"}) {
    EXPECT_TRUE(BuildNamedLayout(model, spec).ok()) << spec;
  }
  // llama-3.2-1b: q 1024, k and v 256, o_proj's input 1024, gate 4096 a rank at tp=2.
  EXPECT_TRUE(BuildNamedLayout(Model("llama-3.2-1b"), "vllm(tp=2,quant=fp8_block)").ok());
}

// Each clause of the rule on one model whose shapes the test picks.
TEST(QuantNamedBlocksTest, EachClauseOfTheRule) {
  ModelSpec model;
  model.name = "clauses";
  model.num_layers = 1;
  model.quantization.weight_block_rows = 32;
  model.quantization.weight_block_cols = 16;
  model.quantization.modules_not_converted = {"e"};
  model.AddTensor("e.weight", {256, 64}, ShardRole::kVocab, -1);
  // q 128 rows (4 heads), k and v 64 (2 heads): 32 rows of k a rank at tp=2.
  const std::string qkv = "l.qkv_proj.weight";
  model.AddFusedTensor("l.q_proj.weight", {128, 64}, ShardRole::kColumn, 0, FuseKind::kQkv, qkv, 0)
      .heads = 4;
  model.AddFusedTensor("l.k_proj.weight", {64, 64}, ShardRole::kColumn, 0, FuseKind::kQkv, qkv, 1)
      .heads = 2;
  model.AddFusedTensor("l.v_proj.weight", {48, 64}, ShardRole::kColumn, 0, FuseKind::kQkv, qkv, 2)
      .heads = 2;
  // o: 96 input columns, 48 a rank at tp=2 (whole 16-column blocks), 24 at tp=4.
  model.AddTensor("l.o_proj.weight", {64, 96}, ShardRole::kRow, 0);
  // An unfused column-parallel layer of 80 rows: ragged at tp=1 (fine), 40 a rank at tp=2.
  model.AddTensor("l.c.weight", {80, 64}, ShardRole::kColumn, 0);

  // tp=1: the last fused part (v, 48 rows) and the unfused layers may end in ragged blocks.
  EXPECT_TRUE(BuildNamedLayout(model, "vllm(quant=fp8_block)").ok());
  // tp=2: every fused part is checked, v first to fail (24 rows), before c (40 rows).
  EXPECT_THAT(Refusal(model, "vllm(tp=2,quant=fp8_block)"),
              AllOf(HasSubstr("l.v_proj.weight (in vLLM's l.qkv_proj.weight)"),
                    HasSubstr("output partition of 24 per rank, not a whole number of 32-row"),
                    HasSubstr("whole blocks: vllm(tp=1,ep=1,dp=2,quant=fp8_block)")));
  model.tensors[3].shape = {64, 64};  // v as k.
  EXPECT_THAT(Refusal(model, "vllm(tp=2,quant=fp8_block)"),
              HasSubstr("l.c.weight has an output partition of 40 per rank"));
  model.tensors[5].shape = {128, 64};
  EXPECT_TRUE(BuildNamedLayout(model, "vllm(tp=2,quant=fp8_block)").ok());
  // tp=4: o_proj's 24 input columns a rank (k's one head of 32 rows is replicated, whole).
  EXPECT_THAT(Refusal(model, "vllm(tp=4,quant=fp8_block)"),
              AllOf(HasSubstr("l.o_proj.weight has an input partition of 24 per rank"),
                    HasSubstr("16-column"),
                    HasSubstr("Weight input_size_per_partition = 24 is not divisible by weight "
                              "quantization block_k = 16"),
                    HasSubstr("whole blocks: vllm(tp=2,ep=1,dp=2,quant=fp8_block) or "
                              "vllm(tp=1,ep=1,dp=4,quant=fp8_block)")));
  // A fused part before the last is checked at tp=1 too: q of 104 rows (26 a head).
  model.tensors[1].shape = {104, 64};
  EXPECT_THAT(Refusal(model, "vllm(quant=fp8_block)"),
              AllOf(HasSubstr("l.q_proj.weight (in vLLM's l.qkv_proj.weight)"),
                    HasSubstr("output partition of 104"),
                    HasSubstr("no vllm layout of as many processes is whole blocks")));
  // No rule for the per-channel and per-tensor scales.
  EXPECT_TRUE(BuildNamedLayout(model, "vllm(tp=4,quant=fp8_channel)").ok());
  EXPECT_TRUE(BuildNamedLayout(model, "vllm(tp=4,quant=fp8_tensor)").ok());
}

// Routed experts: the intermediate partition without EP, whole experts with it.
TEST(QuantNamedBlocksTest, ExpertsAreCheckedPerPartitionWithoutEp) {
  ModelSpec model = Model("qwen3-moe-tiny");  // 6 experts of intermediate 32, hidden 64.
  model.quantization.weight_block_rows = 16;
  model.quantization.weight_block_cols = 16;
  EXPECT_THAT(Refusal(model, "vllm(tp=4,quant=fp8_block)"),
              AllOf(HasSubstr("model.layers.0.mlp.experts.gate_proj.weight (in vLLM's "
                              "model.layers.0.mlp.experts.w13_weight)"),
                    HasSubstr("intermediate partition (rows of each expert) of 8 per rank"),
                    HasSubstr("The output_size of gate's and up's weight = 8"),
                    HasSubstr("vllm(tp=4,ep=4,dp=1,quant=fp8_block)"),
                    HasSubstr("vllm(tp=2,ep=1,dp=2,quant=fp8_block)")));
  for (const char* spec : {"vllm(tp=4,ep=4,quant=fp8_block)", "vllm(dp=4,ep=4,quant=fp8_block)",
                           "vllm(tp=2,quant=fp8_block)", "vllm(tp=4,quant=fp8_channel)"}) {
    EXPECT_TRUE(BuildNamedLayout(model, spec).ok()) << spec;
  }
  // Down's columns: 32-column blocks cut the 16 intermediate columns of tp=2 (tp > 1 only).
  model.quantization.weight_block_rows = 8;
  model.quantization.weight_block_cols = 32;
  EXPECT_THAT(Refusal(model, "vllm(tp=2,quant=fp8_block)"),
              AllOf(HasSubstr("model.layers.0.mlp.experts.down_proj.weight (in vLLM's "
                              "model.layers.0.mlp.experts.w2_weight)"),
                    HasSubstr("intermediate partition (columns of each expert) of 16 per rank"),
                    HasSubstr("The input_size of down's weight = 16")));
  EXPECT_TRUE(BuildNamedLayout(model, "vllm(dp=2,ep=2,quant=fp8_block)").ok());
  EXPECT_TRUE(BuildNamedLayout(model, "vllm(tp=2,ep=2,quant=fp8_block)").ok());

  // A published model: qwen3-30b-a3b's 768 intermediate features are 96 a rank at tp=8.
  const ModelSpec qwen3 = Model("qwen3-30b-a3b");
  EXPECT_THAT(
      Refusal(qwen3, "vllm(tp=8,quant=fp8_block)"),
      AllOf(HasSubstr("of 96 per rank"), HasSubstr("vllm(tp=8,ep=8,dp=1,quant=fp8_block)")));
  EXPECT_TRUE(BuildNamedLayout(qwen3, "vllm(tp=8,ep=8,quant=fp8_block)").ok());
  EXPECT_TRUE(BuildNamedLayout(qwen3, "vllm(tp=2,quant=fp8_block)").ok());
}

// The layouts README's `wsync plan --simulate` rows use.
TEST(QuantNamedBlocksTest, DeepSeekV3AndKimiK2AtTheReadmeLayoutsAreAccepted) {
  for (const char* name : {"deepseek-v3", "kimi-k2"}) {
    const ModelSpec model = Model(name);
    for (const char* spec :
         {"vllm(tp=8,ep=8,dp=16,quant=fp8_block)", "vllm(tp=8,dp=16,ep=128,quant=fp8_block)",
          "vllm(tp=8,quant=fp8_block)"}) {
      const absl::StatusOr<Layout> layout = BuildNamedLayout(model, spec);
      EXPECT_TRUE(layout.ok()) << name << " " << spec << ": " << layout.status();
    }
  }
  // The test sizes of the families whose FP8 layouts tests use.
  EXPECT_TRUE(BuildNamedLayout(Model("qwen2.5-tiny"), "vllm(dp=2,quant=fp8_block)").ok());
  EXPECT_THAT(Refusal(Model("qwen2.5-tiny"), "vllm(tp=2,quant=fp8_block)"),
              HasSubstr("k_proj.weight (in vLLM's model.layers.0.self_attn.qkv_proj.weight) has an "
                        "output partition of 32 per rank, not a whole number of 64-row"));
  EXPECT_TRUE(BuildNamedLayout(Model("deepseek-v3-tiny"), "vllm(tp=2,ep=2,quant=fp8_block)").ok());
  EXPECT_TRUE(BuildNamedLayout(Model("kimi-k2-tiny"), "vllm(tp=2,quant=fp8_block)").ok());
}

}  // namespace
}  // namespace wsync
