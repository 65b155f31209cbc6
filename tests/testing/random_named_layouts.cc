#include "tests/testing/random_named_layouts.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/named_layouts.h"

namespace wsync::test {
namespace {

// The shape of a small MoE model; head_dim is 2.
struct TinyMoe {
  int64_t hidden = 4;
  int64_t q_heads = 2;
  int64_t kv_heads = 1;
  int64_t experts = 4;
  int64_t moe_inner = 2;
  int64_t dense_inner = 4;
  int64_t vocab = 20;
  int32_t layers = 1;
  int32_t first_dense = 0;  // Layers [0, first_dense) have a dense MLP instead of experts.
  bool shared_experts = false;
  bool router_bias = false;
  bool tied = false;
};

constexpr int64_t kHeadDim = 2;
constexpr int64_t kExpertCounts[] = {4, 8, 12, 16, 24};

// gate | up fused along axis 0, and down, with `inner` features.
void AddGatedMlp(ModelSpec& model, const std::string& prefix, int64_t hidden, int64_t inner,
                 int32_t layer) {
  const std::string fused = absl::StrCat(prefix, "gate_up_proj.weight");
  model.AddFusedTensor(absl::StrCat(prefix, "gate_proj.weight"), {inner, hidden},
                       ShardRole::kColumn, layer, FuseKind::kGateUp, fused, 0);
  model.AddFusedTensor(absl::StrCat(prefix, "up_proj.weight"), {inner, hidden}, ShardRole::kColumn,
                       layer, FuseKind::kGateUp, fused, 1);
  model.AddTensor(absl::StrCat(prefix, "down_proj.weight"), {hidden, inner}, ShardRole::kRow,
                  layer);
}

ModelSpec BuildTinyMoe(const TinyMoe& c) {
  ModelSpec model;
  model.name = absl::StrCat("tiny-moe(hidden=", c.hidden, ",heads=", c.q_heads, "/", c.kv_heads,
                            ",experts=", c.experts, "x", c.moe_inner, ",layers=", c.layers,
                            ",dense=", c.first_dense, ",vocab=", c.vocab,
                            c.shared_experts ? ",shared" : "", c.tied ? ",tied" : "", ")");
  model.num_layers = c.layers;
  model.vocab = c.vocab;
  model.tied_embeddings = c.tied;
  model.AddTensor("model.embed_tokens.weight", {c.vocab, c.hidden}, ShardRole::kVocab, -1);
  for (int32_t layer = 0; layer < c.layers; ++layer) {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    model.AddTensor(p + "input_layernorm.weight", {c.hidden}, ShardRole::kReplicated, layer);
    const std::string qkv = p + "self_attn.qkv_proj.weight";
    const int64_t heads[] = {c.q_heads, c.kv_heads, c.kv_heads};
    const char* names[] = {"q_proj", "k_proj", "v_proj"};
    for (int32_t i = 0; i < 3; ++i) {
      model
          .AddFusedTensor(absl::StrCat(p, "self_attn.", names[i], ".weight"),
                          {heads[i] * kHeadDim, c.hidden}, ShardRole::kColumn, layer,
                          FuseKind::kQkv, qkv, i)
          .heads = heads[i];
    }
    model.AddTensor(p + "self_attn.o_proj.weight", {c.hidden, c.q_heads * kHeadDim},
                    ShardRole::kRow, layer);
    model.AddTensor(p + "post_attention_layernorm.weight", {c.hidden}, ShardRole::kReplicated,
                    layer);
    if (layer < c.first_dense) {
      AddGatedMlp(model, p + "mlp.", c.hidden, c.dense_inner, layer);
      continue;
    }
    model.AddTensor(p + "mlp.gate.weight", {c.experts, c.hidden}, ShardRole::kReplicated, layer);
    if (c.router_bias) {
      model
          .AddTensor(p + "mlp.gate.e_score_correction_bias", {c.experts}, ShardRole::kReplicated,
                     layer)
          .dtype = DType::kFloat32;
    }
    const std::string w13 = p + "mlp.experts.w13_weight";
    model.AddFusedTensor(p + "mlp.experts.gate_proj.weight", {c.experts, c.moe_inner, c.hidden},
                         ShardRole::kExpertColumn, layer, FuseKind::kExpertW13, w13, 0);
    model.AddFusedTensor(p + "mlp.experts.up_proj.weight", {c.experts, c.moe_inner, c.hidden},
                         ShardRole::kExpertColumn, layer, FuseKind::kExpertW13, w13, 1);
    model.AddTensor(p + "mlp.experts.down_proj.weight", {c.experts, c.hidden, c.moe_inner},
                    ShardRole::kExpertRow, layer);
    if (c.shared_experts)
      AddGatedMlp(model, p + "mlp.shared_experts.", c.hidden, c.moe_inner, layer);
  }
  model.AddTensor("model.norm.weight", {c.hidden}, ShardRole::kReplicated, -2);
  if (!c.tied) model.AddTensor("lm_head.weight", {c.vocab, c.hidden}, ShardRole::kVocab, -2);
  return model;
}

TinyMoe RandomTinyMoe(std::mt19937_64& rng) {
  TinyMoe c;
  c.hidden = 4 * UniformInt(rng, 1, 2);
  c.q_heads = 2 * UniformInt(rng, 1, 2);
  c.kv_heads = UniformInt(rng, 1, 2);
  c.experts = kExpertCounts[UniformInt(rng, 0, std::size(kExpertCounts) - 1)];
  c.moe_inner = 2 * UniformInt(rng, 1, 2);
  c.dense_inner = 4 * UniformInt(rng, 1, 2);
  c.vocab = UniformInt(rng, 20, 70);
  c.layers = static_cast<int32_t>(UniformInt(rng, 1, 3));
  c.first_dense = static_cast<int32_t>(UniformInt(rng, 0, c.layers - 1));
  c.shared_experts = Chance(rng, 0.5);
  c.router_bias = Chance(rng, 0.5);
  c.tied = Chance(rng, 0.5);
  return c;
}

constexpr int64_t kMaxSideProcesses = 16;

std::string RandomTrainerSpec(std::mt19937_64& rng, int32_t layers) {
  if (Chance(rng, 0.25)) return absl::StrCat("fsdp(", UniformInt(rng, 1, 6), ")");
  const int64_t tp = UniformInt(rng, 1, 2);
  const int64_t pp = UniformInt(rng, 1, layers);
  const int64_t ep = int64_t{1} << UniformInt(rng, 0, 2);
  const int64_t dp = ep * UniformInt(rng, 1, 2);
  return absl::StrCat("megatron(tp=", tp, ",pp=", pp, ",ep=", ep, ",dp=", dp, ")");
}

// Draws tp, dp and ep (wide with probability 3/5, else tp or 1) into `pair`; returns the spec.
std::string RandomRolloutSpec(std::mt19937_64& rng, NamedLayoutPair& pair) {
  pair.rollout_tp = static_cast<int32_t>(int64_t{1} << UniformInt(rng, 0, 2));
  pair.rollout_dp = static_cast<int32_t>(UniformInt(rng, 1, 4));
  const int64_t pick = UniformInt(rng, 0, 4);
  pair.rollout_ep =
      pick < 3 ? pair.rollout_tp * pair.rollout_dp : (pick == 3 ? pair.rollout_tp : 1);
  return absl::StrCat("vllm(tp=", pair.rollout_tp, ",dp=", pair.rollout_dp, ",ep=", pair.rollout_ep,
                      ")");
}

NamedLayoutOptions RandomPlacement(std::mt19937_64& rng, bool shared_nodes) {
  NamedLayoutOptions options;
  options.procs_per_node = static_cast<int32_t>(UniformInt(rng, 1, 8));
  if (shared_nodes) options.node_prefix = "node";
  return options;
}

}  // namespace

std::string NamedLayoutPair::Describe() const {
  return absl::StrCat("model ", model.name, ": ", from, " -> ", to);
}

absl::StatusOr<NamedLayoutPair> RandomNamedLayoutPair(std::mt19937_64& rng) {
  constexpr int kModelTries = 16;
  constexpr int kSpecTries = 64;
  for (int m = 0; m < kModelTries; ++m) {
    NamedLayoutPair named;
    named.model = BuildTinyMoe(RandomTinyMoe(rng));
    const bool shared_nodes = Chance(rng, 0.3);
    bool built = false;
    for (int s = 0; s < kSpecTries && !built; ++s) {
      named.from = RandomTrainerSpec(rng, named.model.num_layers);
      absl::StatusOr<Layout> source =
          BuildNamedLayout(named.model, named.from, RandomPlacement(rng, shared_nodes));
      if (!source.ok() || source->processes.size() > kMaxSideProcesses) continue;
      named.pair.source = *std::move(source);
      built = true;
    }
    if (!built) continue;
    built = false;
    for (int s = 0; s < kSpecTries && !built; ++s) {
      named.to = RandomRolloutSpec(rng, named);
      absl::StatusOr<Layout> target =
          BuildNamedLayout(named.model, named.to, RandomPlacement(rng, shared_nodes));
      if (!target.ok() || target->processes.size() > kMaxSideProcesses) continue;
      named.pair.target = *std::move(target);
      built = true;
    }
    if (built) return named;
  }
  return absl::InternalError("no random named layout pair builds");
}

}  // namespace wsync::test
