"""Layouts from torch tensors: which box of which logical parameter each local tensor holds.

A *piece* says "this buffer holds this box of this parameter". Here the buffer is a tensor's
storage, and the piece's offset and strides (in elements) are the view's ``storage_offset()`` and
``stride()``; nothing is copied, so a sync writes the model's own parameters in place.

Logical parameters carry Hugging Face names (``model.layers.0.self_attn.q_proj.weight``...).
A :class:`Rule` maps a local parameter name (a regular expression, matched in full) to the
logical parameters it holds and how:

==================  =========================================================================
kind                the local tensor holds
==================  =========================================================================
``replicated``      the whole parameter
``column``          rows ``[r*n, (r+1)*n)`` (axis 0 split over TP)
``row``             columns ``[r*n, (r+1)*n)`` (axis 1 split over TP; a 1-D tensor: whole)
``vocab``           vocabulary rows of a padded vocabulary split over TP; padding rows are not
                    part of the parameter (``vocab_size`` in the config)
``packed``          several column shards back to back on axis 0 (vLLM ``gate_up_proj``,
                    Megatron ``linear_fc1``): equal parts, one per target
``qkv``             vLLM ``qkv_proj``: local q heads, then k, then v heads (GQA; kv heads
                    replicated when fewer than TP)
``megatron_qkv``    Megatron ``linear_qkv``: per local query group, its q heads, then k, then v
``mla_qkv_a``       vLLM ``fused_qkv_a_proj`` / SGLang ``fused_qkv_a_proj_with_mqa``: q_a_proj
                    (``q_lora_rank`` rows) then kv_a_proj_with_mqa, both whole (replicated)
``mla_down``        Megatron MLA ``linear_q_down_proj`` / ``linear_kv_down_proj``: whole, or
                    column-split when its rows are a TP shard of the config's
``experts_packed``  fused experts ``w13`` ``[E_local, 2*I/tp, H]``: gate then up on axis 1
``experts_row``     fused experts ``w2`` ``[E_local, H, I/tp]``: split on axis 2
``expert_packed``   one local expert's ``[2*I/tp, H]`` (Megatron ``linear_fc1.weight<k>``; the
                    rule's ``(?P<expert>...)`` group is the local index k)
``expert_row``      one local expert's ``[H, I/tp]`` (Megatron ``linear_fc2.weight<k>``)
==================  =========================================================================

Experts: without expert parallelism every rank holds all E experts, split on the intermediate
axis over TP; with it (``ep_size`` > 1) an EP rank holds whole experts, placed by
:func:`local_experts` (vLLM's linear blocks, the first E % ep ranks one more; round robin;
or SGLang's and Megatron's even blocks). The logical tensor of routed experts is one
``[E, ...]`` tensor per layer and projection (``mlp.experts.gate_proj.weight``...).

Targets are templates expanded with the match (``\\1``, ``\\g<name>``). The rule tables are
in :mod:`wsync.rules` (re-exported here). A new model family is supported by passing extra
rules (tried before the defaults) to :func:`build_layout`, :func:`megatron_layout`,
:func:`vllm_layout` or :func:`sglang_layout`; a name no rule maps fails at layout time, listing
every such name with a rule that would map it. FSDP2 / DTensor trainers: :mod:`wsync.fsdp`.
"""

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

import torch

from ._lib import MemoryKind, Status, WsyncError
from .rules import (HF_RULES, MEGATRON_MLA_RULES, MEGATRON_RULES, SGLANG_RULES,  # noqa: F401
                    VLLM_RULES, Rule, suggest_rule)  # (Re-exported: the tables live in rules.)
from .session import dtype_name


class LayoutError(WsyncError):
    """A layout this module cannot build (an unmapped name, a shape that does not fit a rule)."""

    def __init__(self, message):
        super().__init__(Status.INVALID_ARGUMENT, message, "layout")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The facts the rules need: attention heads, kv heads (query groups), head size, and the
    unpadded vocabulary."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int = 0  # Routed experts (MoE); 0 for a dense model.
    q_lora_rank: int = 0  # MLA (DeepSeek-V3 / Kimi-K2): rows of q_a_proj.
    kv_lora_rank: int = 0  # MLA: kv_a_proj_with_mqa has kv_lora_rank + qk_rope_head_dim rows.
    qk_rope_head_dim: int = 0

    @classmethod
    def from_hf(cls, config):
        """From a Hugging Face config (object or dict); MoE and MLA fields where present
        (``num_experts`` for Qwen MoE, ``n_routed_experts`` for DeepSeek-V3 / Kimi-K2)."""
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else \
            (lambda k, d=None: getattr(config, k, d))
        if get("text_config") is not None:  # Vision-language wrappers: the language model's.
            return cls.from_hf(get("text_config"))
        heads = get("num_attention_heads")
        return cls(heads, get("num_key_value_heads", heads),
                   get("head_dim", None) or get("hidden_size") // heads, get("vocab_size"),
                   get("num_experts", None) or get("n_routed_experts", None) or 0,
                   get("q_lora_rank", None) or 0, get("kv_lora_rank", None) or 0,
                   get("qk_rope_head_dim", None) or 0)


@dataclasses.dataclass
class Piece:
    """`view` (a tensor over its buffer, shaped like the box) holds box [origin, origin+extent)
    of logical parameter `param`."""
    param: str
    origin: Tuple[int, ...]
    view: torch.Tensor

    @property
    def extent(self):
        return tuple(self.view.shape)

    @property
    def offset(self):
        return self.view.storage_offset()

    @property
    def strides(self):
        return tuple(self.view.stride())


@dataclasses.dataclass
class Parameter:
    name: str
    dtype: torch.dtype
    shape: Tuple[int, ...]


@dataclasses.dataclass
class Context:
    tp_rank: int
    tp_size: int
    config: Optional[ModelConfig]
    ep_rank: int = 0
    ep_size: int = 1
    expert_placement: str = "linear"  # See local_experts().


EXPERT_PLACEMENTS = ("linear", "round_robin", "even")


def local_experts(num_experts, ep_rank, ep_size, placement="linear"):
    """The global expert ids EP rank `ep_rank` of `ep_size` holds, in local order.

    ``linear``: vLLM's default (``determine_expert_map`` in
    vllm/model_executor/layers/fused_moe/layer.py): a contiguous block; the first
    ``E % ep`` ranks hold one expert more. ``round_robin``: vLLM's other placement, experts
    ``r, r + ep, ...``. ``even``: a contiguous block of ``E / ep``, refused when ep does not
    divide E (SGLang's FusedMoE asserts that; Megatron-core requires it too)."""
    if placement not in EXPERT_PLACEMENTS:
        raise LayoutError(f"unknown expert placement {placement!r}; expected one of "
                          f"{', '.join(EXPERT_PLACEMENTS)}")
    if not 0 <= ep_rank < ep_size:
        raise LayoutError(f"EP rank {ep_rank} is outside ep={ep_size}")
    if placement == "round_robin":
        return list(range(ep_rank, num_experts, ep_size))
    if placement == "even" and num_experts % ep_size:
        raise LayoutError(f"ep={ep_size} does not divide the {num_experts} experts, and this "
                          "engine splits experts evenly")
    base, extra = divmod(num_experts, ep_size)
    begin = ep_rank * base + min(ep_rank, extra)
    return list(range(begin, begin + base + (1 if ep_rank < extra else 0)))


def _storage(tensor):
    """(address, bytes) of the memory the tensor's storage covers."""
    if hasattr(tensor, "untyped_storage"):  # torch >= 2.0
        storage = tensor.untyped_storage()
    else:
        storage = tensor.storage()
    return storage.data_ptr(), storage.nbytes()


class Layout:
    """Parameters and pieces of one process, and the buffers (tensor storages) they live in."""

    def __init__(self):
        self.params: Dict[str, Parameter] = {}
        self.pieces: List[Piece] = []
        self.fp8 = {}  # FP8 parameter name -> wsync.fp8.Fp8Spec (wsync.fp8.add_fp8).
        # Parameter name -> its wave of a streamed sync (rollouts; absent: wave 0). Pieces of
        # parameters of different waves may share memory (wsync.vllm_loader's staging pool).
        self.waves: Dict[str, int] = {}

    def add(self, param, shape, origin, view, dtype=None):
        """`dtype` (default: the view's) is what the parameter is declared as: "fp8_e4m3" for a
        uint8 view of e4m3 bytes (wsync.fp8.add_fp8)."""
        shape = tuple(int(s) for s in shape)
        origin = tuple(int(o) for o in origin)
        dtype = view.dtype if dtype is None else dtype
        known = self.params.get(param)
        if known is None:
            self.params[param] = Parameter(param, dtype, shape)
        elif known.shape != shape or known.dtype != dtype:
            raise LayoutError(f"parameter {param}: shape {shape} ({dtype}) here, "
                              f"{known.shape} ({known.dtype}) from another tensor")
        if len(origin) != len(shape) or view.dim() != len(shape):
            raise LayoutError(f"parameter {param}: a box of {view.dim()} axes for {len(shape)}")
        for a, (o, e, s) in enumerate(zip(origin, view.shape, shape)):
            if o < 0 or o + e > s:
                raise LayoutError(f"parameter {param}: box origin {origin} extent "
                                  f"{tuple(view.shape)} leaves shape {shape} on axis {a}")
        self.pieces.append(Piece(param, origin, view))

    def buffers(self):
        """[(buffer id, address, bytes, kind, device, a tensor keeping it alive)], one per distinct
        storage, ids 0, 1, ... in first-use order; and {storage address: id}."""
        ids = {}
        rows = []
        for piece in self.pieces:
            address, nbytes = _storage(piece.view)
            if address in ids:
                continue
            ids[address] = len(rows)
            device = piece.view.device
            kind = MemoryKind.CUDA if device.type == "cuda" else MemoryKind.HOST
            rows.append((len(rows), address, nbytes, kind, device.index or 0, piece.view))
        return rows, ids

    def repoint(self, buffer_id, tensor):
        """Re-creates the views of buffer `buffer_id` (numbered as by buffers()) on `tensor`'s
        storage at the same offsets and strides, after that memory moved whole
        (``Session.rebind_buffer``), so the layout no longer holds the old memory. The storage
        must have the buffer's size and the pieces' dtype; LayoutError otherwise, unchanged."""
        rows, _ = self.buffers()
        if not 0 <= buffer_id < len(rows):
            raise LayoutError(f"no buffer {buffer_id}: the layout has {len(rows)}")
        old_address, nbytes = rows[buffer_id][1], rows[buffer_id][2]
        new_address, new_bytes = _storage(tensor)
        if new_bytes != nbytes:
            raise LayoutError(f"buffer {buffer_id} holds {nbytes} bytes; the new storage at "
                              f"{new_address:#x} holds {new_bytes}")
        moved = [i for i, piece in enumerate(self.pieces)
                 if _storage(piece.view)[0] == old_address]
        for i in moved:
            if self.pieces[i].view.dtype != tensor.dtype:
                raise LayoutError(f"piece of {self.pieces[i].param} is "
                                  f"{self.pieces[i].view.dtype}; the new storage is reached "
                                  f"through a {tensor.dtype} tensor")
        storage = (tensor.untyped_storage() if hasattr(tensor, "untyped_storage")
                   else tensor.storage())
        for i in moved:
            piece = self.pieces[i]
            view = tensor.new_empty(0).set_(storage, piece.offset, piece.extent, piece.strides)
            self.pieces[i] = Piece(piece.param, piece.origin, view)

    def register(self, session):
        """Registers the buffers, declares the parameters (FP8 ones with their scale tensors;
        each with its wave, when `waves` gives one other than 0) and the pieces with
        `session`."""
        rows, ids = self.buffers()
        for buffer_id, address, nbytes, kind, device, keep in rows:
            session.register_buffer(buffer_id, address, nbytes, kind, device, keep=keep)
        scales = {spec.scale_name for spec in self.fp8.values()}
        for param in self.params.values():
            if param.name in scales:
                continue  # Declared with its FP8 parameter.
            session.declare_parameter(param.name, dtype_name(param.dtype), param.shape)
            spec = self.fp8.get(param.name)
            if spec is not None:
                session.declare_fp8_parameter(param.name, spec.scheme, spec.scale_name,
                                              spec.scale_shape, spec.block)
            if self.waves.get(param.name, 0):
                session.set_parameter_wave(param.name, self.waves[param.name])
        for piece in self.pieces:
            address, _ = _storage(piece.view)
            session.declare_piece(piece.param, ids[address], piece.origin, piece.extent,
                                  piece.offset, piece.strides)

    def logical_bytes(self):
        return sum(p.view.numel() * p.view.element_size() for p in self.pieces)

    def __repr__(self):
        return f"Layout({len(self.params)} parameters, {len(self.pieces)} pieces)"


# -- rules --------------------------------------------------------------------------------------

def _need_config(ctx, name):
    if ctx.config is None:
        raise LayoutError(f"{name}: this rule needs a ModelConfig (heads, kv heads, head_dim, "
                          "vocab_size)")
    return ctx.config


def expand(rule, match, name, tensor, ctx):
    """[(logical name, logical shape, origin, view)] for one local tensor under `rule`."""
    targets = [match.expand(t) for t in rule.targets]
    kind, r, tp = rule.kind, ctx.tp_rank, ctx.tp_size
    shape = list(tensor.shape)
    out = []
    if kind == "replicated" or (kind == "row" and tensor.dim() < 2):
        return [(targets[0], shape, [0] * len(shape), tensor)]
    if kind in ("column", "row"):
        axis = 0 if kind == "column" else 1
        origin = [0] * len(shape)
        origin[axis] = r * shape[axis]
        logical = list(shape)
        logical[axis] *= tp
        return [(targets[0], logical, origin, tensor)]
    if kind == "vocab":
        config = _need_config(ctx, name)
        rows = shape[0]
        begin = r * rows
        size = max(0, min(config.vocab_size - begin, rows))
        if config.vocab_size > rows * tp:
            raise LayoutError(f"{name}: {tp} x {rows} rows cannot hold a vocabulary of "
                              f"{config.vocab_size}")
        if size == 0:
            return []
        return [(targets[0], [config.vocab_size] + shape[1:], [begin] + [0] * (len(shape) - 1),
                 tensor[:size])]
    if kind == "packed":
        parts = len(targets)
        if shape[0] % parts:
            raise LayoutError(f"{name}: {shape[0]} rows do not split into {parts} parts")
        rows = shape[0] // parts
        for i, target in enumerate(targets):
            out.append((target, [rows * tp] + shape[1:], [r * rows] + [0] * (len(shape) - 1),
                        tensor[i * rows:(i + 1) * rows]))
        return out
    if kind in ("qkv", "megatron_qkv"):
        return _expand_qkv(kind, targets, name, tensor, ctx)
    if kind == "mla_qkv_a":
        c = _need_config(ctx, name)
        sizes = [c.q_lora_rank, c.kv_lora_rank + c.qk_rope_head_dim]
        if len(targets) != 2 or not all(sizes) or shape[0] != sum(sizes):
            raise LayoutError(f"{name}: {shape[0]} rows, want q_lora_rank {sizes[0]} + "
                              f"kv_lora_rank + qk_rope_head_dim {sizes[1]} (two targets)")
        return [(targets[0], [sizes[0]] + shape[1:], [0] * len(shape), tensor[:sizes[0]]),
                (targets[1], [sizes[1]] + shape[1:], [0] * len(shape), tensor[sizes[0]:])]
    if kind == "mla_down":
        c = _need_config(ctx, name)
        full = c.q_lora_rank if "q_a_proj" in targets[0] else c.kv_lora_rank + c.qk_rope_head_dim
        if shape[0] == full:
            return [(targets[0], shape, [0] * len(shape), tensor)]
        if shape[0] * tp != full:
            raise LayoutError(f"{name}: {shape[0]} rows are neither all {full} nor a tp={tp} "
                              "shard of them")
        return [(targets[0], [full] + shape[1:], [r * shape[0]] + [0] * (len(shape) - 1),
                 tensor)]
    if kind in EXPERT_KINDS:
        return _expand_experts(kind, targets, match, name, tensor, ctx)
    raise LayoutError(f"{name}: unknown rule kind {kind!r}")


def _expand_qkv(kind, targets, name, tensor, ctx):
    c = _need_config(ctx, name)
    r, tp, shape, out = ctx.tp_rank, ctx.tp_size, list(tensor.shape), []
    d, heads, kv = c.head_dim, c.num_heads, c.num_kv_heads
    if len(targets) != 3:
        raise LayoutError(f"{name}: a {kind} rule needs three targets (q, k, v)")
    if heads % tp or heads % kv:
        raise LayoutError(f"{name}: {heads} heads, {kv} kv heads do not fit tp={tp}")
    rest = shape[1:]
    zeros = [0] * len(rest)
    q_heads = heads // tp
    if kind == "qkv":
        kv_local = max(1, kv // tp)
        kv_first = (r * kv) // tp
        want = (q_heads + 2 * kv_local) * d
        if shape[0] != want:
            raise LayoutError(f"{name}: {shape[0]} rows, want {want} for {q_heads} q and "
                              f"{kv_local} kv heads of {d}")
        q_rows, kv_rows = q_heads * d, kv_local * d
        out.append((targets[0], [heads * d] + rest, [r * q_rows] + zeros, tensor[:q_rows]))
        out.append((targets[1], [kv * d] + rest, [kv_first * d] + zeros,
                    tensor[q_rows:q_rows + kv_rows]))
        out.append((targets[2], [kv * d] + rest, [kv_first * d] + zeros,
                    tensor[q_rows + kv_rows:q_rows + 2 * kv_rows]))
        return out
    if kv % tp:
        raise LayoutError(f"{name}: Megatron needs tp={tp} to divide {kv} query groups")
    groups = kv // tp
    per_group = heads // kv
    group_rows = (per_group + 2) * d
    if shape[0] != groups * group_rows:
        raise LayoutError(f"{name}: {shape[0]} rows, want {groups} groups of {group_rows}")
    for j in range(groups):
        g = r * groups + j
        base = j * group_rows
        q_rows = per_group * d
        out.append((targets[0], [heads * d] + rest, [g * q_rows] + zeros,
                    tensor[base:base + q_rows]))
        out.append((targets[1], [kv * d] + rest, [g * d] + zeros,
                    tensor[base + q_rows:base + q_rows + d]))
        out.append((targets[2], [kv * d] + rest, [g * d] + zeros,
                    tensor[base + q_rows + d:base + group_rows]))
    return out


EXPERT_KINDS = ("experts_packed", "experts_row", "expert_packed", "expert_row")


def _expert_ids(name, local, ctx):
    """(global expert ids of `local` local experts, logical expert count, TP rank and size of
    the experts' inner split). Under EP (ep_size > 1) experts are whole (no inner split) and
    placed by ctx.expert_placement; else every rank holds all experts, TP-split inside."""
    if ctx.ep_size <= 1:
        total = ctx.config.num_experts if ctx.config and ctx.config.num_experts else local
        if total != local:
            raise LayoutError(f"{name}: {local} experts here, {total} in the ModelConfig, and no "
                              "expert parallelism (ep_size=1)")
        return list(range(local)), total, ctx.tp_rank, ctx.tp_size
    c = _need_config(ctx, name)
    if not c.num_experts:
        raise LayoutError(f"{name}: expert parallelism needs ModelConfig.num_experts")
    ids = local_experts(c.num_experts, ctx.ep_rank, ctx.ep_size, ctx.expert_placement)
    if len(ids) != local:
        raise LayoutError(f"{name}: {local} local experts, but EP rank {ctx.ep_rank} of "
                          f"{ctx.ep_size} holds {len(ids)} of {c.num_experts} "
                          f"({ctx.expert_placement} placement)")
    return ids, c.num_experts, 0, 1


def _runs(ids):
    """[(first local index, first global id, count)] of consecutive global ids."""
    runs = []
    for i, e in enumerate(ids):
        if runs and runs[-1][1] + runs[-1][2] == e:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((i, e, 1))
    return runs


def _expand_experts(kind, targets, match, name, tensor, ctx):
    """Fused experts ``[E_local, ...]`` (``experts_*``: vLLM / SGLang ``w13`` and ``w2``) or one
    local expert's matrix (``expert_*``: Megatron-core's ``linear_fc1.weight<k>``, the local
    expert index the rule's group ``expert``). Packed: gate then up (the targets' order) along the
    intermediate axis; row: the intermediate axis is the last."""
    if kind.startswith("expert_"):
        found = [v for g, v in match.groupdict().items() if g.startswith("expert") and v]
        if not found:
            raise LayoutError(f"{name}: an {kind} rule needs a (?P<expert>...) group")
        k = int(found[0])
        c = _need_config(ctx, name)
        if not c.num_experts:
            raise LayoutError(f"{name}: a per-expert rule needs ModelConfig.num_experts")
        local = c.num_experts if ctx.ep_size <= 1 else len(
            local_experts(c.num_experts, ctx.ep_rank, ctx.ep_size, ctx.expert_placement))
        if k >= local:
            raise LayoutError(f"{name}: local expert {k}, but this rank holds {local}")
        ids, total, r, tp = _expert_ids(name, local, ctx)
        ids, tensor = [ids[k]], tensor.unsqueeze(0)
    else:
        ids, total, r, tp = _expert_ids(name, tensor.shape[0], ctx)
    shape, out = list(tensor.shape), []
    rest = [0] * (len(shape) - 2)
    if kind.endswith("_packed"):
        rows = shape[1] // len(targets)
        if rows * len(targets) != shape[1]:
            raise LayoutError(f"{name}: {shape[1]} rows do not split into {len(targets)} parts")
        logical = [total, rows * tp] + shape[2:]
        parts = [(t, [r * rows] + rest, tensor[:, i * rows:(i + 1) * rows])
                 for i, t in enumerate(targets)]
    else:
        logical = shape[:2] + [shape[2] * tp]
        logical[0] = total
        parts = [(targets[0], [0, r * shape[2]], tensor)]
    for target, inner, view in parts:
        for first, expert, count in _runs(ids):
            out.append((target, logical, [expert] + inner, view[first:first + count]))
    return out


def build_layout(named_tensors, rules, tp_rank=0, tp_size=1, config=None, skip=(), ep_rank=0,
                 ep_size=1, expert_placement="linear"):
    """A Layout from (local name, tensor) pairs under `rules` (first match wins). Names matching a
    pattern in `skip` are left out; if any other name no rule maps, the layout is refused
    (LayoutError) listing every such name with the rule that would map it."""
    ctx = Context(int(tp_rank), int(tp_size), config, int(ep_rank), int(ep_size),
                  expert_placement)
    layout = Layout()
    skip = [re.compile(s) for s in skip]
    unmapped = []
    for name, tensor in named_tensors:
        if any(s.fullmatch(name) for s in skip):
            continue
        tensor = tensor.detach()
        for rule in rules:
            match = rule.match(name)
            if match is not None:
                break
        else:
            unmapped.append(f"  {name} {tuple(tensor.shape)}: e.g. "
                            f"{suggest_rule(name, tensor.dim())}")
            continue
        for param, shape, origin, view in expand(rule, match, name, tensor, ctx):
            layout.add(param, shape, origin, view)
    check_mapped(unmapped, "pass rules=[Rule(pattern, kind, target)] (the kinds are in "
                 "wsync.layouts' docstring), or skip them")
    return layout


def check_mapped(unmapped, advice):
    """Refuses a layout that left names unmapped: every one, with the rule that would map it."""
    if unmapped:
        raise LayoutError(f"no rule maps {len(unmapped)} parameter(s); {advice}:\n" +
                          "\n".join(unmapped))


def _named(model_or_pairs):
    if isinstance(model_or_pairs, torch.nn.Module):
        return list(model_or_pairs.named_parameters())
    if isinstance(model_or_pairs, dict):
        return list(model_or_pairs.items())
    return list(model_or_pairs)


def megatron_ranks(rank, tp, pp=1, ep=1, dp=None):
    """(tp_rank, dp_rank, pp_rank, ep_rank) of global trainer `rank` in Megatron-core's default
    rank order "tp-cp-ep-dp-pp" (megatron/core/parallel_state.py, RankGenerator; cp = 1, expert
    TP = 1): TP fastest, then DP (whose first `ep` ranks form the expert-parallel group), then
    PP. dp defaults to ep."""
    dp = ep if dp is None else dp
    if dp % ep:
        raise LayoutError(f"megatron: ep={ep} does not divide dp={dp}")
    tp_rank, rest = rank % tp, rank // tp
    dp_rank, pp_rank = rest % dp, rest // dp
    return tp_rank, dp_rank, pp_rank, dp_rank % ep


def megatron_layout(model, tp_rank, tp_size, config, rules=(), skip=(), layer_offset=0,
                    ep_rank=0, ep_size=1, tied_embeddings=False, shared_expert="shared_experts"):
    """The layout of a Megatron-core GPT model's TP shard (names as in megatron.core). Under
    pipeline parallelism a stage numbers its layers from 0: `layer_offset` is the global index
    of its first layer. Under expert parallelism (ep_size > 1) the rank holds the contiguous
    block of E / ep_size whole experts of EP rank `ep_rank` (local expert k is global
    ep_rank * E / ep_size + k); without it every rank holds all experts, TP-split. With tied
    embeddings the last stage's output_layer (Megatron keeps a copy there under PP) is the
    embedding. `shared_expert` is the HF module name of Megatron's shared_experts:
    ``shared_experts`` (DeepSeek-V3) or ``shared_expert`` (Qwen2-MoE, whose gate_weight is
    shared_expert_gate)."""
    named = _named(model)
    if layer_offset:
        shift = re.compile(r"((?:module\.)*decoder\.layers\.)(\d+)\.")
        named = [(shift.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + layer_offset}.", n, 1), t)
                 for n, t in named]
    tied = [Rule(r"(?:module\.)*output_layer\.weight", "vocab", "model.embed_tokens.weight")] \
        if tied_embeddings else []
    mla = MEGATRON_MLA_RULES if config is not None and config.kv_lora_rank else []
    shared = [] if shared_expert == "shared_experts" else [
        Rule(x.pattern, x.kind, [t.replace(".shared_experts.", f".{shared_expert}.")
                                 for t in x.targets])
        for x in MEGATRON_RULES if ".shared_experts." in x.targets[0]]
    return build_layout(named, list(rules) + tied + mla + shared + MEGATRON_RULES, tp_rank,
                        tp_size, config, skip, ep_rank, ep_size, "even")


def _w13_rules(w13_order):
    """A w13 rule for the engine's order of gate and up: "gate_up" ([w1 | w3], vLLM's and
    SGLang's FusedMoE) needs none; "up_gate" ([w3 | w1]: vLLM's FlashInfer MoE kernels swap them
    after loading, swap_w13_to_w31 in quantization/utils/flashinfer_utils.py)."""
    if w13_order == "gate_up":
        return []
    if w13_order != "up_gate":
        raise LayoutError(f"w13_order {w13_order!r}: expected 'gate_up' or 'up_gate'")
    return [Rule(r"(.*)\.experts\.w13_weight", "experts_packed",
                 (r"\1.experts.up_proj.weight", r"\1.experts.gate_proj.weight"))]


def vllm_layout(model, tp_rank, tp_size, config, rules=(), skip=(), ep_rank=0, ep_size=1,
                expert_placement="linear", w13_order="gate_up"):
    """The layout of a vLLM worker's model (fused qkv_proj / gate_up_proj / w13, TP shard).
    With ``--enable-expert-parallel`` vLLM sets ep_size = tp * dp and ep_rank = dp_rank * tp +
    tp_rank (FusedMoEParallelConfig.make): pass those; the routed experts are then whole, a
    contiguous block per EP rank (the first E % ep ranks one expert more: vLLM's linear
    placement) or `expert_placement="round_robin"`. `w13_order`: see _w13_rules."""
    return build_layout(_named(model), list(rules) + _w13_rules(w13_order) + VLLM_RULES, tp_rank,
                        tp_size, config, skip, ep_rank, ep_size, expert_placement)


def sglang_layout(model, tp_rank, tp_size, config, rules=(), skip=(), ep_rank=0, ep_size=1,
                  w13_order="gate_up"):
    """The layout of an SGLang worker's model: vLLM's names plus MLA's
    fused_qkv_a_proj_with_mqa; under EP (``--ep-size``) each EP rank holds E / ep experts (SGLang
    refuses an ep that does not divide E, and so does this)."""
    return build_layout(_named(model), list(rules) + _w13_rules(w13_order) + SGLANG_RULES,
                        tp_rank, tp_size, config, skip, ep_rank, ep_size, "even")


def hf_layout(model, rules=(), skip=()):
    """An unsharded model with Hugging Face names: every parameter whole."""
    return build_layout(_named(model), list(rules) + [Rule(r"(.*)", "replicated", r"\1")], 0, 1,
                        None, skip)


# FSDP1 flat shards live with the FSDP2 layouts; re-exported here, where callers found them.
from .fsdp import fsdp_flat_layout  # noqa: E402,F401
