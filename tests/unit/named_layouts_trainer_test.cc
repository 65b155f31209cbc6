// The trainer-side named layouts (planner/named_layouts.h): Megatron's vocabulary padding, tied
// embeddings, ranks and buffers, fp32 router biases, experts over EP or TP, uneven stages, and
// FSDP's flat shards.

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/geometry.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/named_layouts.h"
#include "planner/validate.h"
#include "tests/unit/named_layouts_testing.h"

namespace wsync {
namespace {

using ::wsync::test::named::Model;
using ::wsync::test::named::Build;
using ::wsync::test::named::ParamIndex;
using ::wsync::test::named::PiecesOf;
using ::wsync::test::named::BufferOf;
using ::wsync::test::named::BuffersOf;
using ::wsync::test::named::MakeBox;
using ::wsync::test::named::TinyVocabModel;

TEST(NamedLayoutsTest, MegatronPadsTheVocabularyTo128TimesTp) {
  // 1000 rows with tp=2 pad to 1024; rank 1 holds [512, 1000) and reserves 512 rows before the
  // next tensor.
  const Layout tiny = Build(TinyVocabModel(1000), "megatron(tp=2)");
  const std::vector<Piece> embed = PiecesOf(tiny, "model.embed_tokens.weight", 1);
  ASSERT_EQ(embed.size(), 1u);
  EXPECT_EQ(embed[0].box, MakeBox({512, 0}, {488, 8}));
  const std::vector<Piece> norm = PiecesOf(tiny, "model.layers.0.input_layernorm.weight", 1);
  EXPECT_EQ(norm.at(0).offset, 512 * 8);
  EXPECT_EQ(BufferOf(tiny, 1, 0)->bytes, (512 * 8 + 8) * 2);

  // llama-3-8b, tp=8: 128256 rows pad to 129024 (a multiple of 1024), 16128 per rank.
  const Layout llama = Build(Model("llama-3-8b"), "megatron(tp=8)");
  const std::vector<Piece> last = PiecesOf(llama, "model.embed_tokens.weight", 7);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].box, MakeBox({112896, 0}, {15360, 4096}));
  EXPECT_EQ(last[0].offset, 0);
  EXPECT_EQ(PiecesOf(llama, "model.layers.0.input_layernorm.weight", 7).at(0).offset, 16128 * 4096);
}

TEST(NamedLayoutsTest, MegatronTiedEmbeddingIsOnFirstAndLastStage) {
  const ModelSpec model = Model("llama-3.2-1b");
  const Layout layout = Build(model, "megatron(tp=2,pp=4)");
  // Ranks: stage * 2 + tp_rank. 128256 rows are a multiple of 256: 64128 per rank, no padding.
  for (int32_t process : {0, 6}) {
    EXPECT_EQ(PiecesOf(layout, "model.embed_tokens.weight", process).at(0).box,
              MakeBox({0, 0}, {64128, 2048}));
  }
  for (int32_t process : {1, 7}) {
    EXPECT_EQ(PiecesOf(layout, "model.embed_tokens.weight", process).at(0).box,
              MakeBox({64128, 0}, {64128, 2048}));
  }
  for (int32_t process : {2, 3, 4, 5}) {
    EXPECT_TRUE(PiecesOf(layout, "model.embed_tokens.weight", process).empty());
  }
  // 16 layers, 4 per stage; the final norm is on the last stage.
  EXPECT_EQ(PiecesOf(layout, "model.layers.3.mlp.up_proj.weight", 1).size(), 1u);
  EXPECT_EQ(PiecesOf(layout, "model.layers.4.mlp.up_proj.weight", 2).size(), 1u);
  EXPECT_TRUE(PiecesOf(layout, "model.layers.4.mlp.up_proj.weight", 1).empty());
  EXPECT_EQ(PiecesOf(layout, "model.norm.weight", 7).size(), 1u);

  // Without pipeline stages the embedding has one holder per TP rank.
  const Layout flat = Build(model, "megatron(tp=2)");
  int64_t holders = 0;
  const int32_t embed = ParamIndex(flat, "model.embed_tokens.weight");
  for (const Piece& piece : flat.pieces) holders += piece.param == embed;
  EXPECT_EQ(holders, 2);
}

TEST(NamedLayoutsTest, MegatronRanksAndOneBufferPerProcess) {
  // rank = (pp_rank * dp + dp_rank) * tp + tp_rank: rank 5 of tp=2, pp=2, dp=2 is stage 1, tp 1.
  const ModelSpec model = Model("qwen2.5-0.5b");
  const Layout layout = Build(model, "megatron(tp=2,pp=2,dp=2)");
  const std::vector<Piece> q = PiecesOf(layout, "model.layers.12.self_attn.q_proj.weight", 5);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].box, MakeBox({448, 0}, {448, 896}));
  EXPECT_EQ(q[0].strides, (Dims{896, 1}));
  EXPECT_TRUE(PiecesOf(layout, "model.layers.11.self_attn.q_proj.weight", 5).empty());
  EXPECT_EQ(PiecesOf(layout, "model.layers.0.self_attn.o_proj.weight", 1).at(0).box,
            MakeBox({0, 448}, {896, 448}));
  for (int32_t p = 0; p < 8; ++p) EXPECT_EQ(BuffersOf(layout, p), 1) << p;

  // One process holds the whole model packed back to back (151936 is a multiple of 128).
  const Layout single = Build(model, "megatron");
  ASSERT_EQ(single.buffers.size(), 1u);
  EXPECT_EQ(single.buffers[0].bytes, model.TotalBytes());
  EXPECT_EQ(PiecesOf(single, "model.layers.0.input_layernorm.weight", 0).at(0).offset,
            151936 * 896);
}

TEST(NamedLayoutsTest, MegatronFp32RouterBiasHasItsOwnBuffer) {
  const ModelSpec model = Model("deepseek-v3");
  const Layout layout = Build(model, "megatron(pp=61)");
  // Stage 3 holds layer 3, the first MoE layer: a bf16 buffer and an fp32 buffer.
  ASSERT_EQ(BuffersOf(layout, 3), 2);
  const std::vector<Piece> bias =
      PiecesOf(layout, "model.layers.3.mlp.gate.e_score_correction_bias", 3);
  ASSERT_EQ(bias.size(), 1u);
  EXPECT_EQ(bias[0].offset, 0);
  EXPECT_EQ(BufferOf(layout, 3, bias[0].buffer)->bytes, 256 * 4);
  const std::vector<Piece> router = PiecesOf(layout, "model.layers.3.mlp.gate.weight", 3);
  EXPECT_NE(router.at(0).buffer, bias[0].buffer);
  EXPECT_EQ(BuffersOf(layout, 2), 1);
}

TEST(NamedLayoutsTest, MegatronExpertsSplitOverEpOrTp) {
  const ModelSpec model = Model("qwen3-30b-a3b");
  // ep=4, dp=4, tp=2: rank 5 is dp 2, so ep rank 2: experts [64, 96) whole, as on its TP peer.
  const Layout ep = Build(model, "megatron(tp=2,ep=4)");
  ASSERT_EQ(ep.processes.size(), 8u);
  for (int32_t process : {4, 5}) {
    EXPECT_EQ(PiecesOf(ep, "model.layers.0.mlp.experts.gate_proj.weight", process).at(0).box,
              MakeBox({64, 0, 0}, {32, 768, 2048}));
  }
  // ep=1: experts TP-split along the intermediate axis.
  const Layout tp = Build(model, "megatron(tp=2)");
  EXPECT_EQ(PiecesOf(tp, "model.layers.0.mlp.experts.up_proj.weight", 1).at(0).box,
            MakeBox({0, 384, 0}, {128, 384, 2048}));
  EXPECT_EQ(PiecesOf(tp, "model.layers.0.mlp.experts.down_proj.weight", 1).at(0).box,
            MakeBox({0, 0, 384}, {128, 2048, 384}));
}

TEST(NamedLayoutsTest, MegatronSplitsUnevenLayersOverStages) {
  // 61 layers over 16 stages: stages 0..12 get 4 layers, 13..15 get 3.
  const Layout layout = Build(Model("kimi-k2"), "megatron(pp=16,ep=16)");
  // Rank = stage * 16 + dp_rank.
  EXPECT_EQ(PiecesOf(layout, "model.layers.3.input_layernorm.weight", 0).size(), 1u);
  EXPECT_EQ(PiecesOf(layout, "model.layers.52.input_layernorm.weight", 13 * 16).size(), 1u);
  EXPECT_EQ(PiecesOf(layout, "model.layers.51.input_layernorm.weight", 12 * 16).size(), 1u);
  EXPECT_EQ(PiecesOf(layout, "model.layers.60.input_layernorm.weight", 15 * 16).size(), 1u);
  EXPECT_EQ(PiecesOf(layout, "lm_head.weight", 15 * 16 + 3).size(), 1u);
  EXPECT_TRUE(PiecesOf(layout, "lm_head.weight", 14 * 16).empty());
  // dp rank 3 holds experts [72, 96) of 384.
  EXPECT_EQ(PiecesOf(layout, "model.layers.60.mlp.experts.down_proj.weight", 15 * 16 + 3).at(0).box,
            MakeBox({72, 0, 0}, {24, 7168, 2048}));
}

TEST(NamedLayoutsTest, FsdpFlatShardsPackedWithPadding) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  const Layout layout = Build(model, "fsdp(3)");
  // The embedding (136134656 elements) pads to 136134657: 45378219 per rank.
  constexpr int64_t kEmbedChunk = 45378219;
  // input_layernorm [896]: chunk 299; rank 2 holds [598, 896) at the chunk's offset.
  const std::vector<Piece> norm = PiecesOf(layout, "model.layers.0.input_layernorm.weight", 2);
  ASSERT_EQ(norm.size(), 1u);
  EXPECT_EQ(norm[0].box, MakeBox({598}, {298}));
  EXPECT_EQ(norm[0].offset, kEmbedChunk);
  // k_proj [128, 896] (114688 elements, chunk 38230); rank 1 holds [38230, 76460): row 42 from
  // column 598, rows 43..84, row 85 up to column 300.
  const std::vector<Piece> k = PiecesOf(layout, "model.layers.0.self_attn.k_proj.weight", 1);
  ASSERT_EQ(k.size(), 3u);
  // Before k_proj: embedding, input_layernorm (299) and q_proj [896, 896] (267606).
  const int64_t base = kEmbedChunk + 299 + 267606;
  EXPECT_EQ(k[0].box, MakeBox({42, 598}, {1, 298}));
  EXPECT_EQ(k[0].offset, base);
  EXPECT_EQ(k[1].box, MakeBox({43, 0}, {42, 896}));
  EXPECT_EQ(k[1].offset, base + 298);
  EXPECT_EQ(k[2].box, MakeBox({85, 0}, {1, 300}));
  EXPECT_EQ(k[2].offset, base + 298 + 42 * 896);
  for (const Piece& piece : k) EXPECT_EQ(piece.strides, (Dims{896, 1}));
  // Each rank's buffer reserves ceil(numel / 3) per parameter.
  int64_t reserved = 0;
  for (const TensorSpec& t : model.tensors) reserved += (Volume(t.shape) + 2) / 3;
  for (int32_t r = 0; r < 3; ++r) {
    ASSERT_EQ(BuffersOf(layout, r), 1);
    EXPECT_EQ(BufferOf(layout, r, 0)->bytes, reserved * 2);
  }
}

}  // namespace
}  // namespace wsync
