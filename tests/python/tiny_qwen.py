"""A small model of the qwen2.5 structure (GQA with q/k/v biases, RMSNorm, SwiGLU, RoPE, tied
embeddings) in two tensor-parallel module structures, for the Python end-to-end test:

- MegatronTiny: megatron.core GPT names; linear_qkv interleaved per query group, linear_fc1 =
  [gate shard; up shard], vocabulary padded to a multiple of 128 * tp.
- VllmTiny: vLLM names; qkv_proj = [q heads; k heads; v heads] of the rank, gate_up_proj =
  [gate shard; up shard], vocabulary padded to a multiple of 64.

Both run the same TP math over a torch.distributed (gloo) group, with autograd (Megatron's f / g
operators), so trainers can take real optimizer steps. The shard / unshard functions here are the
test's own independent oracle of the layouts (they do not use wsync.layouts).
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

CONFIG = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, layers=2, vocab=160,
              rope_theta=10000.0, eps=1e-6)


def round_up(n, m):
    return (n + m - 1) // m * m


def hf_shapes(c=CONFIG):
    """Logical (Hugging Face) parameter names and shapes."""
    h, d = c["hidden"], c["head_dim"]
    shapes = {"model.embed_tokens.weight": (c["vocab"], h)}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (c["heads"] * d, h)
        shapes[p + "self_attn.q_proj.bias"] = (c["heads"] * d,)
        shapes[p + "self_attn.k_proj.weight"] = (c["kv_heads"] * d, h)
        shapes[p + "self_attn.k_proj.bias"] = (c["kv_heads"] * d,)
        shapes[p + "self_attn.v_proj.weight"] = (c["kv_heads"] * d, h)
        shapes[p + "self_attn.v_proj.bias"] = (c["kv_heads"] * d,)
        shapes[p + "self_attn.o_proj.weight"] = (h, c["heads"] * d)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (c["intermediate"], h)
        shapes[p + "mlp.up_proj.weight"] = (c["intermediate"], h)
        shapes[p + "mlp.down_proj.weight"] = (h, c["intermediate"])
    shapes["model.norm.weight"] = (h,)
    return shapes


def random_logical(seed, c=CONFIG):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in hf_shapes(c).items():
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
    return out


# -- TP autograd operators -----------------------------------------------------------------------

class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.rank, ctx.size = dist.get_rank(group), dist.get_world_size(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(ctx.size)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=-1)[ctx.rank].contiguous(), None


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    t, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class _TPModel(torch.nn.Module):
    """Common forward; subclasses say where each local tensor lives."""

    def __init__(self, tp_rank, tp, group, vocab_multiple, c=CONFIG):
        super().__init__()
        self.c, self.tp_rank, self.tp, self.group = c, tp_rank, tp, group
        self.vocab_padded = round_up(c["vocab"], vocab_multiple)
        self.vocab_rows = self.vocab_padded // tp
        self.q_heads = c["heads"] // tp
        self.kv_heads = max(1, c["kv_heads"] // tp)

    def forward(self, tokens):
        c, g = self.c, self.group
        emb = self.embedding_weight()
        begin = self.tp_rank * self.vocab_rows
        local = tokens - begin
        mask = (local < 0) | (local >= self.vocab_rows)
        x = F.embedding(local.masked_fill(mask, 0), emb)
        x = x.masked_fill(mask[..., None], 0.0)
        x = _ReduceFromTP.apply(x, g)
        b, t = tokens.shape
        d = c["head_dim"]
        causal = torch.full((t, t), float("-inf")).triu(1)
        for i in range(c["layers"]):
            ln1, (qw, qb, kw, kb, vw, vb), ow, ln2, (gw, uw), dw = self.layer(i)
            h = _CopyToTP.apply(rms_norm(x, ln1, c["eps"]), g)
            q = F.linear(h, qw, qb).view(b, t, -1, d)
            k = F.linear(h, kw, kb).view(b, t, -1, d)
            v = F.linear(h, vw, vb).view(b, t, -1, d)
            q, k = rope(q, c["rope_theta"]), rope(k, c["rope_theta"])
            rep = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d) + causal
            a = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, -1)
            x = x + _ReduceFromTP.apply(F.linear(a, ow), g)
            h = _CopyToTP.apply(rms_norm(x, ln2, c["eps"]), g)
            x = x + _ReduceFromTP.apply(F.linear(F.silu(F.linear(h, gw)) * F.linear(h, uw), dw), g)
        x = _CopyToTP.apply(rms_norm(x, self.final_norm(), c["eps"]), g)
        logits = _GatherFromTP.apply(F.linear(x, emb), g)
        return logits[..., : c["vocab"]]


class MegatronTiny(_TPModel):
    def __init__(self, tp_rank, tp, group, c=CONFIG):
        super().__init__(tp_rank, tp, group, 128 * tp, c)
        h, d, inter = c["hidden"], c["head_dim"], c["intermediate"] // tp
        groups = c["kv_heads"] // tp
        self.group_rows = (c["heads"] // c["kv_heads"] + 2) * d
        P = lambda *s: torch.nn.Parameter(torch.zeros(*s))
        self.embedding = torch.nn.Module()
        self.embedding.word_embeddings = torch.nn.Module()
        self.embedding.word_embeddings.weight = P(self.vocab_rows, h)
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList()
        for _ in range(c["layers"]):
            layer = torch.nn.Module()
            layer.input_layernorm = torch.nn.Module()
            layer.input_layernorm.weight = P(h)
            layer.self_attention = torch.nn.Module()
            layer.self_attention.linear_qkv = torch.nn.Linear(h, groups * self.group_rows)
            layer.self_attention.linear_proj = torch.nn.Linear(self.q_heads * d, h, bias=False)
            layer.pre_mlp_layernorm = torch.nn.Module()
            layer.pre_mlp_layernorm.weight = P(h)
            layer.mlp = torch.nn.Module()
            layer.mlp.linear_fc1 = torch.nn.Linear(h, 2 * inter, bias=False)
            layer.mlp.linear_fc2 = torch.nn.Linear(inter, h, bias=False)
            self.decoder.layers.append(layer)
        self.decoder.final_layernorm = torch.nn.Module()
        self.decoder.final_layernorm.weight = P(h)

    def embedding_weight(self):
        return self.embedding.word_embeddings.weight

    def layer(self, i):
        L = self.decoder.layers[i]
        d = self.c["head_dim"]
        per = self.c["heads"] // self.c["kv_heads"]
        w, b = L.self_attention.linear_qkv.weight, L.self_attention.linear_qkv.bias
        gw = w.view(-1, self.group_rows, w.shape[-1])
        gb = b.view(-1, self.group_rows)
        q_rows = per * d
        qw, kw, vw = (gw[:, :q_rows].reshape(-1, w.shape[-1]), gw[:, q_rows:q_rows + d].reshape(
            -1, w.shape[-1]), gw[:, q_rows + d:].reshape(-1, w.shape[-1]))
        qb, kb, vb = gb[:, :q_rows].reshape(-1), gb[:, q_rows:q_rows + d].reshape(-1), \
            gb[:, q_rows + d:].reshape(-1)
        fc1 = L.mlp.linear_fc1.weight
        half = fc1.shape[0] // 2
        return (L.input_layernorm.weight, (qw, qb, kw, kb, vw, vb),
                L.self_attention.linear_proj.weight, L.pre_mlp_layernorm.weight,
                (fc1[:half], fc1[half:]), L.mlp.linear_fc2.weight)

    def final_norm(self):
        return self.decoder.final_layernorm.weight


class VllmTiny(_TPModel):
    def __init__(self, tp_rank, tp, group, c=CONFIG):
        super().__init__(tp_rank, tp, group, 64, c)
        h, d, inter = c["hidden"], c["head_dim"], c["intermediate"] // tp
        P = lambda *s: torch.nn.Parameter(torch.zeros(*s), requires_grad=False)
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Module()
        self.model.embed_tokens.weight = P(self.vocab_rows, h)
        self.model.layers = torch.nn.ModuleList()
        qkv_rows = (self.q_heads + 2 * self.kv_heads) * d
        for _ in range(c["layers"]):
            layer = torch.nn.Module()
            layer.input_layernorm = torch.nn.Module()
            layer.input_layernorm.weight = P(h)
            layer.self_attn = torch.nn.Module()
            layer.self_attn.qkv_proj = torch.nn.Module()
            layer.self_attn.qkv_proj.weight = P(qkv_rows, h)
            layer.self_attn.qkv_proj.bias = P(qkv_rows)
            layer.self_attn.o_proj = torch.nn.Module()
            layer.self_attn.o_proj.weight = P(h, self.q_heads * d)
            layer.post_attention_layernorm = torch.nn.Module()
            layer.post_attention_layernorm.weight = P(h)
            layer.mlp = torch.nn.Module()
            layer.mlp.gate_up_proj = torch.nn.Module()
            layer.mlp.gate_up_proj.weight = P(2 * inter, h)
            layer.mlp.down_proj = torch.nn.Module()
            layer.mlp.down_proj.weight = P(h, inter)
            self.model.layers.append(layer)
        self.model.norm = torch.nn.Module()
        self.model.norm.weight = P(h)
        self.lm_head = self.model.embed_tokens  # Tied, as vLLM does for qwen2.5.

    def embedding_weight(self):
        return self.model.embed_tokens.weight

    def layer(self, i):
        L = self.model.layers[i]
        d = self.c["head_dim"]
        q, kv = self.q_heads * d, self.kv_heads * d
        w, b = L.self_attn.qkv_proj.weight, L.self_attn.qkv_proj.bias
        gu = L.mlp.gate_up_proj.weight
        half = gu.shape[0] // 2
        return (L.input_layernorm.weight,
                (w[:q], b[:q], w[q:q + kv], b[q:q + kv], w[q + kv:], b[q + kv:]),
                L.self_attn.o_proj.weight, L.post_attention_layernorm.weight,
                (gu[:half], gu[half:]), L.mlp.down_proj.weight)

    def final_norm(self):
        return self.model.norm.weight


# -- the oracle: shard and unshard without wsync ---------------------------------------------------

def _rows(t, rank, tp):
    n = t.shape[0] // tp
    return t[rank * n:(rank + 1) * n]


def _cols(t, rank, tp):
    n = t.shape[1] // tp
    return t[:, rank * n:(rank + 1) * n]


def _padded(t, rows_total):
    out = torch.zeros((rows_total,) + tuple(t.shape[1:]))
    out[: t.shape[0]] = t
    return out


def megatron_shard(logical, rank, tp, c=CONFIG):
    d, kv, per = c["head_dim"], c["kv_heads"], c["heads"] // c["kv_heads"]
    out = {"embedding.word_embeddings.weight":
           _rows(_padded(logical["model.embed_tokens.weight"], round_up(c["vocab"], 128 * tp)),
                 rank, tp)}
    for i in range(c["layers"]):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            q = logical[p + f"self_attn.q_proj.{kind}"]
            k = logical[p + f"self_attn.k_proj.{kind}"]
            v = logical[p + f"self_attn.v_proj.{kind}"]
            parts = []
            for g in range(rank * kv // tp, (rank + 1) * kv // tp):
                parts += [q[g * per * d:(g + 1) * per * d], k[g * d:(g + 1) * d],
                          v[g * d:(g + 1) * d]]
            out[m + f"self_attention.linear_qkv.{kind}"] = torch.cat(parts)
        out[m + "input_layernorm.weight"] = logical[p + "input_layernorm.weight"]
        out[m + "self_attention.linear_proj.weight"] = _cols(logical[p + "self_attn.o_proj.weight"],
                                                             rank, tp)
        out[m + "pre_mlp_layernorm.weight"] = logical[p + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            [_rows(logical[p + "mlp.gate_proj.weight"], rank, tp),
             _rows(logical[p + "mlp.up_proj.weight"], rank, tp)])
        out[m + "mlp.linear_fc2.weight"] = _cols(logical[p + "mlp.down_proj.weight"], rank, tp)
    out["decoder.final_layernorm.weight"] = logical["model.norm.weight"]
    return out


def megatron_unshard(ranks, c=CONFIG):
    """Logical tensors from every TP rank's local state dict (a list, rank order)."""
    tp, d, kv, per = len(ranks), c["head_dim"], c["kv_heads"], c["heads"] // c["kv_heads"]
    out = {"model.embed_tokens.weight":
           torch.cat([r["embedding.word_embeddings.weight"] for r in ranks])[: c["vocab"]]}
    gr = (per + 2) * d
    for i in range(c["layers"]):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            q, k, v = [], [], []
            for r in ranks:
                t = r[m + f"self_attention.linear_qkv.{kind}"]
                for j in range(t.shape[0] // gr):
                    grp = t[j * gr:(j + 1) * gr]
                    q.append(grp[: per * d])
                    k.append(grp[per * d: per * d + d])
                    v.append(grp[per * d + d:])
            out[p + f"self_attn.q_proj.{kind}"] = torch.cat(q)
            out[p + f"self_attn.k_proj.{kind}"] = torch.cat(k)
            out[p + f"self_attn.v_proj.{kind}"] = torch.cat(v)
        out[p + "input_layernorm.weight"] = ranks[0][m + "input_layernorm.weight"]
        out[p + "self_attn.o_proj.weight"] = torch.cat(
            [r[m + "self_attention.linear_proj.weight"] for r in ranks], dim=1)
        out[p + "post_attention_layernorm.weight"] = ranks[0][m + "pre_mlp_layernorm.weight"]
        fc1 = [r[m + "mlp.linear_fc1.weight"] for r in ranks]
        out[p + "mlp.gate_proj.weight"] = torch.cat([f[: f.shape[0] // 2] for f in fc1])
        out[p + "mlp.up_proj.weight"] = torch.cat([f[f.shape[0] // 2:] for f in fc1])
        out[p + "mlp.down_proj.weight"] = torch.cat([r[m + "mlp.linear_fc2.weight"] for r in ranks],
                                                    dim=1)
    out["model.norm.weight"] = ranks[0]["decoder.final_layernorm.weight"]
    return out


def vllm_shard(logical, rank, tp, c=CONFIG, pad_value=0.0):
    d, kv = c["head_dim"], c["kv_heads"]
    kv_local = max(1, kv // tp)
    kv_first = rank * kv // tp
    emb = _padded(logical["model.embed_tokens.weight"], round_up(c["vocab"], 64))
    emb[c["vocab"]:] = pad_value
    out = {"model.embed_tokens.weight": _rows(emb, rank, tp)}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            q = _rows(logical[p + f"self_attn.q_proj.{kind}"], rank, tp)
            k = logical[p + f"self_attn.k_proj.{kind}"][kv_first * d:(kv_first + kv_local) * d]
            v = logical[p + f"self_attn.v_proj.{kind}"][kv_first * d:(kv_first + kv_local) * d]
            out[p + f"self_attn.qkv_proj.{kind}"] = torch.cat([q, k, v])
        out[p + "input_layernorm.weight"] = logical[p + "input_layernorm.weight"]
        out[p + "self_attn.o_proj.weight"] = _cols(logical[p + "self_attn.o_proj.weight"], rank, tp)
        out[p + "post_attention_layernorm.weight"] = logical[p + "post_attention_layernorm.weight"]
        out[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [_rows(logical[p + "mlp.gate_proj.weight"], rank, tp),
             _rows(logical[p + "mlp.up_proj.weight"], rank, tp)])
        out[p + "mlp.down_proj.weight"] = _cols(logical[p + "mlp.down_proj.weight"], rank, tp)
    out["model.norm.weight"] = logical["model.norm.weight"]
    return out


def vllm_unshard(ranks, c=CONFIG):
    tp, d, kv = len(ranks), c["head_dim"], c["kv_heads"]
    q_rows = c["heads"] // tp * d
    kv_rows = max(1, kv // tp) * d
    out = {"model.embed_tokens.weight":
           torch.cat([r["model.embed_tokens.weight"] for r in ranks])[: c["vocab"]]}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [r[p + f"self_attn.qkv_proj.{kind}"] for r in ranks]
            out[p + f"self_attn.q_proj.{kind}"] = torch.cat([t[:q_rows] for t in qkv])
            out[p + f"self_attn.k_proj.{kind}"] = torch.cat(
                [t[q_rows:q_rows + kv_rows] for t in qkv])  # kv >= tp here: no replicas.
            out[p + f"self_attn.v_proj.{kind}"] = torch.cat([t[q_rows + kv_rows:] for t in qkv])
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + name] = ranks[0][p + name]
        out[p + "self_attn.o_proj.weight"] = torch.cat([r[p + "self_attn.o_proj.weight"]
                                                        for r in ranks], dim=1)
        gu = [r[p + "mlp.gate_up_proj.weight"] for r in ranks]
        out[p + "mlp.gate_proj.weight"] = torch.cat([t[: t.shape[0] // 2] for t in gu])
        out[p + "mlp.up_proj.weight"] = torch.cat([t[t.shape[0] // 2:] for t in gu])
        out[p + "mlp.down_proj.weight"] = torch.cat([r[p + "mlp.down_proj.weight"] for r in ranks],
                                                    dim=1)
    out["model.norm.weight"] = ranks[0]["model.norm.weight"]
    return out


def load_local(model, state):
    """Copies a local state dict into the model's parameters in place (no new storage)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def gather_local(model, group):
    """Every TP rank's local state dict (detached copies), by all_gather over `group`."""
    size = dist.get_world_size(group)
    out = [dict() for _ in range(size)]
    for name, p in model.named_parameters():
        parts = [torch.empty_like(p) for _ in range(size)]
        dist.all_gather(parts, p.detach().contiguous(), group=group)
        for r in range(size):
            out[r][name] = parts[r]
    return out
