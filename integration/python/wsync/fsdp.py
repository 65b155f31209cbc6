"""Layouts of FSDP trainers. FSDP1: a flat shard of concatenated parameters
(:func:`fsdp_flat_layout`). FSDP2 / DTensor (:func:`fsdp2_layout`): each parameter a DTensor
over a device mesh, with Hugging Face names (as FSDP-based RL trainers hold the model:
``fully_shard`` puts ``Shard(0)`` on every parameter; HSDP adds a ``Replicate()`` mesh
dimension).

A DTensor is read through its public attributes only (``placements``, ``device_mesh``,
``to_local()``, ``shape``), so anything that has them works, and torch versions without DTensor
can pass a stand-in. The local shard of ``Shard(d)`` over a mesh dimension of size n is
``torch.chunk``'s: chunks of ceil(size / n), the last ones shorter or empty
(torch/distributed/tensor/placement_types.py, ``Shard._local_shard_size_and_offset``; applied
mesh dimension by mesh dimension as ``_utils.compute_local_shape_and_global_offset`` does).
"""

import re

from .layouts import Layout, LayoutError, _named, check_mapped
from .rules import HF_RULES, suggest_rule

# Module wrappers that insert a name component: activation checkpointing, torch.compile, FSDP1
# with use_orig_params.
_WRAPPERS = re.compile(r"(?:_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)\.")


def is_dtensor(tensor):
    return all(hasattr(tensor, a) for a in ("placements", "device_mesh", "to_local"))


def _chunk(size, chunks, index):
    """(offset, length) of torch.chunk's piece `index` of `chunks` over `size` elements."""
    full = -(-size // chunks) if size else 0
    begin = min(full * index, size)
    return begin, max(0, min(size, begin + full) - begin)


def dtensor_box(tensor):
    """(global shape, origin, local tensor) of a DTensor's shard on this rank; a plain tensor is
    whole. Partial placements (pending reductions) are refused."""
    if not is_dtensor(tensor):
        return tuple(tensor.shape), (0,) * tensor.dim(), tensor
    shape = [int(s) for s in tensor.shape]
    origin = [0] * len(shape)
    size = list(shape)
    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise LayoutError("this rank is not in the DTensor's device mesh")
    for mesh_dim, placement in enumerate(tensor.placements):
        if getattr(placement, "is_partial", lambda: False)():
            raise LayoutError(f"placement {placement} is partial: reduce it before a sync")
        if not getattr(placement, "is_shard", lambda: False)():
            continue
        dim = placement.dim % len(shape)
        begin, length = _chunk(size[dim], mesh.size(mesh_dim), coordinate[mesh_dim])
        origin[dim] += begin
        size[dim] = length
    local = tensor.to_local()
    if list(local.shape) != size:
        raise LayoutError(f"local shard {tuple(local.shape)}, want {tuple(size)} for placements "
                          f"{tuple(tensor.placements)} of {tuple(shape)}")
    return tuple(shape), tuple(origin), local


def fsdp2_layout(model, config=None, rules=(), skip=()):
    """The layout of one FSDP2 (DTensor) rank of a model with Hugging Face names. Per-expert
    MoE weights (``mlp.experts.<k>.gate_proj.weight``...) become box k of one
    ``[E, ...]`` logical tensor per layer (``config.num_experts`` = E), as the engines fuse
    them; `rules` (kinds ``replicated`` = the name maps to itself or a renamed target, or
    ``hf_expert``) are tried first."""
    layout = Layout()
    skip = [re.compile(s) for s in skip]
    all_rules = list(rules) + HF_RULES
    unmapped = []
    for name, tensor in _named(model):
        name = _WRAPPERS.sub("", name)
        if any(s.fullmatch(name) for s in skip):
            continue
        tensor = tensor.detach() if hasattr(tensor, "detach") else tensor
        shape, origin, local = dtensor_box(tensor)
        rule, match = next(((r, m) for r in all_rules for m in [r.match(name)] if m), (None, None))
        if rule is None or rule.kind not in ("replicated", "hf_expert"):
            unmapped.append(f"  {name} {shape}: e.g. {suggest_rule(name, len(shape))}")
            continue
        if local.numel() == 0:
            continue  # torch.chunk left this rank nothing of the parameter.
        target = match.expand(rule.targets[0])
        if rule.kind == "hf_expert":
            experts = config.num_experts if config is not None else 0
            k = int(match.group("expert"))
            if not experts or k >= experts:
                raise LayoutError(f"{name}: expert {k} needs ModelConfig.num_experts > {k}")
            shape, origin, local = (experts,) + shape, (k,) + origin, local.unsqueeze(0)
        layout.add(target, shape, origin, local)
    check_mapped(unmapped, "a trainer's tensor maps to a whole or per-expert logical tensor: pass "
                 "rules=[Rule(pattern, 'replicated', target)], or skip them")
    return layout


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
