"""Two ways to land a parameter on a vLLM worker: direct, or through the model's own loader.

**direct**: the live parameter is a plain slice of the checkpoint tensor (a box of it under a
:mod:`wsync.rules` rule): wsync writes it in place and nothing else runs.

**loader**: anything vLLM post-processes after loading. wsync writes the checkpoint-format
tensor (the box this rank's loader reads) into a staging tensor registered at connect, and
after the sync commits the worker hands ``(checkpoint name, staging tensor)`` pairs, layer by
layer, to ``model.load_weights`` inside vLLM's layerwise reload bracket
(``initialize_layerwise_reload`` / ``finalize_layerwise_reload`` of
``vllm/model_executor/model_loader/reload/``, as vLLM's own IPC engine brackets its loads), so
the model's weight loaders, its quantization methods' ``process_weights_after_loading`` and its
attention layers' post-processing (MLA's absorbed ``W_UK_T`` / ``W_UV``) run as at load time.

Classification (:func:`classify`), per local parameter, at connect; the first that applies:

1. a :class:`wsync.rules.LandingRule` whose pattern matches the name in full;
2. ``loader`` when vLLM post-processes it: its layer's ``quant_method`` is a quantization
   method (not vLLM's ``Unquantized*`` methods), or it belongs to a module that has its own
   ``process_weights_after_loading`` (vLLM's ``Attention`` / ``MLAAttention``) or to a module
   such a module holds (MLA's ``kv_b_proj``): vLLM's ``process_weights_after_loading`` in
   ``model_loader/utils.py`` runs exactly these two kinds; or its live shape / dtype differs
   from the checkpoint-format metadata vLLM recorded at load (``LAYERWISE_INFO``,
   ``record_metadata_for_reloading``): a repacked or kernel-specific layout;
3. ``direct`` otherwise.

vLLM reloads a layer (a module with its own parameters) as a unit: when it processes a layer it
copies every parameter of it back from the reloaded ones. So one ``loader`` parameter makes its
whole layer ``loader``; a ``LandingRule`` forcing ``direct`` on a parameter of such a layer is
refused.

Staging holds, per logical parameter landed through the loader, a tensor of the whole
checkpoint shape (vLLM's weight loaders narrow the full tensor to their rank's part), of which
wsync fills the boxes this rank's loader reads. It is allocated once, at connect, on the
parameter's device, and stays (its address is in the plan); its bytes are reported, and
``loader_staging_budget_bytes`` (init info) refuses a layout whose staging exceeds it.
"""

import dataclasses
import re
from typing import Dict, List, Tuple

import torch

from . import layouts
from ._lib import Status, WsyncError
from .rules import VLLM_RULES, LandingRule

# Routed experts: one [E, ...] logical tensor per projection; the checkpoint has one per expert.
_STACKED_EXPERTS = re.compile(r"(.*)\.experts\.(gate_proj|up_proj|down_proj)\.weight")


def make_landing_rules(rows):
    """LandingRule objects from JSON rows [pattern, way]."""
    return [r if isinstance(r, LandingRule) else LandingRule(r[0], r[1]) for r in rows or ()]


def _checkpoint_metadata():
    """vLLM's LAYERWISE_INFO (layer -> recorded checkpoint-format metadata), or {}."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except Exception:  # noqa: BLE001 - no vLLM, or one without the layerwise reload.
        return {}
    return LAYERWISE_INFO


def _recorded(layer, metadata):
    info = metadata.get(layer) if hasattr(metadata, "get") else None
    restore = getattr(info, "restore_metadata", None) if info is not None else None
    return restore[0] if restore else {}


def _post_processors(model):
    """{layer: name of the module that post-processes it} for modules with their own
    process_weights_after_loading and every module they hold."""
    owners = {}
    for name, module in model.named_modules():
        if callable(getattr(module, "process_weights_after_loading", None)):
            for held in module.modules():
                owners.setdefault(held, f"{name} ({type(module).__name__})")
    return owners


def _default_way(layer, local, param, owners, recorded):
    quant = getattr(layer, "quant_method", None)
    if quant is not None and not type(quant).__name__.startswith("Unquantized"):
        return "loader", f"quantized: {type(quant).__name__}"
    if layer in owners:
        return "loader", f"post-processed by {owners[layer]}"
    meta = recorded.get(local)
    if meta is not None and (tuple(meta.shape) != tuple(param.shape) or
                             meta.dtype != param.dtype):
        return "loader", (f"layout changed since load: checkpoint {tuple(meta.shape)} "
                          f"{meta.dtype}, live {tuple(param.shape)} {param.dtype}")
    return "direct", "a plain slice of the checkpoint tensor"


def classify(model, landing_rules=(), skip=()):
    """{local parameter name: (way, reason)} in the model's parameter order; names matching a
    `skip` pattern are left out. Raises LayoutError for a LandingRule forcing ``direct`` on a
    parameter whose layer lands through the loader."""
    rules = make_landing_rules(landing_rules)
    skip = [re.compile(s) for s in skip]
    owners = _post_processors(model)
    metadata = _checkpoint_metadata()
    ways, layers, forced = {}, {}, set()
    for layer_name, layer in model.named_modules():
        recorded = _recorded(layer, metadata)
        for short, param in layer.named_parameters(recurse=False):
            local = f"{layer_name}.{short}" if layer_name else short
            if local in ways or any(s.fullmatch(local) for s in skip):
                continue
            rule = next((r for r in rules if r.match(local)), None)
            if rule is not None:
                ways[local] = (rule.way, f"LandingRule({rule.pattern!r})")
                if rule.way == "direct":
                    forced.add(local)
            else:
                ways[local] = _default_way(layer, short, param, owners, recorded)
            layers.setdefault(layer_name, []).append(local)
    order = [n for n, _ in model.named_parameters() if n in ways]
    for names in layers.values():
        cause = next((n for n in names if ways[n][0] == "loader"), None)
        if cause is None:
            continue
        for name in names:
            if ways[name][0] == "loader":
                continue
            if name in forced:
                raise layouts.LayoutError(
                    f"{name}: a LandingRule lands it direct, but {cause} in the same layer lands "
                    f"through the loader ({ways[cause][1]}), and vLLM reloads a layer as a whole")
            ways[name] = ("loader", f"its layer lands through the loader ({cause})")
    return {n: ways[n] for n in order}


def _rule_for(name, rules):
    for rule in rules:
        match = rule.match(name)
        if match is not None:
            return rule, match
    return None, None


def _box(tensor, origin, extent):
    return tensor[tuple(slice(o, o + e) for o, e in zip(origin, extent))]


@dataclasses.dataclass
class Landing:
    """One worker's layout with both ways: `layout` (the direct parameters in place and the
    staging boxes) to register, and what the loader step hands the model after a sync."""
    layout: layouts.Layout
    ways: Dict[str, Tuple[str, str]]                 # local name -> (way, reason)
    staging: Dict[str, torch.Tensor]                 # logical name -> staging tensor (in order)
    boxes: Dict[str, List[Tuple[tuple, tuple]]]      # logical name -> [(origin, extent)]
    direct_bytes: int = 0
    loader_bytes: int = 0
    # local name -> (storage address, storage offset) of each direct parameter at connect.
    direct_storage: Dict[str, Tuple[int, int]] = dataclasses.field(default_factory=dict)
    # local name -> the session's buffer id of its storage; buffer id -> the storage's bytes.
    direct_buffers: Dict[str, int] = dataclasses.field(default_factory=dict)
    buffer_bytes: Dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def staging_bytes(self):
        return sum(t.numel() * t.element_size() for t in self.staging.values())

    @property
    def loader_parameters(self):
        return [n for n, (way, _) in self.ways.items() if way == "loader"]

    def report(self):
        return {"direct_bytes": self.direct_bytes, "loader_bytes": self.loader_bytes,
                "loader_staging_bytes": self.staging_bytes,
                "loader_parameters": len(self.loader_parameters),
                "direct_parameters": len(self.ways) - len(self.loader_parameters)}

    def moved_parameters(self, model):
        """Direct parameters whose storage is no longer where it was registered (vLLM's sleep
        mode may free and reallocate weights): a sync would write the old memory. Loader
        parameters may move freely (load_weights writes wherever they are)."""
        live = dict(model.named_parameters())
        return [n for n, where in self.direct_storage.items()
                if n not in live or _where(live[n]) != where]

    def rebind_moved(self, model, session):
        """Points the session's buffers of moved direct parameters at their new storages
        (``Session.rebind_buffer``; vLLM's sleep and wake-up may reallocate weights). A storage
        must have moved whole: the same size, every parameter of it at its old offset in one new
        storage. Returns the parameters that moved otherwise; then nothing is rebound."""
        live = dict(model.named_parameters())
        moved = self.moved_parameters(model)
        targets, keep, refused = {}, {}, []
        for name in moved:
            buffer_id = self.direct_buffers.get(name)
            if name not in live or buffer_id is None:
                refused.append(name)
                continue
            address, nbytes = layouts._storage(live[name].detach())
            if (live[name].storage_offset() != self.direct_storage[name][1]
                    or nbytes != self.buffer_bytes[buffer_id]
                    or targets.setdefault(buffer_id, address) != address):
                refused.append(name)
            keep[buffer_id] = live[name]
        # A parameter that stayed while another of its storage moved: the storage was split.
        refused += [n for n, b in self.direct_buffers.items() if b in targets and n not in moved]
        if refused:
            return sorted(set(refused))
        for buffer_id, address in targets.items():
            session.rebind_buffer(buffer_id, address, keep=keep[buffer_id])
            self.layout.repoint(buffer_id, keep[buffer_id])  # Let go of the old memory.
        self.direct_storage = {n: _where(live[n]) for n in self.direct_storage}
        return []

    def checkpoint_pairs(self):
        """(checkpoint name, tensor) in layer order: each logical tensor whole, except stacked
        routed experts, handed per expert (``...experts.<e>.gate_proj.weight``) for the experts
        this rank's boxes hold."""
        for logical, staging in self.staging.items():
            match = _STACKED_EXPERTS.fullmatch(logical)
            if match is None or staging.dim() != 3:
                yield logical, staging
                continue
            experts = sorted({e for origin, extent in self.boxes[logical]
                              for e in range(origin[0], origin[0] + extent[0])})
            for expert in experts:
                yield f"{match.group(1)}.experts.{expert}.{match.group(2)}.weight", staging[expert]

    def apply(self, model, model_config):
        """Hands the staging to ``model.load_weights`` inside vLLM's layerwise reload bracket;
        the bracket is closed (kernel tensors restored) even when loading raises. Nothing to do
        without loader parameters."""
        if not self.staging:
            return
        reload = _reload_module()
        reload.initialize_layerwise_reload(model)
        try:
            model.load_weights(self.checkpoint_pairs())
        finally:
            reload.finalize_layerwise_reload(model, model_config)


def _where(tensor):
    return layouts._storage(tensor.detach())[0], tensor.storage_offset()


def _reload_module():
    try:
        from vllm.model_executor.model_loader import reload
    except Exception as error:  # noqa: BLE001
        raise WsyncError(Status.UNSUPPORTED, "parameters landing through the loader need vLLM's "
                         f"layerwise reload (vllm.model_executor.model_loader.reload): {error}",
                         "vllm_loader") from None
    return reload


def vllm_landing(model, tp_rank, tp_size, config, rules=(), landing_rules=(), skip=(),
                 ep_rank=0, ep_size=1, expert_placement="linear", w13_order="gate_up",
                 staging_budget_bytes=0):
    """The Landing of a vLLM worker's model: direct parameters as :func:`layouts.vllm_layout`
    maps them, loader parameters as boxes of staging tensors of the checkpoint shape (the
    rule's boxes for the checkpoint-format metadata vLLM recorded, else for the live tensor)."""
    ways = classify(model, landing_rules, skip)
    named = [(n, p) for n, p in model.named_parameters() if n in ways]
    direct = [(n, p) for n, p in named if ways[n][0] == "direct"]
    layout = layouts.vllm_layout(direct, tp_rank, tp_size, config, rules=rules,
                                 ep_rank=ep_rank, ep_size=ep_size,
                                 expert_placement=expert_placement, w13_order=w13_order)
    rows, ids = layout.buffers()
    landing = Landing(layout, ways, {}, {}, direct_bytes=layout.logical_bytes(),
                      direct_storage={n: _where(p) for n, p in direct},
                      direct_buffers={n: ids[_where(p)[0]] for n, p in direct
                                      if _where(p)[0] in ids},
                      buffer_bytes={row[0]: row[2] for row in rows})
    loader = [(n, p) for n, p in named if ways[n][0] == "loader"]
    if not loader:
        return landing
    if not callable(getattr(model, "load_weights", None)):
        raise layouts.LayoutError(f"{len(loader)} parameter(s) land through the loader "
                                  f"({loader[0][0]}...), but the model has no load_weights")
    all_rules = list(rules) + layouts._w13_rules(w13_order) + VLLM_RULES
    ctx = layouts.Context(int(tp_rank), int(tp_size), config, int(ep_rank), int(ep_size),
                          expert_placement)
    metadata = _checkpoint_metadata()
    layers = dict(model.named_modules())
    unmapped = []
    for name, param in loader:
        layer_name, _, short = name.rpartition(".")
        template = _recorded(layers.get(layer_name), metadata).get(short, param.detach())
        rule, match = _rule_for(name, all_rules)
        if rule is None:
            unmapped.append(f"  {name} {tuple(template.shape)}: e.g. "
                            f"{layouts.suggest_rule(name, template.dim())}")
            continue
        for logical, shape, origin, view in layouts.expand(rule, match, name, template, ctx):
            shape, origin, extent = tuple(shape), tuple(origin), tuple(view.shape)
            staging = landing.staging.get(logical)
            if staging is None:
                staging = torch.zeros(shape, dtype=template.dtype, device=param.device)
                landing.staging[logical] = staging
                landing.boxes[logical] = []
            box = _box(staging, origin, extent)
            layout.add(logical, shape, origin, box)
            landing.boxes[logical].append((origin, extent))
            landing.loader_bytes += box.numel() * box.element_size()
    layouts.check_mapped(unmapped, "pass rules=[Rule(pattern, kind, target)] for the "
                         "checkpoint tensors these parameters load from, or skip them")
    if staging_budget_bytes and landing.staging_bytes > staging_budget_bytes:
        raise WsyncError(Status.NO_MEMORY, f"staging for the {len(loader)} parameter(s) landing "
                         f"through the loader needs {landing.staging_bytes} bytes, over "
                         f"loader_staging_budget_bytes {int(staging_budget_bytes)}", "layout")
    return landing
