"""Model families at test size, their parameters under the frameworks' own names, and the
test's own shard oracle (written apart from wsync.layouts: where a local element must come from).

Names and sharding, read from the frameworks' source:
- Hugging Face transformers (trainer side, FSDP2 / DTensor): models/{llama,qwen2,qwen3,qwen2_moe,
  qwen3_moe,deepseek_v3}/modeling_*.py (Qwen3MoeSparseMoeBlock at 00d4b3d2: gate, an
  nn.ModuleList of experts); per-expert mlp.experts.<k>.{gate,up,down}_proj,
  Qwen2-MoE's mlp.shared_expert + mlp.shared_expert_gate, DeepSeek-V3's mlp.shared_experts,
  mlp.gate.e_score_correction_bias (fp32), MLA q_a_proj / q_a_layernorm / q_b_proj /
  kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj, Qwen3's self_attn.q_norm / k_norm.
- vLLM (vllm-project/vllm, vllm/model_executor/models/deepseek_v2.py at 002d6073 and
  qwen2_moe.py / qwen3_moe.py / qwen3.py / llama.py; layers/fused_moe/layer.py
  determine_expert_map): qkv_proj = [q heads | k heads | v heads] of the TP rank,
  gate_up_proj = [gate | up], FusedMoE w13_weight [E_local, 2I/tp, H] = [w1 gate | w3 up],
  w2_weight [E_local, H, I/tp]; under EP (tp * dp ranks) whole experts, EP rank r holding
  E // ep experts plus one when r < E % ep, starting at r * (E // ep) + min(r, E % ep); MLA's
  fused_qkv_a_proj (ReplicatedLinear-like, disable_tp) = [q_a_proj | kv_a_proj_with_mqa];
  VocabParallelEmbedding padded to a multiple of 64; vision-language models under
  ``language_model.`` (Qwen2.5-VL's language_model.model.layers...).
- SGLang (sgl-project/sglang, python/sglang/srt/models/deepseek_v2.py): the same, except MLA's
  fused_qkv_a_proj_with_mqa, and EP experts split evenly (E % ep_size == 0 is required).
"""

import math

import torch

BASE = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, layers=2, vocab=200,
            tied=False, qkv_bias=False, qk_norm=False, experts=0, moe_intermediate=0,
            shared="", shared_intermediate=0, first_dense=0, router_bias=False, mla=False)

FAMILIES = {
    "llama3": dict(BASE),
    "qwen2.5": dict(BASE, hidden=128, intermediate=320, head_dim=32, vocab=1000, tied=True,
                    qkv_bias=True),
    "qwen3": dict(BASE, qk_norm=True),
    "qwen3-moe": dict(BASE, qk_norm=True, experts=6, moe_intermediate=32),
    "qwen2-moe": dict(BASE, qkv_bias=True, experts=4, moe_intermediate=32,
                      shared="shared_expert", shared_intermediate=64),
    "deepseek-v3": dict(BASE, layers=3, mla=True, q_lora=24, kv_lora=16, qk_nope=8, qk_rope=8,
                        v_head=8, experts=8, moe_intermediate=16, shared="shared_experts",
                        shared_intermediate=16, first_dense=1, router_bias=True),
    # Kimi-K2 is DeepSeek-V3's architecture; an expert count ep = 4 does not divide.
    "kimi-k2": dict(BASE, layers=2, mla=True, q_lora=24, kv_lora=16, qk_nope=8, qk_rope=8,
                    v_head=8, experts=6, moe_intermediate=16, shared="shared_experts",
                    shared_intermediate=16, first_dense=1, router_bias=True),
}


def config_of(f):
    """wsync.layouts.ModelConfig of a family (imported here: the oracle itself does not use it)."""
    from wsync.layouts import ModelConfig
    return ModelConfig(f["heads"], f["kv_heads"], f["head_dim"], f["vocab"], f["experts"],
                       f.get("q_lora", 0), f.get("kv_lora", 0), f.get("qk_rope", 0))


def _is_moe(f, layer):
    return f["experts"] > 0 and layer >= f["first_dense"]


# The C++ embedded models of the same structure and sizes (planner/models.cc).
CPP_MODELS = {"llama3": "llama-3-tiny", "qwen2.5": "qwen2.5-tiny", "qwen3": "qwen3-tiny",
              "qwen3-moe": "qwen3-moe-tiny", "qwen2-moe": "qwen2-moe-tiny",
              "deepseek-v3": "deepseek-v3-tiny", "kimi-k2": "kimi-k2-tiny"}


def logical_shapes(f, fp=torch.float32):
    """{logical name: (shape, dtype)}: HF names, routed experts stacked [E, ...] per layer; `fp`
    for all but DeepSeek's e_score_correction_bias (fp32)."""
    h, d = f["hidden"], f["head_dim"]
    out = {"model.embed_tokens.weight": ((f["vocab"], h), fp)}
    for i in range(f["layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ((h,), fp)
        if f["mla"]:
            qk = f["qk_nope"] + f["qk_rope"]
            out[p + "self_attn.q_a_proj.weight"] = ((f["q_lora"], h), fp)
            out[p + "self_attn.q_a_layernorm.weight"] = ((f["q_lora"],), fp)
            out[p + "self_attn.q_b_proj.weight"] = ((f["heads"] * qk, f["q_lora"]), fp)
            out[p + "self_attn.kv_a_proj_with_mqa.weight"] = ((f["kv_lora"] + f["qk_rope"], h), fp)
            out[p + "self_attn.kv_a_layernorm.weight"] = ((f["kv_lora"],), fp)
            out[p + "self_attn.kv_b_proj.weight"] = (
                (f["heads"] * (f["qk_nope"] + f["v_head"]), f["kv_lora"]), fp)
            out[p + "self_attn.o_proj.weight"] = ((h, f["heads"] * f["v_head"]), fp)
        else:
            for part, heads in (("q", f["heads"]), ("k", f["kv_heads"]), ("v", f["kv_heads"])):
                out[p + f"self_attn.{part}_proj.weight"] = ((heads * d, h), fp)
                if f["qkv_bias"]:
                    out[p + f"self_attn.{part}_proj.bias"] = ((heads * d,), fp)
            out[p + "self_attn.o_proj.weight"] = ((h, f["heads"] * d), fp)
            if f["qk_norm"]:
                out[p + "self_attn.q_norm.weight"] = ((d,), fp)
                out[p + "self_attn.k_norm.weight"] = ((d,), fp)
        out[p + "post_attention_layernorm.weight"] = ((h,), fp)
        if _is_moe(f, i):
            e, inter = f["experts"], f["moe_intermediate"]
            out[p + "mlp.gate.weight"] = ((e, h), fp)
            if f["router_bias"]:
                out[p + "mlp.gate.e_score_correction_bias"] = ((e,), torch.float32)
            out[p + "mlp.experts.gate_proj.weight"] = ((e, inter, h), fp)
            out[p + "mlp.experts.up_proj.weight"] = ((e, inter, h), fp)
            out[p + "mlp.experts.down_proj.weight"] = ((e, h, inter), fp)
            if f["shared"]:
                s, si = p + "mlp." + f["shared"] + ".", f["shared_intermediate"]
                out[s + "gate_proj.weight"] = ((si, h), fp)
                out[s + "up_proj.weight"] = ((si, h), fp)
                out[s + "down_proj.weight"] = ((h, si), fp)
                if f["shared"] == "shared_expert":
                    out[p + "mlp.shared_expert_gate.weight"] = ((1, h), fp)
        else:
            out[p + "mlp.gate_proj.weight"] = ((f["intermediate"], h), fp)
            out[p + "mlp.up_proj.weight"] = ((f["intermediate"], h), fp)
            out[p + "mlp.down_proj.weight"] = ((h, f["intermediate"]), fp)
    out["model.norm.weight"] = ((h,), fp)
    if not f["tied"]:
        out["lm_head.weight"] = ((f["vocab"], h), fp)
    return out


def random_logical(f, seed, fp=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(s, generator=g) / math.sqrt(s[-1])).to(dt)
            for n, (s, dt) in logical_shapes(f, fp).items()}


# -- trainer side: Hugging Face names, FSDP2 Shard(0) ----------------------------------------------

def hf_tensors(logical, f):
    """{HF module-tree name: tensor}: per-expert matrices unstacked."""
    out = {}
    for name, t in logical.items():
        if ".mlp.experts." in name:
            prefix, proj = name.split(".mlp.experts.")
            for k in range(t.shape[0]):
                out[f"{prefix}.mlp.experts.{k}.{proj}"] = t[k].clone()
        else:
            out[name] = t.clone()
    return out


class Shard:
    """Stand-in for torch.distributed.tensor.Shard (torch 1.13 has no DTensor)."""

    def __init__(self, dim):
        self.dim = dim

    def is_shard(self):
        return True

    def is_partial(self):
        return False

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Mesh1D:
    """Stand-in for a 1-D DeviceMesh seen from `rank`."""

    def __init__(self, rank, size):
        self.rank, self._size = rank, size

    def get_coordinate(self):
        return [self.rank]

    def size(self, mesh_dim=0):
        return self._size


class Replicate:
    """Stand-in for torch.distributed.tensor.Replicate."""

    def is_shard(self):
        return False

    def is_partial(self):
        return False


class MeshND:
    """Stand-in for an N-D DeviceMesh seen from the rank at `coordinate`."""

    def __init__(self, coordinate, sizes):
        self.coordinate, self.sizes = list(coordinate), list(sizes)

    def get_coordinate(self):
        return self.coordinate

    def size(self, mesh_dim=0):
        return self.sizes[mesh_dim]


class StandInDTensor:
    """What fsdp2_layout reads of a DTensor: the global shape, placements, mesh, local shard."""

    def __init__(self, local, shape, placements, mesh):
        self._local, self.shape, self.placements, self.device_mesh = local, shape, placements, mesh

    def to_local(self):
        return self._local

    def detach(self):
        return self


def fsdp2_shards(tensors, rank, world, replicas=1):
    """[(name, DTensor stand-in)] of FSDP2's fully_shard: torch.chunk(world) on dim 0, an empty
    shard for ranks past the last chunk; each local shard its own contiguous tensor. replicas > 1:
    HSDP, mesh (replicas, world) with placements (Replicate(), Shard(0)), `rank` the global rank
    (replica-major)."""
    out = []
    replica, shard = divmod(rank, world)
    for name, t in tensors.items():
        chunks = list(torch.chunk(t, world, dim=0))
        local = chunks[shard].clone() if shard < len(chunks) else t[:0].clone()
        if replicas == 1:
            placements, mesh = (Shard(0),), Mesh1D(shard, world)
        else:
            placements, mesh = (Replicate(), Shard(0)), MeshND((replica, shard), (replicas, world))
        out.append((name, StandInDTensor(local, tuple(t.shape), placements, mesh)))
    return out


# -- rollout side: vLLM / SGLang module names and local tensors ----------------------------------

def experts_of(f, ep, ep_rank, engine):
    """Global expert ids of an EP rank, as the engine places them."""
    e = f["experts"]
    if ep == 1:
        return list(range(e))
    if engine == "sglang":
        assert e % ep == 0, "SGLang requires ep to divide the experts"
        return list(range(ep_rank * e // ep, (ep_rank + 1) * e // ep))
    sizes = [e // ep + (1 if r < e % ep else 0) for r in range(ep)]
    start = sum(sizes[:ep_rank])
    return list(range(start, start + sizes[ep_rank]))


def _rows(t, tp, r):
    n = t.shape[0] // tp
    return t[r * n:(r + 1) * n]


def _cols(t, tp, r):
    n = t.shape[-1] // tp
    return t[..., r * n:(r + 1) * n]


def rollout_tensors(logical, f, tp, tp_rank, ep=1, ep_rank=0, engine="vllm", prefix="",
                    pad_value=0.0):
    """{engine module name: local tensor} of one rollout rank (ep > 1: whole experts)."""
    L, d, out = logical, f["head_dim"], {}
    padded = -(-f["vocab"] // 64) * 64
    for head in ("model.embed_tokens.weight", "lm_head.weight"):
        if head in L:
            full = torch.full((padded, f["hidden"]), pad_value, dtype=L[head].dtype)
            full[:f["vocab"]] = L[head]
            out[head] = _rows(full, tp, tp_rank).clone()
    for i in range(f["layers"]):
        p = f"model.layers.{i}."
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + n] = L[p + n].clone()
        a = p + "self_attn."
        if f["mla"]:
            fused = "fused_qkv_a_proj" if engine == "vllm" else "fused_qkv_a_proj_with_mqa"
            out[a + fused + ".weight"] = torch.cat([L[a + "q_a_proj.weight"],
                                                    L[a + "kv_a_proj_with_mqa.weight"]])
            for n in ("q_a_layernorm.weight", "kv_a_layernorm.weight"):
                out[a + n] = L[a + n].clone()
            for n in ("q_b_proj.weight", "kv_b_proj.weight"):
                out[a + n] = _rows(L[a + n], tp, tp_rank).clone()
        else:
            kv = f["kv_heads"]
            kv_local, kv_first = max(1, kv // tp), tp_rank * kv // tp
            for kind in ("weight", "bias") if f["qkv_bias"] else ("weight",):
                k = L[a + f"k_proj.{kind}"][kv_first * d:(kv_first + kv_local) * d]
                v = L[a + f"v_proj.{kind}"][kv_first * d:(kv_first + kv_local) * d]
                out[a + f"qkv_proj.{kind}"] = torch.cat(
                    [_rows(L[a + f"q_proj.{kind}"], tp, tp_rank), k, v])
            for n in ("q_norm.weight", "k_norm.weight"):
                if a + n in L:
                    out[a + n] = L[a + n].clone()
        out[a + "o_proj.weight"] = _cols(L[a + "o_proj.weight"], tp, tp_rank).clone()
        m = p + "mlp."
        if _is_moe(f, i):
            out[m + "gate.weight"] = L[m + "gate.weight"].clone()
            if f["router_bias"]:
                out[m + "gate.e_score_correction_bias"] = L[m + "gate.e_score_correction_bias"]
            ids = experts_of(f, ep, ep_rank, engine)
            split_tp, split_r = (1, 0) if ep > 1 else (tp, tp_rank)
            gate, up = (L[m + f"experts.{x}_proj.weight"][ids] for x in ("gate", "up"))
            out[m + "experts.w13_weight"] = torch.cat(
                [_rows(gate.transpose(0, 1), split_tp, split_r).transpose(0, 1),
                 _rows(up.transpose(0, 1), split_tp, split_r).transpose(0, 1)], dim=1)
            out[m + "experts.w2_weight"] = _cols(L[m + "experts.down_proj.weight"][ids],
                                                 split_tp, split_r).clone()
            if f["shared"]:
                _dense(out, L, m + f["shared"] + ".", tp, tp_rank)
                if f["shared"] == "shared_expert":
                    out[m + "shared_expert_gate.weight"] = L[m + "shared_expert_gate.weight"]
        else:
            _dense(out, L, m, tp, tp_rank)
    out["model.norm.weight"] = L["model.norm.weight"].clone()
    return {prefix + n: t.clone().contiguous() for n, t in out.items()}


def _dense(out, L, m, tp, r):
    out[m + "gate_up_proj.weight"] = torch.cat([_rows(L[m + "gate_proj.weight"], tp, r),
                                               _rows(L[m + "up_proj.weight"], tp, r)])
    out[m + "down_proj.weight"] = _cols(L[m + "down_proj.weight"], tp, r).clone()


def module_tree(tensors):
    """A torch module tree whose named_parameters() are exactly `tensors` (dotted names)."""
    root = torch.nn.Module()
    for name, t in tensors.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, torch.nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    return root


# -- trainer side: Megatron-core names (TP, PP, EP) ----------------------------------------------
# megatron/core: GPTModel (embedding.word_embeddings, decoder.layers.<i> numbered from 0 on each
# pipeline stage, decoder.final_layernorm, output_layer), TE's fused layer norms
# (self_attention.linear_qkv.layer_norm_weight, mlp.linear_fc1.layer_norm_weight), linear_qkv
# interleaved per query group [q heads of the group | k | v], qk_layernorm's q_layernorm /
# k_layernorm, MoE layers (pre_mlp_layernorm, mlp.router.weight, TEGroupedMLP
# mlp.experts.linear_fc1.weight<k> = [gate | up] of local expert k, linear_fc2.weight<k>);
# EP rank e holds experts [e * E / ep, (e + 1) * E / ep), whole (expert TP 1); TopKRouter's
# expert_bias is an fp32 buffer (megatron/core/transformer/moe/router.py at 005742ff); MLA as in
# transformer/multi_latent_attention.py at 003b4ce2 (linear_q_down_proj / linear_kv_down_proj
# duplicated or column-parallel, linear_q_up_proj / linear_kv_up_proj with TE-fused norms).

def megatron_stage_layers(f, pp, stage):
    per = f["layers"] // pp
    return list(range(stage * per, (stage + 1) * per))


def megatron_tensors(logical, f, tp, tp_rank, pp=1, stage=0, ep=1, ep_rank=0, down_split=False):
    """{Megatron-core module name: local tensor} of one trainer rank; down_split: MLA's down
    projections column-parallel (ColumnParallelLinear) instead of duplicated (TELinear)."""
    L, d, h, out = logical, f["head_dim"], f["hidden"], {}
    padded = -(-f["vocab"] // (128 * tp)) * 128 * tp
    if stage == 0:
        full = torch.zeros(padded, h, dtype=L["model.embed_tokens.weight"].dtype)
        full[:f["vocab"]] = L["model.embed_tokens.weight"]
        out["embedding.word_embeddings.weight"] = _rows(full, tp, tp_rank)
    for local, i in enumerate(megatron_stage_layers(f, pp, stage)):
        p, m = f"model.layers.{i}.", f"decoder.layers.{local}."
        if f["mla"]:
            _megatron_mla(out, L, p, m, tp, tp_rank, down_split)
        else:
            _megatron_qkv(out, L, f, p, m, tp, tp_rank)
        out[m + "self_attention.linear_proj.weight"] = _cols(L[p + "self_attn.o_proj.weight"],
                                                             tp, tp_rank)
        if _is_moe(f, i):
            out[m + "pre_mlp_layernorm.weight"] = L[p + "post_attention_layernorm.weight"]
            out[m + "mlp.router.weight"] = L[p + "mlp.gate.weight"]
            if f["router_bias"]:  # A buffer of TopKRouter: the trainer passes named_buffers too.
                out[m + "mlp.router.expert_bias"] = L[p + "mlp.gate.e_score_correction_bias"]
            if f["shared"]:  # Megatron's SharedExpertMLP; Qwen2-MoE's gate is its gate_weight.
                s = p + "mlp." + f["shared"] + "."
                out[m + "mlp.shared_experts.linear_fc1.weight"] = torch.cat(
                    [_rows(L[s + "gate_proj.weight"], tp, tp_rank),
                     _rows(L[s + "up_proj.weight"], tp, tp_rank)])
                out[m + "mlp.shared_experts.linear_fc2.weight"] = _cols(L[s + "down_proj.weight"],
                                                                        tp, tp_rank)
                if f["shared"] == "shared_expert":
                    gate = L[p + "mlp.shared_expert_gate.weight"]
                    out[m + "mlp.shared_experts.gate_weight"] = gate
            n = f["experts"] // ep
            etp, er = (1, 0) if ep > 1 else (tp, tp_rank)
            for k in range(n):
                e = ep_rank * n + k
                gate, up = (L[p + f"mlp.experts.{x}_proj.weight"][e] for x in ("gate", "up"))
                out[m + f"mlp.experts.linear_fc1.weight{k}"] = torch.cat(
                    [_rows(gate, etp, er), _rows(up, etp, er)])
                out[m + f"mlp.experts.linear_fc2.weight{k}"] = _cols(
                    L[p + "mlp.experts.down_proj.weight"][e], etp, er)
        else:
            out[m + "mlp.linear_fc1.layer_norm_weight"] = L[p + "post_attention_layernorm.weight"]
            out[m + "mlp.linear_fc1.weight"] = torch.cat([_rows(L[p + "mlp.gate_proj.weight"],
                                                                tp, tp_rank),
                                                          _rows(L[p + "mlp.up_proj.weight"], tp,
                                                                tp_rank)])
            out[m + "mlp.linear_fc2.weight"] = _cols(L[p + "mlp.down_proj.weight"], tp, tp_rank)
    if stage == pp - 1:
        out["decoder.final_layernorm.weight"] = L["model.norm.weight"]
    # Tied embeddings: the last stage keeps a copy of the embedding as output_layer under PP.
    head = "model.embed_tokens.weight" if f["tied"] else "lm_head.weight"
    if stage == pp - 1 and (not f["tied"] or pp > 1):
        full = torch.zeros(padded, h, dtype=L[head].dtype)
        full[:f["vocab"]] = L[head]
        out["output_layer.weight"] = _rows(full, tp, tp_rank)
    return {n: t.clone().contiguous() for n, t in out.items()}


def _megatron_qkv(out, L, f, p, m, tp, tp_rank):
    d, per, groups = f["head_dim"], f["heads"] // f["kv_heads"], f["kv_heads"] // tp
    for kind in ("weight", "bias") if f["qkv_bias"] else ("weight",):
        q, k, v = (L[p + f"self_attn.{x}_proj.{kind}"] for x in "qkv")
        parts = []
        for g in range(tp_rank * groups, (tp_rank + 1) * groups):
            parts += [q[g * per * d:(g + 1) * per * d], k[g * d:(g + 1) * d],
                      v[g * d:(g + 1) * d]]
        out[m + f"self_attention.linear_qkv.{kind}"] = torch.cat(parts)
    out[m + "self_attention.linear_qkv.layer_norm_weight"] = L[p + "input_layernorm.weight"]
    if f["qk_norm"]:
        out[m + "self_attention.q_layernorm.weight"] = L[p + "self_attn.q_norm.weight"]
        out[m + "self_attention.k_layernorm.weight"] = L[p + "self_attn.k_norm.weight"]


def _megatron_mla(out, L, p, m, tp, tp_rank, down_split):
    a, s = p + "self_attn.", m + "self_attention."
    out[m + "input_layernorm.weight"] = L[p + "input_layernorm.weight"]
    for mine, theirs in (("linear_q_down_proj", "q_a_proj"),
                         ("linear_kv_down_proj", "kv_a_proj_with_mqa")):
        w = L[a + theirs + ".weight"]
        out[s + mine + ".weight"] = _rows(w, tp, tp_rank) if down_split else w
    for mine, theirs, norm in (("linear_q_up_proj", "q_b_proj", "q_a_layernorm"),
                               ("linear_kv_up_proj", "kv_b_proj", "kv_a_layernorm")):
        out[s + mine + ".weight"] = _rows(L[a + theirs + ".weight"], tp, tp_rank)
        out[s + mine + ".layer_norm_weight"] = L[a + norm + ".weight"]
