"""wsync as a vLLM weight-transfer backend ("wsync"): the trainer side.

A trainer written against vLLM's trainer API (the versions in ``wsync.vllm.SUPPORTED_VLLM``;
``vllm/distributed/weight_transfer/base.py`` and ``factory.py``) syncs through wsync with no
other wsync code than its init info, as with vLLM's own NCCL engine::

    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from wsync.vllm_trainer import WsyncTrainerInitInfo

    engine = WeightTransferTrainerFactory.trainer_init(          # every trainer rank
        WsyncTrainerInitInfo(rank=rank, coordinator="trainer-0:29700", num_trainers=world,
                             num_rollouts=8, layout="hf"),
        client=HTTPVLLMWeightSyncClient("http://rollout-0:8000"), source=ModuleSource(model))
    for step in ...:
        optimizer.step()
        engine.send_weights()                                    # every trainer rank

Unlike NCCL's broadcast from rank 0, every trainer rank sends its own shards (no gather): the
engine registers this rank's part of the model in place (FSDP2 / DTensor shards or whole tensors
with Hugging Face names: ``layout="hf"``; Megatron-core TP / PP / EP shards: ``layout="megatron"``)
and joins each sync. Rank 0 drives the inference side through the client (vLLM's
``VLLMWeightSyncClient``: init, start, update, finish). The engine owns the concurrency the
backend needs, as vLLM's NCCL and M2N trainer engines do: the workers join a sync from inside
``update_weights``, so rank 0 runs that RPC on a helper thread while its own sync runs. A failure
on either side fails the sync on every process (wsync's commit decision), so both end within the
deadline, and ``send_weights`` raises on every rank.
"""

import concurrent.futures
import dataclasses
import inspect
import logging
import threading
from typing import ClassVar, List, Optional

from . import _lib, layouts
from ._lib import Status, WsyncError
from .fsdp import fsdp2_layout
from .trainer import TrainerSync
from .vllm import (HAVE_VLLM, WsyncInitInfo, WsyncUpdateInfo, _TrainerEngineBase,
                   _TrainerInitBase, check_vllm_version, make_rules, session_options)

logger = logging.getLogger("wsync.vllm")

# Beyond the sync deadline: how long rank 0 waits for the workers' RPC to return after its own
# sync ended (the RPC returns when the workers' sync, which shares the deadline, has ended).
_RPC_GRACE_SECONDS = 10.0


@dataclasses.dataclass
class WsyncTrainerInitInfo(_TrainerInitBase):
    """Trainer-side init info for backend "wsync" (``rank``, keyword-only, is this trainer
    process's rank; rank 0 hosts the coordinator and drives the inference side).

    layout: "hf" (parameters with Hugging Face names, whole or FSDP2 / DTensor shards: what
    ``ModuleSource(model)`` of an FSDP trainer holds) or "megatron" (megatron.core names, this
    rank's TP / PP / EP shard: tp_rank, tp_size, layer_offset, ep_rank, ep_size,
    tied_embeddings). hf_config: the model's Hugging Face config as a dict (heads, kv heads,
    vocab; needed for "megatron" and for MoE experts). The workers' init info (coordinator,
    counts, deadline, transports) is derived from these fields and sent by rank 0.
    """
    backend: ClassVar[str] = "wsync"

    coordinator: str                  # 'host:port'; trainer rank 0 hosts it unless told not to
    num_trainers: int
    num_rollouts: int                 # rollout processes: every worker of every engine
    job_id: str = "wsync"
    layout: str = "hf"
    hf_config: Optional[dict] = None
    tp_rank: int = 0
    tp_size: int = 1
    layer_offset: int = 0
    ep_rank: int = 0
    ep_size: int = 1
    tied_embeddings: bool = False
    host_coordinator: Optional[bool] = None  # default: rank == 0
    secret_file: Optional[str] = None
    secret_env: Optional[str] = None  # this rank's (None: the setting's default, WSYNC_SECRET)
    deadline_seconds: Optional[float] = None  # None: the setting (WSYNC_DEADLINE_SECONDS, 60)
    path_transports: Optional[str] = None
    staging_budget_bytes: int = 0
    node_id: Optional[str] = None
    extra_rules: List[List[str]] = dataclasses.field(default_factory=list)
    skip: List[str] = dataclasses.field(default_factory=list)
    # The workers' (forwarded in their init info), see wsync.vllm. Their landing rules, like
    # their secret and coordinator, are the engines' launch configuration ($WSYNC_RULES).
    loader_staging_budget_bytes: int = 0
    loader_stream: str = "auto"

    def worker_init_info(self):
        """The workers' init request (a JSON-able dict of WsyncInitInfo's fields): the job, not
        this rank's layout, nor trust: no secret source, no rules. The coordinator is this
        job's, which each worker checks against its own launch configuration
        ($WSYNC_COORDINATOR_HOST, $WSYNC_COORDINATOR_PORT)."""
        info = WsyncInitInfo(coordinator=self.coordinator, num_trainers=self.num_trainers,
                             num_rollouts=self.num_rollouts, job_id=self.job_id,
                             deadline_seconds=self.deadline_seconds,
                             path_transports=self.path_transports,
                             staging_budget_bytes=self.staging_budget_bytes,
                             loader_staging_budget_bytes=self.loader_staging_budget_bytes,
                             loader_stream=self.loader_stream)
        return dataclasses.asdict(info)


def _module_of(source):
    """The torch module a WeightSource reads: wsync registers its parameters in place instead of
    iterating the source (iterating would all-gather FSDP shards). vLLM's ModuleSource keeps
    it as ``_module`` (0.28 on, main included); a source may also expose ``module``, or be the
    module."""
    import torch
    if isinstance(source, torch.nn.Module):
        return source
    for attribute in ("_module", "module"):
        module = getattr(source, attribute, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise WsyncError(Status.INVALID_ARGUMENT,
                     "wsync reads the trainer's parameters in place: pass vLLM's "
                     f"ModuleSource(model) (or the module), not a {type(source).__name__}",
                     "trainer_init")


def _layout_of(info, module):
    config = layouts.ModelConfig.from_hf(info.hf_config) if info.hf_config else None
    rules = make_rules(info.extra_rules)
    if info.layout == "hf":
        return fsdp2_layout(module, config, rules=rules, skip=info.skip)
    if info.layout == "megatron":
        if config is None:
            raise WsyncError(Status.INVALID_ARGUMENT, 'layout "megatron" needs hf_config '
                             "(heads, kv heads, head_dim, vocab)", "trainer_init")
        return layouts.megatron_layout(module, info.tp_rank, info.tp_size, config, rules=rules,
                                       skip=info.skip, layer_offset=info.layer_offset,
                                       ep_rank=info.ep_rank, ep_size=info.ep_size,
                                       tied_embeddings=info.tied_embeddings)
    raise WsyncError(Status.INVALID_ARGUMENT,
                     f'layout must be "hf" or "megatron", not {info.layout!r}', "trainer_init")


def _takes_weight_version(call):
    """Whether a client's finish_weight_update takes `weight_version` (vLLM's clients after the
    four-method protocol of clients.py @ 81ea9e9d, which takes none)."""
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "weight_version" or p.kind == p.VAR_KEYWORD for p in parameters)


def _finish(client, version):
    """Ends a committed round on the inference side, naming its weight version (as text, what
    vLLM reports for the served weights; without it vLLM keeps reporting the previous one,
    "default" at first). A client without the parameter is called without it."""
    if _takes_weight_version(client.finish_weight_update):
        client.finish_weight_update(weight_version=str(version))
    else:
        logger.warning("wsync: %s.finish_weight_update takes no weight_version: vLLM will not "
                       "report version %d as the served weights' version",
                       type(client).__name__, version)
        client.finish_weight_update()


class WsyncTrainerWeightTransferEngine(_TrainerEngineBase):
    """vLLM's TrainerWeightTransferEngine for backend "wsync": every rank sends its own shards.

    Built by ``WeightTransferTrainerFactory.trainer_init(init_info, client=..., source=...)`` on
    every trainer rank; ``send_weights()`` on every rank after each optimizer step sends the next
    version (1, 2, ...; a failed round uses up its number on every rank alike)."""
    init_info_cls = WsyncTrainerInitInfo

    def __init__(self, *, client, source=None, is_sender=True):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.sync = None          # The TrainerSync of this rank.
        self.version = 0          # The last version sent (committed or not).
        self.committed = -1       # The last version that committed.
        self._deadline = float(_lib.setting_value("deadline_seconds"))
        self._executor = None
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        """Registers this rank's parameters, has rank 0 send the workers' init request, and
        connects every process of the job (the workers connect inside that request, so rank 0
        runs it on a helper thread while it connects)."""
        if HAVE_VLLM:  # Refused here, not at registration: naming both versions.
            check_vllm_version(call="trainer_init")
        if source is None:
            raise WsyncError(Status.INVALID_ARGUMENT, "wsync's trainer engine needs a "
                             "WeightSource (e.g. ModuleSource(model))", "trainer_init")
        module = _module_of(source)
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        engine._deadline = float(init_info.deadline_seconds
                                 or _lib.setting_value("deadline_seconds"))
        host = init_info.host_coordinator
        options = session_options(init_info)
        engine.sync = TrainerSync(module, lambda m: _layout_of(init_info, m), init_info.rank,
                                  init_info.num_trainers, options.pop("coordinator"), None,
                                  num_rollouts=init_info.num_rollouts,
                                  host_coordinator=init_info.rank == 0 if host is None else host,
                                  connect=False, **options)
        future = None
        try:
            if engine.is_sender:
                engine._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="wsync-vllm-control")
                future = engine._executor.submit(client.init_weight_transfer_engine,
                                                 init_info.worker_init_info())
            connect_error = None
            try:
                engine.sync.connect()
            except BaseException as error:  # noqa: BLE001 - the RPC's error may be the cause.
                connect_error = error
            engine._join(future, connect_error, "the workers' init_weight_transfer_engine")
        except BaseException:
            engine._close()
            raise
        return engine

    def _join(self, future, local_error, what):
        """Waits for rank 0's RPC (bounded by the deadline) and raises the first failure: the
        RPC's when it failed (often the cause of the local one), else the local one."""
        rpc_error = None
        if future is not None:
            try:
                future.result(timeout=self._deadline + _RPC_GRACE_SECONDS)
            except concurrent.futures.TimeoutError:
                rpc_error = WsyncError(Status.TIMED_OUT, f"{what} did not return within "
                                       f"{self._deadline + _RPC_GRACE_SECONDS:.0f} s", what)
            except BaseException as error:  # noqa: BLE001
                rpc_error = error
        if rpc_error is not None:
            if local_error is not None:
                logger.error("wsync: %s failed (%s); this rank: %s", what, rpc_error, local_error)
            raise rpc_error
        if local_error is not None:
            raise local_error

    def send_weights(self):
        """One round on every rank: rank 0 calls start_weight_update, runs update_weights
        ({"version": v}) concurrently with its own sync, then finish_weight_update(weight_version=
        "v") (without it where the client's finish takes no version); the other
        ranks join the sync of v. Raises on every rank when the round failed anywhere."""
        if not self._lock.acquire(blocking=False):
            raise WsyncError(Status.INVALID_ARGUMENT, "send_weights is already running",
                             "send_weights")
        try:
            if self._closed or self.sync is None:
                raise WsyncError(Status.INVALID_ARGUMENT, "the trainer engine is shut down",
                                 "send_weights")
            self.version += 1
            version = self.version
            future = None
            if self.is_sender:
                self.client.start_weight_update()
                update = dataclasses.asdict(WsyncUpdateInfo(version=version))
                future = self._executor.submit(self.client.update_weights,
                                               {k: v for k, v in update.items() if v is not None})
            sync_error = None
            try:
                self.sync.push(version)
            except BaseException as error:  # noqa: BLE001 - reported with the RPC's below.
                sync_error = error
            self._join(future, sync_error, f"the workers' update_weights (version {version})")
            if self.is_sender:
                _finish(self.client, version)
            self.committed = version
        finally:
            self._lock.release()

    def schedule(self):
        """What this rank sends each sync (wsync.trainer's report as a dict)."""
        return self.sync.schedule()

    def stats(self):
        return self.sync.stats()

    def _close(self):
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
        sync, self.sync = self.sync, None
        if sync is not None:
            sync.close()

    def shutdown(self):
        with self._lock:
            self._close()
