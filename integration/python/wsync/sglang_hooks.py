"""The entry points a stock SGLang server loads by name (re-exported by :mod:`wsync.sglang`).

Targets **SGLang >= 0.5.4, < 0.6.0** (:data:`SUPPORTED_SGLANG`), read from sgl-project/sglang:

- python/sglang/srt/model_executor/model_runner.py, ``ModelRunner.update_weights_from_tensor``:
  the named tensors of the request (``serialized_named_tensors[tp_rank]``, deserialized by
  ``TpModelWorker.update_weights_from_tensor`` in managers/tp_worker.py) are moved to the
  worker's device; when ``load_format in server_args.custom_weight_loader`` (the
  ``--custom-weight-loader`` list, server_args.py), ``dynamic_import(load_format)(self.model,
  named_tensors)`` is called and the call returns ``(True, "Success")``. The loader gets the
  model and the tensors, nothing else: not the request's ``weight_version``, and its return
  value is dropped. SchedulerUpdateWeightsMixin.update_weights_from_tensor
  (managers/scheduler_update_weights_mixin.py) catches nothing, so a loader that raises ends the
  scheduler: the only failure this path has is fail-stop.
- python/sglang/srt/managers/io_struct.py, ``UpdateWeightsFromTensorReqInput``:
  ``serialized_named_tensors`` (one per TP rank), ``load_format``, ``flush_cache``,
  ``abort_all_requests``, ``weight_version``.
- The external weight-update receiver hook (python/sglang/srt/weight_sync/external_receiver.py
  and model_executor/weight_updater.py @ fd623da, ``--weight-update-receivers``): a factory
  gets a ``WeightUpdateReceiverContext`` (model, device, tp_rank, tp_size, group_name,
  master_address, master_port, world_size, rank_offset, init_payload) at
  ``init_weights_update_group(receiver=...)``, and ``receive(payload)`` runs per
  ``update_weights_from_distributed(receiver_payload=...)``; a raise there is reported as the
  update's failure (success False) and a raise in the factory as the init's. It is in no
  SGLang release we could read (ModelExpress's SGLang notes call it unmerged), so
  :func:`create_receiver` also refuses an SGLang without the hook.
- Ranks: sglang/srt/distributed/parallel_state.py (``get_tensor_model_parallel_rank`` /
  ``_world_size``, ``get_moe_expert_parallel_rank`` / ``_world_size``),
  sglang/srt/layers/dp_attention.py (``is_dp_attention_enabled``, ``get_attention_tp_rank`` /
  ``_size``), server_args.py (``get_global_server_args().enable_dp_lm_head``).

The custom loader's request: :func:`update_request` builds it on the trainer side; the only
named tensor is ``wsync.control``, a uint8 tensor of JSON ``{"version": v, "init": {...}}``,
because the loader sees nothing but the tensors; ``weight_version`` is set to the same version
for SGLang's own bookkeeping. ``init`` holds :meth:`WsyncSGLangAdapter.connect`'s arguments
(SGLang's ``master_address``, ``master_port``, ``rank_offset``, ``world_size``, ``group_name``
and wsync's ``num_trainers``, ``job_id``, ``secret_env``, ``deadline_seconds``,
``path_transports``...), over defaults from the JSON object in ``$WSYNC_SGLANG_INIT`` of the
server's environment; it is read on the first call only.
"""

import json
import os
import re
import threading

import torch

from ._lib import Status, WsyncError

SGLANG_MIN, SGLANG_MAX = (0, 5, 4), (0, 6, 0)
SUPPORTED_SGLANG = ">=0.5.4,<0.6.0"
LOADER_PATH = "wsync.sglang.load_weights"
RECEIVER_PATH = "wsync.sglang.create_receiver"
CONTROL_NAME = "wsync.control"
INIT_ENV = "WSYNC_SGLANG_INIT"
_RECEIVER_HOOK = "sglang.srt.weight_sync.external_receiver"


def _version_tuple(text):
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def sglang_version():
    """The installed SGLang's __version__, or None without SGLang."""
    try:
        import sglang
    except Exception:  # noqa: BLE001
        return None
    return str(getattr(sglang, "__version__", "unknown"))


def check_sglang_version(version=None):
    """Raises WsyncError(UNSUPPORTED) naming `version` (default: the installed SGLang's) and the
    supported range when it is outside it; returns the version."""
    version = sglang_version() if version is None else version
    parsed = _version_tuple(version) if version is not None else None
    if parsed is None or not SGLANG_MIN <= parsed < SGLANG_MAX:
        raise WsyncError(Status.UNSUPPORTED,
                         f"wsync's SGLang hooks support SGLang {SUPPORTED_SGLANG}; found SGLang "
                         f"{version}", "register")
    return version


def engine_ranks():
    """This TP worker's parallel ranks, from SGLang's own state (call inside SGLang)."""
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers import dp_attention
    from sglang.srt.server_args import get_global_server_args
    ranks = {"tp_rank": ps.get_tensor_model_parallel_rank(),
             "tp_size": ps.get_tensor_model_parallel_world_size(),
             "ep_rank": ps.get_moe_expert_parallel_rank(),
             "ep_size": ps.get_moe_expert_parallel_world_size()}
    if dp_attention.is_dp_attention_enabled():
        ranks.update(attn_tp_rank=dp_attention.get_attention_tp_rank(),
                     attn_tp_size=dp_attention.get_attention_tp_size(),
                     dp_lm_head=bool(getattr(get_global_server_args(), "enable_dp_lm_head",
                                             False)))
    return ranks


def _adapter(model, ranks, hf_config=None, rules=(), skip=(), w13_order="gate_up"):
    from .sglang import WsyncSGLangAdapter
    config = hf_config if hf_config is not None else getattr(model, "config", None)
    if config is None:
        raise WsyncError(Status.INVALID_ARGUMENT, "the model has no .config: pass hf_config in "
                         "the init request", "init")
    return WsyncSGLangAdapter(model, model_config=config, rules=rules, skip=skip,
                              w13_order=w13_order, **ranks)


# -- the custom weight loader -------------------------------------------------------------------

def update_request(version, init=None, flush_cache=True):
    """The trainer side of one sync through the custom loader: keyword arguments of SGLang's
    update_weights_from_tensor (``Engine.update_weights_from_tensor``; over HTTP, serialize
    ``named_tensors`` per TP rank with SGLang's MultiprocessingSerializer into
    ``serialized_named_tensors``). `init`: the connect arguments (see the module docstring),
    read by each worker's first call."""
    body = json.dumps({"version": int(version), "init": dict(init or {})}).encode()
    control = torch.tensor(list(body), dtype=torch.uint8)
    return {"named_tensors": [(CONTROL_NAME, control)], "load_format": LOADER_PATH,
            "flush_cache": bool(flush_cache), "weight_version": str(int(version))}


def _control(named_tensors):
    named = list(named_tensors)
    others = [name for name, _ in named if name != CONTROL_NAME]
    controls = [tensor for name, tensor in named if name == CONTROL_NAME]
    if others or len(controls) != 1:
        raise WsyncError(Status.INVALID_ARGUMENT,
                         f"{LOADER_PATH} takes one tensor named {CONTROL_NAME} (built by "
                         f"wsync.sglang.update_request); got {[n for n, _ in named]}", "load")
    body = bytes(controls[0].detach().to("cpu", torch.uint8).flatten().tolist())
    try:
        control = json.loads(body.decode())
        return int(control["version"]), dict(control.get("init") or {})
    except (ValueError, KeyError, TypeError) as error:
        raise WsyncError(Status.INVALID_ARGUMENT, f"{CONTROL_NAME}: not a wsync control "
                         f"message ({error})", "load") from None


_WORKERS = {}  # id(model) -> WsyncSGLangAdapter: one connected worker per model of the process.
_WORKERS_LOCK = threading.Lock()


def _first_call(model, init):
    check_sglang_version()
    merged = json.loads(os.environ.get(INIT_ENV) or "{}")
    merged.update(init)
    layout_args = {key: merged.pop(key) for key in ("hf_config", "rules", "skip", "w13_order")
                   if key in merged}
    if "rules" in layout_args:
        from .layouts import Rule
        layout_args["rules"] = [Rule(*r) for r in layout_args["rules"]]
    adapter = _adapter(model, engine_ranks(), **layout_args)
    try:
        adapter.connect(**merged)
    except TypeError as error:
        raise WsyncError(Status.INVALID_ARGUMENT, f"wsync init arguments: {error}",
                         "init") from None
    return adapter


def load_weights(model, named_tensors):
    """SGLang's custom weight loader (``--custom-weight-loader wsync.sglang.load_weights``).

    The first call on a model refuses an unsupported SGLang, builds the worker's layout from
    SGLang's ranks and connects it (a failed connect is retried by the next call); every call
    then runs one wsync sync of the control message's version. Success returns None; any
    failure raises WsyncError, because SGLang ignores a loader's result: the weights are then
    marked dirty (``worker(model).weights_dirty``) and the engine must not serve them."""
    version, init = _control(named_tensors)
    with _WORKERS_LOCK:
        adapter = _WORKERS.get(id(model))
        if adapter is None:
            adapter = _first_call(model, init)
            _WORKERS[id(model)] = adapter
    adapter.sync(version)


def worker(model):
    """The adapter load_weights connected for `model` in this process, or None."""
    return _WORKERS.get(id(model))


def shutdown(model):
    """Finalizes the session load_weights connected for `model` (for a host that unloads it)."""
    adapter = _WORKERS.pop(id(model), None)
    if adapter is not None and adapter.session is not None:
        adapter.destroy_weights_update_group(adapter.group_name)


# -- the weight-update receiver hook ------------------------------------------------------------

def check_receiver_hook():
    """Raises WsyncError(UNSUPPORTED) unless the installed SGLang is supported and has the
    external weight-update receiver hook."""
    version = check_sglang_version()
    try:
        __import__(_RECEIVER_HOOK)
    except ImportError:
        raise WsyncError(Status.UNSUPPORTED,
                         f"SGLang {version} has no weight-update receiver hook ({_RECEIVER_HOOK}); "
                         f"use --custom-weight-loader {LOADER_PATH}", "register") from None
    return version


class WsyncReceiver:
    """SGLang's WeightUpdateReceiver over one wsync session: built (and connected) by SGLang's
    init_weights_update_group(receiver=...), ``receive({"version": v})`` per update,
    ``destroy()`` at destroy_weights_update_group. Not thread safe: SGLang calls it from the
    scheduler's thread only."""

    def __init__(self, context):
        check_receiver_hook()
        payload = dict(context.init_payload or {})
        ranks = engine_ranks()
        ranks.update(tp_rank=context.tp_rank, tp_size=context.tp_size)
        layout_args = {key: payload.pop(key) for key in ("hf_config", "w13_order")
                       if key in payload}
        self.adapter = _adapter(context.model, ranks, **layout_args)
        self.adapter.connect(context.master_address, context.master_port, context.rank_offset,
                             context.world_size, context.group_name, **payload)

    @property
    def weights_dirty(self):
        return self.adapter.weights_dirty

    def receive(self, payload):
        if not isinstance(payload, dict) or "version" not in payload:
            raise WsyncError(Status.INVALID_ARGUMENT,
                             f"receiver_payload must be {{'version': v}}; got {payload!r}",
                             "receive")
        self.adapter.sync(int(payload["version"]))

    def destroy(self):
        if self.adapter.session is not None:
            self.adapter.destroy_weights_update_group(self.adapter.group_name)


def create_receiver(context):
    """The receiver factory (``--weight-update-receivers wsync.sglang.create_receiver``)."""
    return WsyncReceiver(context)
