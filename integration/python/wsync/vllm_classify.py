"""How each parameter of a vLLM worker's model lands: direct, or through the model's own loader
(the two ways: :mod:`wsync.vllm_loader`).

Classification (:func:`classify`), per local parameter, at connect; the first that applies:

1. a :class:`wsync.rules.LandingRule` whose pattern matches the name in full;
2. per layer, as vLLM's layerwise reload decides whether it binds a layer to its runtime
   tensors or reloads and reprocesses it (``reload/layerwise.py`` @ 01424e4b,
   ``_get_runtime_weight_reload_mapping``): ``loader`` when the layer belongs to a module that
   has its own ``process_weights_after_loading`` (vLLM's ``Attention`` / ``MLAAttention``, which
   vLLM always reprocesses) or to a module such a module holds (MLA's ``kv_b_proj``, from which
   it derives); when its live parameters or buffers differ in names, shape, stride or dtype
   from the checkpoint format vLLM recorded at load (``LAYERWISE_INFO``,
   ``record_metadata_for_reloading``; without a record the live tensors are taken as it); when
   its ``quant_method`` has no ``get_runtime_weight_reload_mapping``, gives None, gives other
   names than the checkpoint's, or maps them onto views other than the runtime parameters
   themselves. No class name is looked at: a same-shape repacked parameter (an unquantized
   method that shuffles its weight in place) lands through the loader because its method gives
   no mapping;
3. ``direct`` otherwise: no quant method and the recorded layout, or the method's identity
   mapping and the recorded layout.

vLLM reloads a layer (a module with its own parameters) as a unit: when it processes a layer it
copies every parameter of it back from the reloaded ones. So one ``loader`` parameter makes its
whole layer ``loader``; a ``LandingRule`` forcing ``direct`` on a parameter of such a layer is
refused.
"""

import re

from . import layouts
from .rules import LandingRule


def make_landing_rules(rows):
    """LandingRule objects from JSON rows [pattern, way]."""
    return [r if isinstance(r, LandingRule) else LandingRule(r[0], r[1]) for r in rows or ()]


def checkpoint_metadata():
    """vLLM's LAYERWISE_INFO (layer -> recorded checkpoint-format metadata), or {}."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except Exception:  # noqa: BLE001 - no vLLM, or one without the layerwise reload.
        return {}
    return LAYERWISE_INFO


def recorded_layout(layer, metadata):
    """(parameters, buffers) vLLM recorded in checkpoint format for `layer`, or None."""
    info = metadata.get(layer) if hasattr(metadata, "get") else None
    restore = getattr(info, "restore_metadata", None) if info is not None else None
    return restore if restore and (restore[0] or restore[1]) else None


def _post_processors(model):
    """{layer: name of the module that post-processes it} for modules with their own
    process_weights_after_loading and every module they hold."""
    owners = {}
    for name, module in model.named_modules():
        if callable(getattr(module, "process_weights_after_loading", None)):
            for held in module.modules():
                owners.setdefault(held, f"{name} ({type(module).__name__})")
    return owners


def _layout_difference(checkpoint, runtime):
    """Why `runtime` is not in `checkpoint`'s layout (names, shape, stride, dtype), else None."""
    if set(checkpoint) != set(runtime):
        return (f"tensors changed since load: checkpoint {sorted(checkpoint)}, "
                f"live {sorted(runtime)}")
    for name, meta in checkpoint.items():
        live = runtime[name]
        if (tuple(meta.shape), tuple(meta.stride()), meta.dtype) != \
                (tuple(live.shape), tuple(live.stride()), live.dtype):
            return (f"layout changed since load: {name} checkpoint {tuple(meta.shape)} stride "
                    f"{tuple(meta.stride())} {meta.dtype}, live {tuple(live.shape)} stride "
                    f"{tuple(live.stride())} {live.dtype}")
    return None


def _layer_way(layer, owners, recorded):
    """(way, reason) of a layer's parameters, decided as vLLM's layerwise reload decides whether
    a layer is bound to its runtime tensors or reloaded and reprocessed
    (``_get_runtime_weight_reload_mapping`` / ``_bind_runtime_weight_reload_mapping`` of
    vllm/model_executor/model_loader/reload/layerwise.py @ 01424e4b; read, not copied). wsync
    lands a layer direct only where vLLM would bind it to its runtime tensors as they are."""
    if layer in owners:  # vLLM's deferred attention layers and what they derive from.
        return "loader", f"post-processed by {owners[layer]}"
    params = dict(layer.named_parameters(recurse=False))
    buffers = dict(layer.named_buffers(recurse=False))
    if recorded is None:  # No checkpoint format recorded: the live tensors are taken as it.
        checkpoint_params, checkpoint_buffers = params, buffers
    else:
        checkpoint_params, checkpoint_buffers = recorded
        if checkpoint_buffers:
            why = _layout_difference(checkpoint_buffers, buffers)
            if why is not None:
                return "loader", why
    quant = getattr(layer, "quant_method", None)
    if quant is None:
        why = _layout_difference(checkpoint_params, params)
        return ("loader", why) if why else ("direct", "a plain slice of the checkpoint tensor")
    method = type(quant).__name__
    mapping_of = getattr(quant, "get_runtime_weight_reload_mapping", None)
    if not callable(mapping_of):
        return "loader", f"quantized: {method} has no runtime reload mapping (vLLM reprocesses)"
    mapping = mapping_of(layer, dict(checkpoint_params), dict(params))
    if mapping is None:
        return "loader", f"quantized: {method} gives no runtime reload mapping"
    if set(mapping) != set(checkpoint_params):
        return "loader", (f"quantized: {method}'s runtime reload mapping names {sorted(mapping)},"
                          f" the checkpoint {sorted(checkpoint_params)}")
    if set(mapping) != set(params) or any(mapping[n] is not params[n] for n in mapping):
        # vLLM loads through checkpoint-format views of the runtime storage: the loader.
        return "loader", f"{method} maps the checkpoint onto views of its runtime tensors"
    why = _layout_difference(checkpoint_params, params)
    return ("loader", why) if why else ("direct", f"{method} binds its runtime tensors")


def classify(model, landing_rules=(), skip=()):
    """{local parameter name: (way, reason)} in the model's parameter order; names matching a
    `skip` pattern are left out. Raises LayoutError for a LandingRule forcing ``direct`` on a
    parameter whose layer lands through the loader."""
    rules = make_landing_rules(landing_rules)
    skip = [re.compile(s) for s in skip]
    owners = _post_processors(model)
    metadata = checkpoint_metadata()
    ways, layers, forced = {}, {}, set()
    for layer_name, layer in model.named_modules():
        layer_way = None
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
                if layer_way is None:
                    layer_way = _layer_way(layer, owners, recorded_layout(layer, metadata))
                ways[local] = layer_way
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
