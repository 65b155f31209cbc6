"""Two ways to land a parameter on a vLLM worker: direct, or through the model's own loader.

**direct**: the live parameter is a plain slice of the checkpoint tensor (a box of it under a
:mod:`wsync.rules` rule): wsync writes it in place and nothing else runs.

**loader**: anything vLLM post-processes after loading. wsync writes the checkpoint-format
tensor (the box this rank's loader reads) into a staging tensor registered at connect, and
the worker hands ``(checkpoint name, staging tensor)`` pairs, layer by layer, after the sync
committed or wave by wave while it runs (``stream``, below), to ``model.load_weights`` inside
vLLM's layerwise reload bracket
(``initialize_layerwise_reload`` / ``finalize_layerwise_reload`` of
``vllm/model_executor/model_loader/reload/``, as vLLM's own IPC engine brackets its loads), so
the model's weight loaders, its quantization methods' ``process_weights_after_loading`` and its
attention layers' post-processing (MLA's absorbed ``W_UK_T`` / ``W_UV``) run as at load time.

Classification, per local parameter, at connect: :mod:`wsync.vllm_classify` (``classify``,
re-exported here); a parameter landing through the loader on an attention layer without a
quant method is refused (vLLM's reload would drop it, see :func:`vllm_landing`).

Staging holds, per logical parameter landed through the loader, a tensor of the whole
checkpoint shape (vLLM's weight loaders narrow the full tensor to their rank's part), of which
wsync fills the boxes this rank's loader reads. It is allocated once, at connect, on the
parameter's device, and stays (its address is in the plan). Two modes (``stream``):

- ``"whole"``: one staging tensor per logical parameter; the loader step runs once, after the
  sync committed (:meth:`Landing.apply`): a failed sync hands nothing to the model.
- ``"layer"``: a streamed sync (the C ABI's waves). Direct parameters are in wave 0; loader
  parameters of decoder layer ``i`` (``...layers.<i>.`` in the vLLM name) in wave ``1 + i``, those
  outside every decoder layer in wave :data:`LAST_WAVE` (the same on every rank, as the ABI
  requires). Staging is one pool per device sized for the largest wave: every wave's staging
  tensors are views into it, so wave after wave reuses it. After each loader wave landed the
  worker hands that wave's pairs to ``model.load_weights`` inside one reload bracket
  (:class:`WaveLoader`), which vLLM processes layer by layer as each layer's loads complete.
  Layers vLLM processes only at ``finalize_layerwise_reload`` (its deferred attention types)
  keep the tensors handed to them until then, so their parameters get staging of their own,
  outside the pool ("held"). After each wave every layer of it must have been processed
  (:meth:`Landing.check_processed`), and a CUDA pool's device is synchronized before the next
  wave writes it. A failure in a later wave leaves earlier layers at the new version.
- ``"auto"`` (default): ``"whole"`` when the whole staging fits ``staging_budget_bytes`` (or the
  budget is 0), else ``"layer"``.

``staging_budget_bytes`` (init info ``loader_staging_budget_bytes``; 0: unbounded) refuses, with
``WsyncError(NO_MEMORY)``, a whole staging over it, or a streamed one whose pool (the largest
wave) plus held staging is over it, naming that layer and both sizes.
"""

import dataclasses
import re
from typing import Dict, List, Tuple

import torch

from . import layouts
from ._lib import Status, WsyncError
from .rules import VLLM_RULES
from .vllm_classify import (checkpoint_metadata, classify, make_landing_rules,  # noqa: F401
                            recorded_layout)

# Routed experts: one [E, ...] logical tensor per projection; the checkpoint has one per expert.
_STACKED_EXPERTS = re.compile(r"(.*)\.experts\.(gate_proj|up_proj|down_proj)\.weight")
# The decoder layer of a vLLM parameter name: its prefix and index.
_DECODER_LAYER = re.compile(r"(?:^|.*?\.)layers\.(\d+)(?=\.)")
STREAMS = ("auto", "layer", "whole")
LAST_WAVE = 4095  # The C ABI's last wave: loader parameters outside every decoder layer.
POOL_ALIGN = 256  # Bytes: where each staging view of a wave starts in the pool.


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
    staging boxes) to register, and what the loader step hands the model after a sync. Under
    ``stream == "layer"`` the staging tensors of different waves are views into one pool."""
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
    stream: str = "whole"                            # "whole" or "layer" (chosen from "auto")
    # Streamed: logical / local loader name -> wave; wave -> its layer ("model.layers.7"), its
    # staging bytes in the pool, and the layers (module names) it loads outside the held ones.
    waves: Dict[str, int] = dataclasses.field(default_factory=dict)
    local_waves: Dict[str, int] = dataclasses.field(default_factory=dict)
    wave_labels: Dict[int, str] = dataclasses.field(default_factory=dict)
    wave_bytes: Dict[int, int] = dataclasses.field(default_factory=dict)
    wave_layers: Dict[int, List[str]] = dataclasses.field(default_factory=dict)
    # Streamed: device -> the uint8 pool; logical names with staging of their own (held).
    pool: Dict[torch.device, torch.Tensor] = dataclasses.field(default_factory=dict)
    held: List[str] = dataclasses.field(default_factory=list)
    whole_staging_bytes: int = 0                     # What "whole" staging takes.

    @property
    def streamed(self):
        return self.stream == "layer"

    @property
    def staging_bytes(self):
        """The staging memory held: every staging tensor ("whole"), or the pools and the held
        tensors ("layer")."""
        if not self.streamed:
            return sum(t.numel() * t.element_size() for t in self.staging.values())
        return (sum(p.numel() for p in self.pool.values()) +
                sum(self.staging[n].numel() * self.staging[n].element_size() for n in self.held))

    @property
    def loader_parameters(self):
        return [n for n, (way, _) in self.ways.items() if way == "loader"]

    def report(self):
        return {"direct_bytes": self.direct_bytes, "loader_bytes": self.loader_bytes,
                "loader_staging_bytes": self.staging_bytes,
                "loader_whole_staging_bytes": self.whole_staging_bytes,
                "loader_stream": self.stream, "loader_waves": len(self.wave_labels),
                "loader_largest_wave_bytes": max(self.wave_bytes.values(), default=0),
                "loader_parameters": len(self.loader_parameters),
                "direct_parameters": len(self.ways) - len(self.loader_parameters)}

    def ways_report(self):
        """{local name: (way, reason)}; streamed, a loader parameter's reason names its wave."""
        if not self.streamed:
            return dict(self.ways)
        out = {}
        for name, (way, reason) in self.ways.items():
            wave = self.local_waves.get(name)
            out[name] = (way, reason if wave is None else
                         f"{reason}; wave {wave} ({self.wave_labels[wave]})")
        return out

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

    def checkpoint_pairs(self, wave=None):
        """(checkpoint name, tensor) in layer order: each logical tensor whole, except stacked
        routed experts, handed per expert (``...experts.<e>.gate_proj.weight``) for the experts
        this rank's boxes hold. `wave`: only that wave's (streamed)."""
        for logical, staging in self.staging.items():
            if wave is not None and self.waves.get(logical) != wave:
                continue
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
        without loader parameters. "whole" only (streamed, :class:`WaveLoader` loads)."""
        if not self.staging:
            return
        if self.streamed:
            raise WsyncError(Status.INVALID_ARGUMENT, "a streamed landing is loaded wave by "
                             "wave (WaveLoader), not after the sync", "Landing.apply")
        reload = _reload_module()
        reload.initialize_layerwise_reload(model)
        try:
            model.load_weights(self.checkpoint_pairs())
        finally:
            reload.finalize_layerwise_reload(model, model_config)

    def check_processed(self, model, wave):
        """Raises when a layer of `wave` still waits for loads after its wave was handed over:
        vLLM would process it later from tensors pointing into the pool the next wave reuses
        (or, when none of its loads arrived, leave it at the old version)."""
        infos = checkpoint_metadata()
        modules = dict(model.named_modules())
        for layer_name in self.wave_layers.get(wave, ()):
            layer = modules.get(layer_name)
            info = infos.get(layer) if layer is not None and hasattr(infos, "get") else None
            can_load = getattr(info, "can_load", None)
            if callable(can_load) and can_load():
                raise WsyncError(Status.INTERNAL, f"wave {wave} ({self.wave_labels[wave]}): vLLM "
                                 f"did not process layer {layer_name} within its wave "
                                 f"({getattr(info, 'load_numel', '?')} of "
                                 f"{getattr(info, 'load_numel_total', '?')} elements loaded); a "
                                 "streamed sync reuses its staging for the next wave: land it "
                                 "with loader_stream='whole'", "wave")


class WaveLoader:
    """The loader step of one streamed sync, run by the worker's wave callback: :meth:`load`
    hands wave `w` >= 1 to ``model.load_weights`` inside ONE layerwise reload bracket, opened
    before the first loader wave; :meth:`close` ends the bracket (``finalize_layerwise_reload``,
    attention layers processed there) and must run after the sync, whether it committed or not.
    vLLM's reload keeps its state per layer (``LAYERWISE_INFO``), so several ``load_weights``
    calls share one bracket, as vLLM's NCCL engine calls it once per received batch."""

    def __init__(self, landing, model, model_config):
        self.landing, self.model, self.model_config = landing, model, model_config
        self.opened = False
        self.loaded = []  # The loader waves handed over, in order.

    def load(self, version, wave):
        if wave not in self.landing.wave_labels:
            return  # Wave 0: direct parameters, landed in place.
        reload = _reload_module()
        if not self.opened:
            self.opened = True  # Closed even when opening fails half-way.
            reload.initialize_layerwise_reload(self.model)
        self.model.load_weights(self.landing.checkpoint_pairs(wave))
        self.landing.check_processed(self.model, wave)
        for device in self.landing.pool:  # Reads of the pool end before the next wave writes.
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        self.loaded.append(wave)

    def close(self):
        """Ends the bracket if load opened it (the live tensors put back, deferred layers
        processed); raises what finalize raises."""
        if not self.opened:
            return
        self.opened = False
        _reload_module().finalize_layerwise_reload(self.model, self.model_config)


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


def wave_of(name):
    """(wave, layer) of a loader parameter under a streamed sync, from its vLLM name alone (so
    every rank gives a parameter the same wave): decoder layer ``i`` -> ``1 + i``; outside every
    decoder layer -> :data:`LAST_WAVE`."""
    match = _DECODER_LAYER.match(name)
    if match is None:
        return LAST_WAVE, "outside the decoder layers"
    wave = 1 + int(match.group(1))
    if wave >= LAST_WAVE:
        raise layouts.LayoutError(f"{name}: decoder layer {wave - 1} is past the last wave a "
                                  f"streamed sync has ({LAST_WAVE})")
    return wave, match.group(0)


def _deferred_types():
    """vLLM's layer types whose reload is processed only at finalize_layerwise_reload (the
    attention layers: ``_DEFERRED_ATTENTION_TYPES`` in model_loader/reload/layerwise.py)."""
    try:
        from vllm.model_executor.layers import attention
    except Exception:  # noqa: BLE001 - no vLLM.
        return ()
    return tuple(getattr(attention, n) for n in ("Attention", "MLAAttention",
                                                  "MMEncoderAttention") if hasattr(attention, n))


def _nbytes(shape, dtype):
    numel = 1
    for size in shape:
        numel *= size
    return numel * torch.empty((), dtype=dtype).element_size()


def _align(offset):
    return -(-offset // POOL_ALIGN) * POOL_ALIGN


def _pool_plan(specs):
    """Where each streamed staging tensor lives: {logical: (device, byte offset)} for pooled
    ones (every wave packed from offset 0 of its device's pool), {device: pool bytes} (its
    largest wave) and {wave: bytes} (a wave's extent, summed over devices)."""
    offsets, ends, wave_bytes = {}, {}, {}
    for logical, (shape, dtype, device, wave, held) in specs.items():
        if held:
            continue
        begin = _align(ends.get((device, wave), 0))
        offsets[logical] = (device, begin)
        ends[(device, wave)] = begin + _nbytes(shape, dtype)
    pools = {}
    for (device, wave), end in ends.items():
        pools[device] = max(pools.get(device, 0), end)
        wave_bytes[wave] = wave_bytes.get(wave, 0) + end
    return offsets, pools, wave_bytes


def _refuse(message):
    raise WsyncError(Status.NO_MEMORY, message, "layout")


def vllm_landing(model, tp_rank, tp_size, config, rules=(), landing_rules=(), skip=(),
                 ep_rank=0, ep_size=1, expert_placement="linear", w13_order="gate_up",
                 staging_budget_bytes=0, stream="auto"):
    """The Landing of a vLLM worker's model: direct parameters as :func:`layouts.vllm_layout`
    maps them, loader parameters as boxes of staging tensors of the checkpoint shape (the
    rule's boxes for the checkpoint-format metadata vLLM recorded, else for the live tensor).
    `stream` ("auto", "layer", "whole") and `staging_budget_bytes`: see the module docstring."""
    if stream not in STREAMS:
        raise layouts.LayoutError(f"loader stream {stream!r}: expected one of "
                                  f"{', '.join(STREAMS)}")
    budget = int(staging_budget_bytes or 0)
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
                      buffer_bytes={row[0]: row[2] for row in rows},
                      stream="whole" if stream == "auto" else stream)
    loader = [(n, p) for n, p in named if ways[n][0] == "loader"]
    if not loader:
        return landing
    if not callable(getattr(model, "load_weights", None)):
        raise layouts.LayoutError(f"{len(loader)} parameter(s) land through the loader "
                                  f"({loader[0][0]}...), but the model has no load_weights")
    all_rules = list(rules) + layouts._w13_rules(w13_order) + VLLM_RULES
    ctx = layouts.Context(int(tp_rank), int(tp_size), config, int(ep_rank), int(ep_size),
                          expert_placement)
    metadata = checkpoint_metadata()
    layers = dict(model.named_modules())
    deferred = _deferred_types()
    specs = {}   # logical -> (shape, dtype, device, wave, held)
    boxes = []   # (logical, origin, extent)
    unmapped = []
    unreloadable = []  # Parameters of an attention layer vLLM cannot reload (no quant method).
    for name, param in loader:
        layer_name, _, short = name.rpartition(".")
        template = (recorded_layout(layers.get(layer_name), metadata) or ({}, {}))[0].get(
                short, param.detach())
        rule, match = _rule_for(name, all_rules)
        if rule is None:
            unmapped.append(f"  {name} {tuple(template.shape)}: e.g. "
                            f"{layouts.suggest_rule(name, template.dim())}")
            continue
        held = bool(deferred) and isinstance(layers.get(layer_name), deferred)
        if held and getattr(layers[layer_name], "quant_method", None) is None:
            unreloadable.append(f"  {name} of {layer_name} ({type(layers[layer_name]).__name__})")
            continue
        wave, label = wave_of(name)
        landing.local_waves[name] = wave
        landing.wave_labels.setdefault(wave, label)
        if not held and layer_name not in landing.wave_layers.setdefault(wave, []):
            landing.wave_layers[wave].append(layer_name)
        for logical, shape, origin, view in layouts.expand(rule, match, name, template, ctx):
            spec = specs.setdefault(logical, (tuple(shape), template.dtype, param.device, wave,
                                              held))
            if spec[3] != wave:
                raise layouts.LayoutError(f"{logical}: loaded by {name} (wave {wave}) and by a "
                                          f"parameter of wave {spec[3]}: a checkpoint tensor "
                                          "must feed one decoder layer")
            boxes.append((logical, tuple(origin), tuple(view.shape)))
    if unreloadable:
        # vLLM's layerwise reload puts an attention layer's own tensors back and reloads what it
        # was handed only through its quant method: without one it drops it (reload/layerwise.py,
        # _finalize_attention_layer / _reload_attention_scales; raises on older vLLM).
        raise layouts.LayoutError(
            f"{len(unreloadable)} parameter(s) would land through the loader on an attention "
            "layer without a quant method, which vLLM's reload leaves stale:\n"
            + "\n".join(unreloadable) + "\nskip them ($WSYNC_RULES \"skip\") or give the "
            "layer a quant method")
    layouts.check_mapped(unmapped, "pass rules=[Rule(pattern, kind, target)] for the "
                         "checkpoint tensors these parameters load from, or skip them")
    whole = sum(_nbytes(shape, dtype) for shape, dtype, _, _, _ in specs.values())
    landing.whole_staging_bytes = whole
    if stream == "auto":
        landing.stream = "whole" if not budget or whole <= budget else "layer"
    if landing.streamed:
        _stream_staging(landing, specs, budget)
    else:
        landing.local_waves, landing.wave_labels, landing.wave_layers = {}, {}, {}
        if budget and whole > budget:
            _refuse(f"staging for the {len(loader)} parameter(s) landing through the loader "
                    f"needs {whole} bytes, over loader_staging_budget_bytes {budget} (streamed "
                    "layer by layer, loader_stream='layer', it needs the largest layer's)")
        for logical, (shape, dtype, device, _, _) in specs.items():
            landing.staging[logical] = torch.zeros(shape, dtype=dtype, device=device)
    for logical, origin, extent in boxes:
        box = _box(landing.staging[logical], origin, extent)
        layout.add(logical, specs[logical][0], origin, box)
        landing.boxes.setdefault(logical, []).append((origin, extent))
        landing.loader_bytes += box.numel() * box.element_size()
    return landing


def _stream_staging(landing, specs, budget):
    """Streamed staging: the pool per device and the held tensors, the waves declared on the
    layout; refused over `budget` (0: unbounded) before anything is allocated."""
    offsets, pools, wave_bytes = _pool_plan(specs)
    held = [n for n, spec in specs.items() if spec[4]]
    held_bytes = sum(_nbytes(specs[n][0], specs[n][1]) for n in held)
    need = sum(pools.values()) + held_bytes
    if budget and need > budget:
        largest = max(wave_bytes, key=lambda w: (wave_bytes[w], -w), default=None)
        named = (f"the largest wave, {landing.wave_labels[largest]} (wave {largest}), needs "
                 f"{wave_bytes[largest]} bytes" if largest is not None else "no wave is pooled")
        _refuse(f"loader staging streamed layer by layer needs {need} bytes ({named}; "
                f"{held_bytes} bytes held for layers vLLM processes at finalize), over "
                f"loader_staging_budget_bytes {budget}")
    landing.wave_bytes = wave_bytes
    landing.pool = {device: torch.zeros(size, dtype=torch.uint8, device=device)
                    for device, size in pools.items()}
    landing.held = held
    for logical, (shape, dtype, device, wave, is_held) in specs.items():
        landing.waves[logical] = wave
        if is_held:
            landing.staging[logical] = torch.zeros(shape, dtype=dtype, device=device)
            continue
        _, begin = offsets[logical]
        size = _nbytes(shape, dtype)
        landing.staging[logical] = \
            landing.pool[device][begin:begin + size].view(dtype).view(shape)
    landing.layout.waves.update(landing.waves)
