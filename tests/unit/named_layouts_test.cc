#include "planner/named_layouts.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/geometry.h"
#include "planner/layout.h"
#include "planner/models.h"
#include "planner/validate.h"
#include "tests/unit/named_layouts_testing.h"

namespace wsync {
namespace {

using ::testing::HasSubstr;
using ::wsync::test::named::Model;
using ::wsync::test::named::Build;
using ::wsync::test::named::PiecesOf;
using ::wsync::test::named::BufferOf;
using ::wsync::test::named::BuffersOf;
using ::wsync::test::named::MakeBox;
using ::wsync::test::named::TinyVocabModel;
using ::wsync::test::named::TinyAttentionModel;

// The parallel sizes of a spec, written out by hand for the independent coverage check.
struct Case {
  std::string model;
  std::string spec;
  char kind;  // 'm'egatron, 'v'llm, 'f'sdp
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t ep = 1;
  int64_t dp = 1;
  int64_t n = 1;
};

// Elements of `t` summed over all pieces of a layout: the tensor's volume times its copies.
int64_t ExpectedElements(const ModelSpec& model, const TensorSpec& t, const Case& c) {
  const int64_t numel = Volume(t.shape);
  const bool expert = t.role == ShardRole::kExpertColumn || t.role == ShardRole::kExpertRow;
  switch (c.kind) {
    case 'f':
      return numel;
    case 'm': {
      // DP replicas repeat the model; replicated tensors and (with EP) experts repeat over TP;
      // EP ranks each hold 1/ep of the experts; a tied embedding has a second holder.
      int64_t copies = c.dp;
      if (t.role == ShardRole::kReplicated || (expert && c.ep > 1)) copies *= c.tp;
      if (t.role == ShardRole::kVocab && model.tied_embeddings && c.pp > 1) copies *= 2;
      return expert && c.ep > 1 ? numel * copies / c.ep : numel * copies;
    }
    default: {
      // With EP, each expert is held whole by tp * dp / ep processes: dp with ep = tp, one with
      // wide EP (ep = tp * dp).
      int64_t copies = expert && c.ep > 1 ? c.tp * c.dp / c.ep : c.dp;
      if (t.role == ShardRole::kReplicated) copies *= c.tp;
      // GQA: each kv head is held by tp / kv_heads ranks.
      if (t.fuse == FuseKind::kQkv && t.fuse_index > 0 && t.heads < c.tp) {
        copies *= c.tp / t.heads;
      }
      return numel * copies;
    }
  }
}

std::vector<Case> Cases() {
  return {
      {"qwen2.5-0.5b", "megatron", 'm'},
      {"qwen2.5-0.5b", "megatron(tp=2, pp=4, dp=2)", 'm', 2, 4, 1, 2},
      {"qwen2.5-0.5b", "fsdp(4)", 'f', 1, 1, 1, 1, 4},
      {"qwen2.5-0.5b", "fsdp(n=7)", 'f', 1, 1, 1, 1, 7},
      {"qwen2.5-0.5b", "vllm(tp=2)", 'v', 2},
      {"qwen2.5-0.5b", "vllm(tp=4)", 'v', 4},
      {"qwen2.5-0.5b", "vllm(tp=2,dp=3)", 'v', 2, 1, 1, 3},
      {"llama-3-8b", "megatron(tp=8,pp=4)", 'm', 8, 4},
      {"llama-3-8b", "megatron(tp=4,pp=2,dp=2)", 'm', 4, 2, 1, 2},
      {"llama-3-8b", "fsdp(8)", 'f', 1, 1, 1, 1, 8},
      {"llama-3-8b", "vllm(tp=8,dp=2)", 'v', 8, 1, 1, 2},
      {"llama-3-8b", "vllm(tp=16)", 'v', 16},
      {"llama-3.2-1b", "megatron(tp=2,pp=4)", 'm', 2, 4},
      {"llama-3.2-1b", "fsdp(3)", 'f', 1, 1, 1, 1, 3},
      {"llama-3.2-1b", "vllm(tp=8)", 'v', 8},
      {"qwen3-30b-a3b", "megatron(tp=2)", 'm', 2},
      {"qwen3-30b-a3b", "megatron(tp=4,pp=4,ep=8)", 'm', 4, 4, 8, 8},
      {"qwen3-30b-a3b", "megatron(tp=2,ep=4,dp=8)", 'm', 2, 1, 4, 8},
      {"qwen3-30b-a3b", "fsdp(8)", 'f', 1, 1, 1, 1, 8},
      {"qwen3-30b-a3b", "vllm(tp=4)", 'v', 4},
      {"qwen3-30b-a3b", "vllm(tp=8,ep=8)", 'v', 8, 1, 8},
      {"deepseek-v3", "megatron(tp=2,pp=16,ep=8)", 'm', 2, 16, 8, 8},
      {"deepseek-v3", "fsdp(16)", 'f', 1, 1, 1, 1, 16},
      {"deepseek-v3", "vllm(tp=8)", 'v', 8},
      {"deepseek-v3", "vllm(tp=8,ep=8,dp=2)", 'v', 8, 1, 8, 2},
      {"kimi-k2", "megatron(pp=16,ep=16)", 'm', 1, 16, 16, 16},
      {"kimi-k2", "fsdp(64)", 'f', 1, 1, 1, 1, 64},
      {"kimi-k2", "vllm(tp=8,ep=8,dp=16)", 'v', 8, 1, 8, 16},
      {"qwen3-30b-a3b", "vllm(tp=2,dp=4,ep=8)", 'v', 2, 1, 8, 4},
      {"qwen3-30b-a3b", "vllm(dp=4,ep=4)", 'v', 1, 1, 4, 4},
      {"deepseek-v3", "vllm(tp=8,dp=16,ep=128)", 'v', 8, 1, 128, 16},
      {"kimi-k2", "vllm(tp=8,dp=16,ep=128)", 'v', 8, 1, 128, 16},
  };
}

TEST(NamedLayoutsTest, EveryCaseValidatesAndCoversEachParameterAsExpected) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.model + " " + c.spec);
    const ModelSpec model = Model(c.model);
    const Layout layout = Build(model, c.spec);
    const int64_t processes = c.kind == 'f' ? c.n : c.tp * c.pp * c.dp;
    ASSERT_EQ(static_cast<int64_t>(layout.processes.size()), processes);
    EXPECT_EQ(layout.role, c.kind == 'v' ? Role::kRollout : Role::kTrainer);
    const absl::Status valid = ValidateLayout(layout);
    EXPECT_TRUE(valid.ok()) << valid;
    ASSERT_EQ(layout.params.size(), model.tensors.size());
    std::vector<int64_t> held(layout.params.size(), 0);
    for (const Piece& piece : layout.pieces) held[piece.param] += Volume(piece.box);
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const TensorSpec& t = model.tensors[i];
      ASSERT_EQ(layout.params[i].name, t.name);
      EXPECT_EQ(layout.params[i].dtype, t.dtype);
      EXPECT_EQ(held[i], ExpectedElements(model, t, c)) << t.name;
    }
  }
}

TEST(NamedLayoutsTest, VllmQkvWithReplicatedKvHeads) {
  // qwen2.5-0.5b: 14 q heads, 2 kv heads of 64 rows; tp=4 gives 224 q rows per rank and kv head
  // tp_rank * 2 / 4 to each rank.
  const ModelSpec model = Model("qwen2.5-0.5b");
  const Layout layout = Build(model, "vllm(tp=4)");
  const std::vector<Piece> q = PiecesOf(layout, "model.layers.0.self_attn.q_proj.weight", 3);
  const std::vector<Piece> k = PiecesOf(layout, "model.layers.0.self_attn.k_proj.weight", 3);
  const std::vector<Piece> v = PiecesOf(layout, "model.layers.0.self_attn.v_proj.weight", 3);
  ASSERT_EQ(q.size(), 1u);
  ASSERT_EQ(k.size(), 1u);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(q[0].box, MakeBox({672, 0}, {224, 896}));
  EXPECT_EQ(k[0].box, MakeBox({64, 0}, {64, 896}));
  EXPECT_EQ(v[0].box, MakeBox({64, 0}, {64, 896}));
  EXPECT_EQ(q[0].offset, 0);
  EXPECT_EQ(k[0].offset, 224 * 896);
  EXPECT_EQ(v[0].offset, 288 * 896);
  for (const Piece* piece : {&q[0], &k[0], &v[0]}) {
    EXPECT_EQ(piece->strides, (Dims{896, 1}));
    EXPECT_EQ(piece->buffer, q[0].buffer);
  }
  EXPECT_EQ(BufferOf(layout, 3, q[0].buffer)->bytes, 352 * 896 * 2);
  // Ranks 0 and 1 share kv head 0.
  EXPECT_EQ(PiecesOf(layout, "model.layers.0.self_attn.k_proj.weight", 1).at(0).box,
            MakeBox({0, 0}, {64, 896}));
  // The fused bias: [352] with the same row structure.
  const std::vector<Piece> k_bias = PiecesOf(layout, "model.layers.0.self_attn.k_proj.bias", 3);
  ASSERT_EQ(k_bias.size(), 1u);
  EXPECT_EQ(k_bias[0].box, MakeBox({64}, {64}));
  EXPECT_EQ(k_bias[0].offset, 224);
  EXPECT_EQ(k_bias[0].strides, (Dims{1}));
  EXPECT_EQ(BufferOf(layout, 3, k_bias[0].buffer)->bytes, 352 * 2);
  // One buffer per module tensor: embedding, final norm, and per layer input norm, qkv weight,
  // qkv bias, o_proj, post-attention norm, gate_up, down.
  EXPECT_EQ(BuffersOf(layout, 3), 2 + 24 * 7);
}

TEST(NamedLayoutsTest, VllmExpertW13IsStridedGateThenUp) {
  // kimi-k2 vllm(tp=8, ep=8): rank 5 holds experts [240, 288) whole; w13 [48, 2 * 2048, 7168].
  const ModelSpec model = Model("kimi-k2");
  const Layout layout = Build(model, "vllm(tp=8,ep=8)");
  constexpr int64_t kI = 2048;
  constexpr int64_t kH = 7168;
  const std::vector<Piece> gate =
      PiecesOf(layout, "model.layers.1.mlp.experts.gate_proj.weight", 5);
  const std::vector<Piece> up = PiecesOf(layout, "model.layers.1.mlp.experts.up_proj.weight", 5);
  ASSERT_EQ(gate.size(), 1u);
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(gate[0].box, MakeBox({240, 0, 0}, {48, kI, kH}));
  EXPECT_EQ(up[0].box, MakeBox({240, 0, 0}, {48, kI, kH}));
  EXPECT_EQ(gate[0].strides, (Dims{2 * kI * kH, kH, 1}));
  EXPECT_EQ(up[0].strides, (Dims{2 * kI * kH, kH, 1}));
  EXPECT_EQ(gate[0].offset, 0);
  EXPECT_EQ(up[0].offset, kI * kH);
  EXPECT_EQ(up[0].buffer, gate[0].buffer);
  EXPECT_EQ(BufferOf(layout, 5, gate[0].buffer)->bytes, 48 * 2 * kI * kH * 2);
  const std::vector<Piece> down =
      PiecesOf(layout, "model.layers.1.mlp.experts.down_proj.weight", 5);
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].box, MakeBox({240, 0, 0}, {48, kH, kI}));
  EXPECT_EQ(down[0].strides, (Dims{kH * kI, kI, 1}));
  EXPECT_NE(down[0].buffer, gate[0].buffer);
  // MLA's fused_qkv_a_proj is whole on every rank: q_a [1536] rows then kv_a [576] rows.
  const std::vector<Piece> kv_a =
      PiecesOf(layout, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight", 5);
  ASSERT_EQ(kv_a.size(), 1u);
  EXPECT_EQ(kv_a[0].box, MakeBox({0, 0}, {576, kH}));
  EXPECT_EQ(kv_a[0].offset, 1536 * kH);
}

TEST(NamedLayoutsTest, VllmExpertsWithoutEpSplitTheIntermediateAxis) {
  const ModelSpec model = Model("qwen3-30b-a3b");
  const Layout layout = Build(model, "vllm(tp=4)");
  const std::vector<Piece> up = PiecesOf(layout, "model.layers.0.mlp.experts.up_proj.weight", 2);
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0].box, MakeBox({0, 384, 0}, {128, 192, 2048}));
  EXPECT_EQ(up[0].strides, (Dims{384 * 2048, 2048, 1}));
  EXPECT_EQ(up[0].offset, 192 * 2048);
  const std::vector<Piece> down =
      PiecesOf(layout, "model.layers.0.mlp.experts.down_proj.weight", 2);
  EXPECT_EQ(down.at(0).box, MakeBox({0, 0, 384}, {128, 2048, 192}));
}

bool IsExpertTensor(const TensorSpec& t) {
  return t.role == ShardRole::kExpertColumn || t.role == ShardRole::kExpertRow;
}

// (param, process, buffer, box, offset, strides) of every piece whose tensor is not a routed
// expert, in a canonical order.
std::vector<std::string> NonExpertPieces(const ModelSpec& model, const Layout& layout) {
  std::vector<std::string> pieces;
  for (const Piece& p : layout.pieces) {
    if (IsExpertTensor(model.tensors[p.param])) continue;
    pieces.push_back(absl::StrCat(p.param, " p", p.process, " b", p.buffer, " ", BoxToString(p.box),
                                  " @", p.offset, DimsToString(p.strides)));
  }
  std::sort(pieces.begin(), pieces.end());
  return pieces;
}

TEST(NamedLayoutsTest, VllmWideEpGivesEachRankOneContiguousExpertBlock) {
  // qwen3-30b-a3b (128 experts, moe intermediate 768, hidden 2048), vllm(tp=4, dp=4, ep=16):
  // process p = dp_rank * 4 + tp_rank is EP rank p and holds experts [8p, 8p + 8) whole, in
  // vLLM's FusedMoE shapes: w13 [8, 2 * 768, 2048] (gate rows, then up rows) and w2 [8, 2048, 768].
  const ModelSpec model = Model("qwen3-30b-a3b");
  const Layout wide = Build(model, "vllm(tp=4,dp=4,ep=16)");
  ASSERT_EQ(wide.processes.size(), 16u);
  constexpr int64_t kI = 768;
  constexpr int64_t kH = 2048;
  for (int32_t p = 0; p < 16; ++p) {
    SCOPED_TRACE(p);
    const std::vector<Piece> gate =
        PiecesOf(wide, "model.layers.7.mlp.experts.gate_proj.weight", p);
    const std::vector<Piece> up = PiecesOf(wide, "model.layers.7.mlp.experts.up_proj.weight", p);
    const std::vector<Piece> down =
        PiecesOf(wide, "model.layers.7.mlp.experts.down_proj.weight", p);
    ASSERT_EQ(gate.size(), 1u);
    ASSERT_EQ(up.size(), 1u);
    ASSERT_EQ(down.size(), 1u);
    EXPECT_EQ(gate[0].box, MakeBox({8 * p, 0, 0}, {8, kI, kH}));
    EXPECT_EQ(up[0].box, MakeBox({8 * p, 0, 0}, {8, kI, kH}));
    EXPECT_EQ(down[0].box, MakeBox({8 * p, 0, 0}, {8, kH, kI}));
    EXPECT_EQ(gate[0].strides, (Dims{2 * kI * kH, kH, 1}));
    EXPECT_EQ(gate[0].offset, 0);
    EXPECT_EQ(up[0].offset, kI * kH);
    EXPECT_EQ(up[0].buffer, gate[0].buffer);
    EXPECT_EQ(BufferOf(wide, p, gate[0].buffer)->bytes, 8 * 2 * kI * kH * 2);
    EXPECT_EQ(down[0].strides, (Dims{kH * kI, kI, 1}));
    EXPECT_EQ(BufferOf(wide, p, down[0].buffer)->bytes, 8 * kH * kI * 2);
  }
  // Everything else is what vllm(tp=4) holds in each of the 4 replicas, as with ep=tp.
  EXPECT_EQ(NonExpertPieces(model, wide),
            NonExpertPieces(model, Build(model, "vllm(tp=4,dp=4,ep=4)")));

  // kimi-k2 vllm(tp=8, dp=16, ep=128): process 77 (DP replica 9, TP rank 5) is EP rank 77 and
  // holds experts [231, 234); w13 [3, 2 * 2048, 7168].
  const ModelSpec kimi = Model("kimi-k2");
  const Layout kimi_wide = Build(kimi, "vllm(tp=8,dp=16,ep=128)");
  const std::vector<Piece> kimi_up =
      PiecesOf(kimi_wide, "model.layers.1.mlp.experts.up_proj.weight", 77);
  ASSERT_EQ(kimi_up.size(), 1u);
  EXPECT_EQ(kimi_up[0].box, MakeBox({231, 0, 0}, {3, 2048, 7168}));
  EXPECT_EQ(BufferOf(kimi_wide, 77, kimi_up[0].buffer)->bytes, 3 * 2 * 2048 * 7168 * 2);
  // Without TP (tp=1): process r of dp=4 holds experts [32r, 32r + 32).
  EXPECT_EQ(
      PiecesOf(Build(model, "vllm(dp=4,ep=4)"), "model.layers.0.mlp.experts.down_proj.weight", 3)
          .at(0)
          .box,
      MakeBox({96, 0, 0}, {32, kH, kI}));
}

TEST(NamedLayoutsTest, VllmEpThatDoesNotDivideTheExpertsGivesTheFirstRanksOneMore) {
  // qwen3-moe-tiny (6 experts, moe intermediate 32, hidden 64), vllm(tp=2, dp=2, ep=4): vLLM's
  // linear placement gives EP ranks 0..3 the blocks [0, 2), [2, 4), [4, 5), [5, 6).
  const Layout layout = Build(Model("qwen3-moe-tiny"), "vllm(tp=2,dp=2,ep=4)");
  const int64_t begin[] = {0, 2, 4, 5};
  const int64_t count[] = {2, 2, 1, 1};
  for (int32_t p = 0; p < 4; ++p) {
    SCOPED_TRACE(p);
    const std::vector<Piece> up = PiecesOf(layout, "model.layers.1.mlp.experts.up_proj.weight", p);
    const std::vector<Piece> down =
        PiecesOf(layout, "model.layers.1.mlp.experts.down_proj.weight", p);
    ASSERT_EQ(up.size(), 1u);
    ASSERT_EQ(down.size(), 1u);
    EXPECT_EQ(up[0].box, MakeBox({begin[p], 0, 0}, {count[p], 32, 64}));
    EXPECT_EQ(up[0].offset, 32 * 64);
    EXPECT_EQ(BufferOf(layout, p, up[0].buffer)->bytes, count[p] * 2 * 32 * 64 * 2);
    EXPECT_EQ(down[0].box, MakeBox({begin[p], 0, 0}, {count[p], 64, 32}));
  }
}

TEST(NamedLayoutsTest, VllmPadsTheVocabularyToSixtyFourRows) {
  // 100 rows pad to 128; tp=8 gives 16 rows per rank: rank 6 holds [96, 100), rank 7 none.
  const Layout layout = Build(TinyVocabModel(100), "vllm(tp=8)");
  EXPECT_TRUE(ValidateLayout(layout).ok());
  const std::vector<Piece> rank6 = PiecesOf(layout, "model.embed_tokens.weight", 6);
  ASSERT_EQ(rank6.size(), 1u);
  EXPECT_EQ(rank6[0].box, MakeBox({96, 0}, {4, 8}));
  EXPECT_EQ(BufferOf(layout, 6, rank6[0].buffer)->bytes, 16 * 8 * 2);
  EXPECT_TRUE(PiecesOf(layout, "model.embed_tokens.weight", 7).empty());
  EXPECT_EQ(BuffersOf(layout, 7), 2);
  EXPECT_EQ(BufferOf(layout, 7, 0)->bytes, 16 * 8 * 2);
  EXPECT_EQ(PiecesOf(layout, "model.embed_tokens.weight", 2).at(0).box, MakeBox({32, 0}, {16, 8}));
}

TEST(NamedLayoutsTest, NodesAndMemoryFollowOptions) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  const Layout defaults = Build(model, "vllm(tp=2,dp=5)");
  EXPECT_EQ(defaults.processes[7].node_id, "rollout-node0");
  EXPECT_EQ(defaults.processes[9].node_id, "rollout-node1");
  EXPECT_EQ(defaults.buffers[0].kind, MemoryKind::kHost);
  NamedLayoutOptions options;
  options.procs_per_node = 4;
  options.node_prefix = "gpu";
  options.memory = MemoryKind::kCuda;
  const Layout custom = Build(model, "fsdp(6)", options);
  EXPECT_EQ(custom.processes[3].node_id, "gpu0");
  EXPECT_EQ(custom.processes[4].node_id, "gpu1");
  EXPECT_EQ(custom.buffers[0].kind, MemoryKind::kCuda);
  EXPECT_EQ(Build(model, "megatron(dp=2)").processes[1].node_id, "trainer-node0");
}

TEST(NamedLayoutsTest, KimiLayoutsBuildQuickly) {
  const ModelSpec model = Model("kimi-k2");
  for (const std::string spec :
       {"megatron(pp=16,ep=16)", "vllm(tp=8,ep=8,dp=16)", "vllm(tp=8,dp=16,ep=128)"}) {
    const auto start = std::chrono::steady_clock::now();
    const absl::StatusOr<Layout> layout = BuildNamedLayout(model, spec);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::cout << spec << ": " << layout->processes.size() << " processes, " << layout->pieces.size()
              << " pieces in " << seconds << " s\n";
    // Generous against slow build types; a quadratic builder takes minutes here.
    EXPECT_LT(seconds, 5.0) << spec;
  }
}

void ExpectRefused(const ModelSpec& model, const std::string& spec, const std::string& message,
                   const NamedLayoutOptions& options = {}) {
  const absl::StatusOr<Layout> layout = BuildNamedLayout(model, spec, options);
  ASSERT_FALSE(layout.ok()) << spec;
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << spec;
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr(message)) << spec;
}

TEST(NamedLayoutsTest, ParserRefusals) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  ExpectRefused(model, "", "unknown layout kind \"\"");
  ExpectRefused(model, "deepspeed(tp=2)", "unknown layout kind \"deepspeed\"");
  ExpectRefused(model, "megatron(tp=2", "expected ')' at the end");
  ExpectRefused(model, "megatron(tp=2)x", "expected ')' at the end");
  ExpectRefused(model, "megatron(tp=(2))", "unexpected parenthesis");
  ExpectRefused(model, "megatron(tq=2)",
                "unknown key \"tq\" for megatron; expected tp, pp, ep, dp");
  ExpectRefused(model, "vllm(pp=2)", "unknown key \"pp\" for vllm; expected tp, ep, dp");
  ExpectRefused(model, "fsdp(m=2)", "unknown key \"m\" for fsdp; expected n");
  ExpectRefused(model, "megatron(tp=0)", "tp must be a positive integer, got \"0\"");
  ExpectRefused(model, "megatron(pp=-2)", "pp must be a positive integer, got \"-2\"");
  ExpectRefused(model, "vllm(tp=two)", "tp must be a positive integer, got \"two\"");
  ExpectRefused(model, "vllm(tp=)", "tp must be a positive integer, got \"\"");
  ExpectRefused(model, "fsdp(0)", "n must be a positive integer, got \"0\"");
  ExpectRefused(model, "megatron(tp=2,tp=2)", "key \"tp\" given twice");
  ExpectRefused(model, "fsdp(4,n=4)", "key \"n\" given twice");
  ExpectRefused(model, "megatron(2)", "argument \"2\" needs the form key=value");
  ExpectRefused(model, "fsdp(4,5)", "argument \"5\" needs the form key=value");
  ExpectRefused(model, "megatron(tp=2,)", "empty argument");
  ExpectRefused(model, "vllm(dp=2000000)", "dp=2000000 exceeds 1048576");
  ExpectRefused(model, "vllm(tp=1024,dp=2048)", "2097152 processes exceed 1048576");
  NamedLayoutOptions options;
  options.procs_per_node = 0;
  ExpectRefused(model, "fsdp(2)", "procs_per_node must be positive", options);
}

TEST(NamedLayoutsTest, SpacesAndOmittedKeysAreAccepted) {
  const ModelSpec model = Model("qwen2.5-0.5b");
  EXPECT_EQ(Build(model, " megatron ( tp = 2 , dp=3 ) ").processes.size(), 6u);
  EXPECT_EQ(Build(model, "vllm()").processes.size(), 1u);
  EXPECT_EQ(Build(model, "fsdp(n=5)").processes.size(), 5u);
  // Megatron's dp defaults to ep.
  EXPECT_EQ(Build(Model("qwen3-30b-a3b"), "megatron(ep=4)").processes.size(), 4u);
}

TEST(NamedLayoutsTest, UndividableConfigsAreRefused) {
  const ModelSpec qwen = Model("qwen2.5-0.5b");
  ExpectRefused(qwen, "megatron(tp=4)",
                "megatron: tp=4 does not divide the 14 heads of "
                "model.layers.0.self_attn.q_proj.weight");
  ExpectRefused(qwen, "megatron(tp=7)",
                "megatron: tp=7 does not divide the 2 heads of "
                "model.layers.0.self_attn.k_proj.weight");
  ExpectRefused(qwen, "megatron(pp=25)", "megatron: pp=25 exceeds the 24 layers of qwen2.5-0.5b");
  ExpectRefused(qwen, "megatron(ep=2)",
                "megatron: ep=2 needs routed experts; qwen2.5-0.5b has none");
  ExpectRefused(qwen, "vllm(tp=2,ep=2)", "vllm: ep=2 needs routed experts");
  ExpectRefused(qwen, "vllm(tp=7)",
                "vllm: tp=7 does not divide the padded vocabulary (151936 rows) of "
                "model.embed_tokens.weight");
  ExpectRefused(qwen, "vllm(tp=16)",
                "vllm: tp=16 exceeds the 14 heads of model.layers.0.self_attn.q_proj.weight");

  const ModelSpec qwen3 = Model("qwen3-30b-a3b");
  ExpectRefused(qwen3, "megatron(ep=4,dp=2)", "megatron: ep=4 does not divide dp=2");
  ExpectRefused(qwen3, "megatron(ep=3)", "megatron: ep=3 does not divide the 128 experts");
  ExpectRefused(qwen3, "megatron(tp=8)", "megatron: tp=8 does not divide the 4 heads");
  ExpectRefused(qwen3, "vllm(tp=4,ep=2)",
                "vllm: ep=2 must be 1, tp=4 (per replica) or tp*dp=4 (wide)");
  ExpectRefused(qwen3, "vllm(tp=4,dp=2,ep=2)",
                "vllm: ep=2 must be 1, tp=4 (per replica) or tp*dp=8 (wide)");
  ExpectRefused(qwen3, "vllm(tp=4,dp=2,ep=16)",
                "vllm: ep=16 must be 1, tp=4 (per replica) or tp*dp=8 (wide)");
  ExpectRefused(Model("qwen2-moe-tiny"), "vllm(tp=4,dp=2,ep=8)",
                "vllm: ep=8 exceeds the 4 experts of qwen2-moe-tiny");
  ExpectRefused(qwen, "vllm(tp=2,dp=2,ep=4)", "vllm: ep=4 needs routed experts");

  // 12 q heads and 3 kv heads of 4 rows: tp=4 divides the q rows but not the kv heads.
  const ModelSpec gqa = TinyAttentionModel(12, 3);
  ExpectRefused(gqa, "vllm(tp=4)", "vllm: tp=4 and the 3 kv heads of k do not divide one another");
  ExpectRefused(gqa, "vllm(tp=2)", "vllm: tp=2 and the 3 kv heads of k do not divide one another");
  EXPECT_TRUE(BuildNamedLayout(gqa, "vllm(tp=3)").ok());
  EXPECT_TRUE(BuildNamedLayout(gqa, "vllm(tp=6)").ok());
  ExpectRefused(gqa, "megatron(tp=6)", "megatron: tp=6 does not divide the 3 heads of k");

  ExpectRefused(TinyVocabModel(100), "vllm(tp=3)",
                "vllm: tp=3 does not divide the padded vocabulary (128 rows) of "
                "model.embed_tokens.weight");
  ModelSpec bad_layer = TinyVocabModel(128);
  bad_layer.tensors[1].layer = 1;
  ExpectRefused(bad_layer, "megatron",
                "model tiny: tensor model.layers.0.input_layernorm.weight of layer 1 and shape "
                "(8) (bf16) does not fit its role");
  ModelSpec bad_rank = TinyVocabModel(128);
  bad_rank.tensors[1].role = ShardRole::kRow;
  ExpectRefused(bad_rank, "vllm", "does not fit its role");
  ModelSpec headless = TinyAttentionModel(4, 2);
  headless.tensors[1].heads = 3;
  ExpectRefused(headless, "fsdp(2)", "model tiny-attention: qkv part k has 3 heads for 8 rows");

  ModelSpec column = TinyVocabModel(128);
  column.tensors[1].role = ShardRole::kColumn;
  ExpectRefused(column, "megatron(tp=16)",
                "megatron: tp=16 does not divide axis 0 (8) of "
                "model.layers.0.input_layernorm.weight");
  ExpectRefused(column, "vllm(tp=16)", "vllm: tp=16 does not divide axis 0 (8)");
}

}  // namespace
}  // namespace wsync
