"""Layouts of FSDP2 / DTensor trainers: each parameter a DTensor over a device mesh, with Hugging
Face names (as FSDP-based RL trainers hold the model: ``fully_shard`` puts ``Shard(0)`` on every
parameter; HSDP adds a ``Replicate()`` mesh dimension).

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
