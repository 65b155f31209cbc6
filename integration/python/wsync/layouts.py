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
``experts_packed``  fused experts ``w13`` ``[E, 2*I/tp, H]``: gate then up, split on axis 1
``experts_row``     fused experts ``w2`` ``[E, H, I/tp]``: split on axis 2
==================  =========================================================================

Targets are templates expanded with the match (``\\1``, ``\\g<name>``). A new model family is
supported by passing extra rules (tried before the defaults) to :func:`build_layout`,
:func:`megatron_layout` or :func:`vllm_layout`.
"""

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ._lib import MemoryKind, Status, WsyncError
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

    @classmethod
    def from_hf(cls, config):
        """From a Hugging Face config (object or dict)."""
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else \
            (lambda k, d=None: getattr(config, k, d))
        heads = get("num_attention_heads")
        return cls(heads, get("num_key_value_heads", heads),
                   get("head_dim", None) or get("hidden_size") // heads, get("vocab_size"))


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

    def add(self, param, shape, origin, view):
        shape = tuple(int(s) for s in shape)
        origin = tuple(int(o) for o in origin)
        known = self.params.get(param)
        if known is None:
            self.params[param] = Parameter(param, view.dtype, shape)
        elif known.shape != shape or known.dtype != view.dtype:
            raise LayoutError(f"parameter {param}: shape {shape} ({view.dtype}) here, "
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

    def register(self, session):
        """Registers the buffers, declares the parameters and the pieces with `session`."""
        rows, ids = self.buffers()
        for buffer_id, address, nbytes, kind, device, keep in rows:
            session.register_buffer(buffer_id, address, nbytes, kind, device, keep=keep)
        for param in self.params.values():
            session.declare_parameter(param.name, dtype_name(param.dtype), param.shape)
        for piece in self.pieces:
            address, _ = _storage(piece.view)
            session.declare_piece(piece.param, ids[address], piece.origin, piece.extent,
                                  piece.offset, piece.strides)

    def logical_bytes(self):
        return sum(p.view.numel() * p.view.element_size() for p in self.pieces)

    def __repr__(self):
        return f"Layout({len(self.params)} parameters, {len(self.pieces)} pieces)"


# -- rules --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Rule:
    pattern: str
    kind: str
    targets: Sequence[str]  # One template, or one per part (packed, qkv: q, k, v).

    def __post_init__(self):
        if isinstance(self.targets, str):
            self.targets = (self.targets,)
        self._regex = re.compile(self.pattern)

    def match(self, name):
        return self._regex.fullmatch(name)


def _split(local, tp_rank, axis):
    shape = list(local.shape)
    origin = [0] * len(shape)
    origin[axis] = tp_rank * shape[axis]
    logical = list(shape)
    return origin, logical


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
        c = _need_config(ctx, name)
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
    if kind == "experts_packed":
        parts = len(targets)
        rows = shape[1] // parts
        for i, target in enumerate(targets):
            out.append((target, [shape[0], rows * tp] + shape[2:], [0, r * rows] + [0] * (len(shape) - 2),
                        tensor[:, i * rows:(i + 1) * rows]))
        return out
    if kind == "experts_row":
        return [(targets[0], shape[:2] + [shape[2] * tp], [0, 0, r * shape[2]], tensor)]
    raise LayoutError(f"{name}: unknown rule kind {kind!r}")


_L = r"(?:module\.)*"  # DDP / wrapper prefixes.

MEGATRON_RULES = [
    Rule(_L + r"embedding\.word_embeddings\.weight", "vocab", "model.embed_tokens.weight"),
    Rule(_L + r"decoder\.layers\.(\d+)\.self_attention\.linear_qkv\.(weight|bias)", "megatron_qkv",
         (r"model.layers.\1.self_attn.q_proj.\2", r"model.layers.\1.self_attn.k_proj.\2",
          r"model.layers.\1.self_attn.v_proj.\2")),
    Rule(_L + r"decoder\.layers\.(\d+)\.(?:self_attention\.linear_qkv\.layer_norm_weight|"
         r"input_layernorm\.weight)", "replicated", r"model.layers.\1.input_layernorm.weight"),
    Rule(_L + r"decoder\.layers\.(\d+)\.self_attention\.linear_proj\.weight", "row",
         r"model.layers.\1.self_attn.o_proj.weight"),
    Rule(_L + r"decoder\.layers\.(\d+)\.(?:mlp\.linear_fc1\.layer_norm_weight|"
         r"pre_mlp_layernorm\.weight)", "replicated",
         r"model.layers.\1.post_attention_layernorm.weight"),
    Rule(_L + r"decoder\.layers\.(\d+)\.mlp\.linear_fc1\.weight", "packed",
         (r"model.layers.\1.mlp.gate_proj.weight", r"model.layers.\1.mlp.up_proj.weight")),
    Rule(_L + r"decoder\.layers\.(\d+)\.mlp\.linear_fc2\.weight", "row",
         r"model.layers.\1.mlp.down_proj.weight"),
    Rule(_L + r"decoder\.final_layernorm\.weight", "replicated", "model.norm.weight"),
    Rule(_L + r"output_layer\.weight", "vocab", "lm_head.weight"),
]

VLLM_RULES = [
    Rule(r"(.*)\.self_attn\.qkv_proj\.(weight|bias)", "qkv",
         (r"\1.self_attn.q_proj.\2", r"\1.self_attn.k_proj.\2", r"\1.self_attn.v_proj.\2")),
    Rule(r"(.*)\.gate_up_proj\.weight", "packed", (r"\1.gate_proj.weight", r"\1.up_proj.weight")),
    Rule(r"(.*)\.experts\.w13_weight", "experts_packed",
         (r"\1.experts.gate_proj.weight", r"\1.experts.up_proj.weight")),
    Rule(r"(.*)\.experts\.w2_weight", "experts_row", r"\1.experts.down_proj.weight"),
    Rule(r"(.*\.(?:o_proj|down_proj)\.weight)", "row", r"\1"),
    Rule(r"(.*\.(?:q_proj|k_proj|v_proj|gate_proj|up_proj)\.(?:weight|bias))", "column", r"\1"),
    Rule(r"((?:model\.)?embed_tokens\.weight|lm_head\.weight|model\.embed_tokens\.weight)",
         "vocab", r"\1"),
    Rule(r"(.*(?:norm|layernorm)\.weight|.*\.(?:o_proj|down_proj)\.bias)", "replicated", r"\1"),
]

# SGLang uses vLLM's module structure and names.
SGLANG_RULES = VLLM_RULES


def build_layout(named_tensors, rules, tp_rank=0, tp_size=1, config=None, skip=()):
    """A Layout from (local name, tensor) pairs under `rules` (first match wins). Names matching a
    pattern in `skip` are left out; any other name no rule maps is refused (LayoutError)."""
    ctx = Context(int(tp_rank), int(tp_size), config)
    layout = Layout()
    skip = [re.compile(s) for s in skip]
    for name, tensor in named_tensors:
        if any(s.fullmatch(name) for s in skip):
            continue
        tensor = tensor.detach()
        for rule in rules:
            match = rule.match(name)
            if match is not None:
                break
        else:
            raise LayoutError(f"no rule maps parameter {name} {tuple(tensor.shape)}; pass a Rule "
                              "for it (rules=[Rule(pattern, kind, target)])")
        for param, shape, origin, view in expand(rule, match, name, tensor, ctx):
            layout.add(param, shape, origin, view)
    return layout


def _named(model_or_pairs):
    if isinstance(model_or_pairs, torch.nn.Module):
        return list(model_or_pairs.named_parameters())
    if isinstance(model_or_pairs, dict):
        return list(model_or_pairs.items())
    return list(model_or_pairs)


def megatron_layout(model, tp_rank, tp_size, config, rules=(), skip=(), layer_offset=0):
    """The layout of a Megatron-core GPT model's TP shard (names as in megatron.core). Under
    pipeline parallelism a stage numbers its layers from 0: `layer_offset` is the global index
    of its first layer."""
    named = _named(model)
    if layer_offset:
        shift = re.compile(r"((?:module\.)*decoder\.layers\.)(\d+)\.")
        named = [(shift.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + layer_offset}.", n, 1), t)
                 for n, t in named]
    return build_layout(named, list(rules) + MEGATRON_RULES, tp_rank, tp_size, config, skip)


def vllm_layout(model, tp_rank, tp_size, config, rules=(), skip=()):
    """The layout of a vLLM worker's model (fused qkv_proj / gate_up_proj / w13, TP shard)."""
    return build_layout(_named(model), list(rules) + VLLM_RULES, tp_rank, tp_size, config, skip)


def hf_layout(model, rules=(), skip=()):
    """An unsharded model with Hugging Face names: every parameter whole."""
    return build_layout(_named(model), list(rules) + [Rule(r"(.*)", "replicated", r"\1")], 0, 1,
                        None, skip)


def fsdp_flat_layout(flat, named_shapes, begin):
    """An FSDP flat shard: `flat` (1-D) holds elements [begin, begin + flat.numel()) of the
    concatenation of the row-major flattened parameters named_shapes = [(name, shape)]. Each
    parameter's part becomes up to three boxes (a partial first row, whole rows, a partial last
    row) over 2-D [rows, last-axis] views; parameters must be at least 1-D."""
    layout = Layout()
    end = begin + flat.numel()
    start = 0
    for name, shape in named_shapes:
        shape = tuple(int(s) for s in shape)
        numel = 1
        for s in shape:
            numel *= s
        lo, hi = max(start, begin), min(start + numel, end)
        if lo < hi:
            _flat_boxes(layout, name, shape, lo - start, hi - start, flat, lo - begin)
        start += numel
    return layout


def _flat_boxes(layout, name, shape, lo, hi, flat, at):
    """Boxes of row-major flat range [lo, hi) of a parameter, stored from flat[at]."""
    last = shape[-1]
    rows_shape = shape[:-1]
    inner = 1
    for s in rows_shape[1:]:
        inner *= s

    def unravel(row):
        index = []
        for s in reversed(rows_shape):
            index.append(row % s)
            row //= s
        return list(reversed(index))

    def add_rows(row_lo, row_hi, col_lo, col_hi, pos):
        # Rows [row_lo, row_hi) of the flattened leading axes, columns [col_lo, col_hi): a box
        # only when the rows stay inside one index of every axis but the first two; split else.
        while row_lo < row_hi:
            index = unravel(row_lo)
            # Rows that vary only on the innermost leading axis form one box.
            span = rows_shape[-1] - index[-1] if rows_shape else 1
            count = min(span, row_hi - row_lo)
            width = col_hi - col_lo
            view = flat[pos:pos + count * last].view(count, last)[:, col_lo:col_hi] \
                if width == last else flat[pos:pos + width].view(1, width)
            origin = index + [col_lo]
            full = list(view.shape)
            view = view.reshape([1] * (len(shape) - 2) + full) if len(shape) >= 2 else view[0]
            layout.add(name, shape, origin if len(shape) >= 2 else [col_lo], view)
            pos += count * last if width == last else width
            row_lo += count

    pos = at
    if len(shape) == 1:
        layout.add(name, shape, [lo], flat[pos:pos + hi - lo])
        return
    row, col = divmod(lo, last)
    end_row, end_col = divmod(hi, last)
    if col and (row < end_row):
        add_rows(row, row + 1, col, last, pos)
        pos += last - col
        row, col = row + 1, 0
    if row < end_row:
        add_rows(row, end_row, 0, last, pos)
        pos += (end_row - row) * last
        row = end_row
    if end_col > col:
        add_rows(row, row + 1, col, end_col, pos)
