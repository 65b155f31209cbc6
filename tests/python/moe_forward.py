"""A Qwen3-MoE forward pass (RMSNorm, GQA with per-head q_norm / k_norm, RoPE, a softmax router
with top-k renormalised, SwiGLU experts; transformers' Qwen3MoeSparseMoeBlock with
norm_topk_prob), computed two ways for test_moe_end_to_end:

- hf_logits: from whole Hugging Face tensors (every expert local), as a trainer gathers them;
- vllm_ep_logits: from one vLLM rank's module tensors under expert parallelism (tp = 1): fused
  qkv_proj, padded vocabulary, the router and FusedMoE's w13 = [gate | up] / w2 of its own
  experts only; the expert outputs of all EP ranks are summed by `all_reduce`, as vLLM's
  all-reduce EP does.
"""

import math

import torch
import torch.nn.functional as F

from tiny_qwen import rms_norm, rope

EPS, THETA, TOP_K = 1e-6, 10000.0, 2


def _attention(x, q_w, k_w, v_w, o_w, q_norm, k_norm, d):
    b, t, _ = x.shape
    q = rms_norm((x @ q_w.T).view(b, t, -1, d), q_norm, EPS)
    k = rms_norm((x @ k_w.T).view(b, t, -1, d), k_norm, EPS)
    v = (x @ v_w.T).view(b, t, -1, d)
    q, k = rope(q, THETA), rope(k, THETA)
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    causal = torch.full((t, t), float("-inf")).triu(1)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d) + causal
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, -1) @ o_w.T


def _route(x, router):
    probs = (x @ router.T).softmax(-1)
    top_v, top_i = probs.topk(TOP_K, dim=-1)
    return top_v / top_v.sum(-1, keepdim=True), top_i


def _experts(x, top_v, top_i, ids, gate, up, down):
    """Sum over experts `ids` (global ids; gate / up / down indexed locally) of their outputs
    weighted by the router."""
    out = torch.zeros_like(x)
    for j, e in enumerate(ids):
        weight = (top_v * (top_i == e)).sum(-1, keepdim=True)
        out = out + weight * ((F.silu(x @ gate[j].T) * (x @ up[j].T)) @ down[j].T)
    return out


def _forward(tokens, f, w, layer_experts):
    """w(name) -> an HF tensor (all but the routed experts); layer_experts(i, h, top_v, top_i)
    -> the routed experts' output of layer i."""
    x = F.embedding(tokens, w("model.embed_tokens.weight"))
    for i in range(f["layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w(p + "input_layernorm.weight"), EPS)
        x = x + _attention(h, *(w(p + f"self_attn.{n}") for n in (
            "q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
            "q_norm.weight", "k_norm.weight")), f["head_dim"])
        h = rms_norm(x, w(p + "post_attention_layernorm.weight"), EPS)
        top_v, top_i = _route(h, w(p + "mlp.gate.weight"))
        x = x + layer_experts(i, h, top_v, top_i)
    return rms_norm(x, w("model.norm.weight"), EPS) @ w("lm_head.weight").T


def hf_logits(tokens, f, logical):
    """Logits from whole logical tensors (routed experts stacked [E, ...])."""
    def experts(i, h, top_v, top_i):
        p = f"model.layers.{i}.mlp.experts."
        return _experts(h, top_v, top_i, range(f["experts"]), logical[p + "gate_proj.weight"],
                        logical[p + "up_proj.weight"], logical[p + "down_proj.weight"])
    return _forward(tokens, f, logical.__getitem__, experts)


def vllm_ep_logits(tokens, f, local, expert_ids, all_reduce):
    """Logits from one vLLM EP rank's tensors (tp = 1)."""
    d, vocab = f["head_dim"], f["vocab"]
    q_rows, kv_rows = f["heads"] * d, f["kv_heads"] * d

    def w(name):
        p, _, rest = name.partition("self_attn.")
        if rest in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
            qkv = local[p + "self_attn.qkv_proj.weight"]
            begin = {"q": 0, "k": q_rows, "v": q_rows + kv_rows}[rest[0]]
            return qkv[begin:begin + (q_rows if rest[0] == "q" else kv_rows)]
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return local[name][:vocab]  # The padding rows belong to no token.
        return local[name]

    def experts(i, h, top_v, top_i):
        p = f"model.layers.{i}.mlp.experts."
        w13, inter = local[p + "w13_weight"], f["moe_intermediate"]
        out = _experts(h, top_v, top_i, expert_ids, w13[:, :inter], w13[:, inter:],
                       local[p + "w2_weight"])
        return all_reduce(out)
    return _forward(tokens, f, w, experts)
