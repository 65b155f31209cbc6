"""The entry points a stock SGLang server loads by name (re-exported by :mod:`wsync.sglang`), and
the trainer side that drives them.

Targets **SGLang >= 0.5.4, < 0.6.0** (:data:`SUPPORTED_SGLANG`) in two interface generations,
read from (tests/python/sglang_standin/ mirrors both; docs/sglang.md has the conformance
table):

- *release*: sgl-project/sglang @ b2d53a07e07c664d4318934b5dd699246be30677.
  managers/scheduler_components/weight_updater.py, ``SchedulerWeightUpdaterManager
  .update_weights_from_tensor``: no session; ``disable_draft_model`` sends the update to the
  target worker only, otherwise a speculative-decoding engine's draft worker gets it (target and
  draft). Nothing is caught: a loader that raises ends the scheduler (fail-stop).
- *session*: okoge-kaz/sglang @ 23aaf6597dbbe47f9ceb6090e10372c844fed960 (the sglang-miles line;
  not in sgl-project/sglang at b2d53a07). ``begin_weight_update`` (selector, integer
  weight_version above the applied one) ... ``end_weight_update`` around every update; an update
  outside a session is an AssertionError that ends the scheduler. ``update_weights_from_tensor``
  fans the named tensors out to every runner its ``selector`` picks (default "all": the target's
  and the draft's) through ``runner.weight_updater.update_weights_from_tensor``; a raise is
  caught and returned as (False, traceback), the session marked failed; ``end_weight_update`` of
  a failed session returns the failure and leaves the session open.
- In both, model_executor's weight updater calls ``dynamic_import(load_format)(model,
  named_tensors)`` when ``load_format`` is in ``--custom-weight-loader``, drops its result and
  returns (True, "Success"): the loader gets the model and the tensors, nothing else.

The custom loader's request: :func:`update_request` builds it; the only named tensor is
``wsync.control``, a uint8 tensor of JSON ``{"version": v, "init": {...}}``.
:func:`update_weights` is the trainer side of one sync: begin (selector "target", the version)
/ update_weights_from_tensor / end where the engine has the session, ``disable_draft_model``
where it does not.

Trust (issue 42): ``init`` arrives in a request any HTTP client of the engine can send, so it
may carry only :data:`REQUEST_INIT_KEYS` (the update group's rank_offset, world_size, group_name,
num_trainers, job_id, deadline_seconds). The coordinator (``master_address``, ``master_port``),
the secret's source (``secret_env``, ``secret_file``), layout ``rules`` / ``extra_rules`` and
everything else come from the JSON object in ``$WSYNC_SGLANG_INIT`` of the server's environment
(its launch configuration); a request naming any other key is refused before anything connects.

Draft models (speculative decoding) are not synced: wsync's job has one rollout rank per TP
worker, holding the target model. :func:`update_weights` refuses a selector other than "target",
and the loader refuses any second model of a scheduler process (the draft runner a selector of
"all" or "draft" reaches) by its class name. The draft keeps the weights it was launched with;
speculative decoding stays correct (the target verifies), only its acceptance rate may fall.

There is no ``--weight-update-receivers`` entry point any more: the external receiver hook
(sgl-project/sglang ``weight_sync/external_receiver.py`` @ fd623da) is in no SGLang release or
the session line read above; it would need that unreleased change merged.
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
CONTROL_NAME = "wsync.control"
INIT_ENV = "WSYNC_SGLANG_INIT"
REQUEST_INIT_KEYS = frozenset(("rank_offset", "world_size", "group_name", "num_trainers",
                               "job_id", "deadline_seconds"))


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
    """The named tensors and fields of one sync through the custom loader: keyword arguments of
    SGLang's ``Engine.update_weights_from_tensor`` (over HTTP, serialize ``named_tensors`` per TP
    rank with SGLang's MultiprocessingSerializer into ``serialized_named_tensors``). `init`: the
    request's part of the connect arguments (:data:`REQUEST_INIT_KEYS`), read by each worker's
    first call. :func:`update_weights` adds the generation's target-only field."""
    body = json.dumps({"version": int(version), "init": dict(init or {})}).encode()
    control = torch.tensor(list(body), dtype=torch.uint8)
    return {"named_tensors": [(CONTROL_NAME, control)], "load_format": LOADER_PATH,
            "flush_cache": bool(flush_cache), "weight_version": str(int(version))}


def _result(step, done):
    success, message = done
    if not success:
        raise WsyncError(Status.ABORTED, f"SGLang {step}: {message}", "sglang")


def update_weights(engine, version, init=None, flush_cache=True, selector="target"):
    """The trainer side of one wsync sync into an SGLang engine (every TP rank's worker runs the
    loader, which syncs with the trainers' push of `version`).

    `engine`: SGLang's Engine, or a client with its calls (``update_weights_from_tensor`` and,
    on the session generation, ``begin_weight_update`` / ``end_weight_update``). With the
    session, every update is ``begin_weight_update(selector="target", weight_version=v)``, the
    update, then ``end_weight_update()`` (also after a failed update: SGLang then reports the
    session's failure and keeps it open, so the engine needs a restart before its next update).
    Without it, the update carries ``disable_draft_model=True``. Draft models are refused
    (`selector` other than "target": WsyncError(UNSUPPORTED) before any call). Raises
    WsyncError(ABORTED) with SGLang's message when a step fails; an engine whose scheduler died
    raises what its client raises."""
    if selector != "target":
        raise WsyncError(Status.UNSUPPORTED,
                         f"selector {selector!r}: wsync syncs the target model only; a "
                         "speculative-decoding draft model keeps its weights (selector "
                         "'target')", "sglang")
    request = update_request(version, init, flush_cache)
    begin = getattr(engine, "begin_weight_update", None)
    if begin is None:
        _result("update_weights_from_tensor",
                engine.update_weights_from_tensor(disable_draft_model=True, **request))
        return
    _result("begin_weight_update", begin(selector="target", weight_version=str(int(version))))
    try:
        updated = engine.update_weights_from_tensor(selector="target", **request)
    finally:
        ended = engine.end_weight_update()
    _result("update_weights_from_tensor", updated)
    _result("end_weight_update", ended)


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
        version, init = int(control["version"]), dict(control.get("init") or {})
    except (ValueError, KeyError, TypeError) as error:
        raise WsyncError(Status.INVALID_ARGUMENT, f"{CONTROL_NAME}: not a wsync control "
                         f"message ({error})", "load") from None
    refused = sorted(set(init) - REQUEST_INIT_KEYS)
    if refused:
        raise WsyncError(Status.INVALID_ARGUMENT,
                         f"{CONTROL_NAME}: the request may not set {refused} (a request's init "
                         f"takes only {sorted(REQUEST_INIT_KEYS)}; the coordinator, the secret's "
                         f"source and layout rules come from ${INIT_ENV} of the server)", "load")
    return version, init


_WORKERS = {}  # id(model) -> WsyncSGLangAdapter: one connected worker per model of the process.
_WORKERS_LOCK = threading.Lock()


def _first_call(model, init):
    check_sglang_version()
    merged = json.loads(os.environ.get(INIT_ENV) or "{}")
    merged.update(init)
    layout_args = {key: merged.pop(key) for key in ("hf_config", "rules", "skip", "w13_order")
                   if key in merged}
    if "extra_rules" in merged:
        layout_args["rules"] = list(layout_args.get("rules", [])) + merged.pop("extra_rules")
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

    The first call of the process refuses an unsupported SGLang, builds the worker's layout
    from SGLang's ranks and connects it (a failed connect is retried by the next call); every
    call then runs one wsync sync of the control message's version. A second model reaching the
    loader in the same process is a speculative-decoding draft model (SGLang's selector "all" or
    "draft"): refused by its class name, nothing synced. Success returns None; any failure
    raises WsyncError, because SGLang ignores a loader's result: the weights are then marked
    dirty (``worker(model).weights_dirty``) and the engine must not serve them."""
    version, init = _control(named_tensors)
    with _WORKERS_LOCK:
        adapter = _WORKERS.get(id(model))
        if adapter is None:
            if _WORKERS:
                raise WsyncError(Status.UNSUPPORTED,
                                 f"{type(model).__name__}: a second model in this SGLang "
                                 "scheduler (a speculative-decoding draft model) reached "
                                 f"{LOADER_PATH}; wsync syncs the target model only (send "
                                 "selector 'target' / disable_draft_model)", "load")
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


