"""wsync as a vLLM weight-transfer backend ("wsync").

vLLM's worker creates the engine with ``WeightTransferEngineFactory.create_engine(config,
vllm_config, device, model)`` and then calls, per the WeightTransferEngine interface:

  init_transfer_engine(parse_init_info(init_info))       once (the RL controller's init RPC)
  start_weight_update()                                  each step
  update_weights(update_info) -> parse_update_info + receive_weights
  finish_weight_update()
  shutdown()

This engine registers the worker's own parameters in place (no copy of the weights): the plugin
writes the fused qkv_proj / gate_up_proj / vocabulary shards directly. ``receive_weights`` is one
wsync sync of ``update_info.version``, which the trainers join with ``TrainerSync.push(version)``.

Registration: the ``vllm.general_plugins`` entry point ``wsync = wsync.vllm:register`` calls
:func:`register`, which adds "wsync" to ``WeightTransferEngineFactory``. vLLM is imported only in
this module, and only when present; without it the engine still works against any torch module
with vLLM's parameter names (that is how the tests drive it).
"""

import dataclasses
from typing import Any, Dict, List, Optional

from . import layouts
from ._lib import Status, WsyncError
from .session import Session

try:  # vLLM's base class when vLLM is installed; a stand-in with the same calls otherwise.
    from vllm.distributed.weight_transfer.base import WeightTransferEngine as _Base
    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - ImportError, or a vLLM without this interface.
    HAVE_VLLM = False

    class _Base:
        def __init__(self, config, vllm_config, device, model):
            self.config = config
            self.vllm_config = vllm_config
            self.parallel_config = getattr(vllm_config, "parallel_config", None)
            self.model_config = getattr(vllm_config, "model_config", None)
            self.device = device
            self.model = model

        def parse_init_info(self, init_dict):
            try:
                return self.init_info_cls(**init_dict)
            except TypeError as e:
                raise ValueError(f"Invalid init_info for {type(self).__name__}: {e}") from e

        def parse_update_info(self, update_dict):
            try:
                return self.update_info_cls(**update_dict)
            except TypeError as e:
                raise ValueError(f"Invalid update_info for {type(self).__name__}: {e}") from e

        def update_weights(self, update_info):
            self.receive_weights(self.parse_update_info(update_info))


@dataclasses.dataclass
class WsyncInitInfo:
    """The RL controller's init request (JSON-able). The secret comes from a file or an
    environment variable of the worker, never from the request."""
    coordinator: str                 # 'host:port' of the coordinator (trainer rank 0)
    num_trainers: int
    num_rollouts: int                # rollout processes of the job (all engines' workers)
    job_id: str = "wsync"
    rank: Optional[int] = None       # this worker's rollout rank; default: dp_rank * tp + tp_rank
    tp_rank: Optional[int] = None    # default: vLLM's tensor-parallel rank
    tp_size: Optional[int] = None    # default: parallel_config.tensor_parallel_size
    secret_file: Optional[str] = None
    secret_env: Optional[str] = "WSYNC_SECRET"
    deadline_seconds: float = 60.0
    path_transports: Optional[str] = None
    staging_budget_bytes: float = 0.0
    node_id: Optional[str] = None
    # Expert parallelism; defaults from vLLM's parallel_config: with enable_expert_parallel,
    # ep_size = tp * data_parallel_size and ep_rank = the rollout rank (vLLM's
    # FusedMoEParallelConfig), placement = expert_placement_strategy (default "linear").
    ep_size: Optional[int] = None
    ep_rank: Optional[int] = None
    expert_placement: Optional[str] = None
    extra_rules: List[List[str]] = dataclasses.field(default_factory=list)  # [pattern, kind, targets...]
    skip: List[str] = dataclasses.field(default_factory=list)  # local names to leave out


@dataclasses.dataclass
class WsyncUpdateInfo:
    """One update: the version to receive. vLLM's generic fields are accepted and ignored (the
    layout was agreed at init)."""
    version: int
    names: Optional[List[str]] = None
    dtype_names: Optional[List[str]] = None
    shapes: Optional[List[Any]] = None


def _vllm_tp():
    try:
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)
        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001
        return None, None


class WsyncWeightTransferEngine(_Base):
    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        self.session = None
        self.layout = None
        self.version = -1

    # -- worker side ------------------------------------------------------------------------------
    def _model_config(self, tp_size):
        hf = getattr(self.model_config, "hf_config", None) if self.model_config is not None \
            else None
        if hf is None:
            return None
        config = layouts.ModelConfig.from_hf(hf)
        return config

    def _expert_parallel(self, init_info, tp_size, rank):
        """(ep_size, ep_rank, placement) from the init info, else from vLLM's parallel_config."""
        pc = self.parallel_config
        ep_size = init_info.ep_size
        if ep_size is None:
            enabled = bool(getattr(pc, "enable_expert_parallel", False))
            ep_size = tp_size * (getattr(pc, "data_parallel_size", 1) or 1) if enabled else 1
        ep_rank = init_info.ep_rank if init_info.ep_rank is not None else \
            (rank if ep_size > 1 else 0)
        placement = init_info.expert_placement or \
            getattr(pc, "expert_placement_strategy", None) or "linear"
        return ep_size, ep_rank, placement

    def init_transfer_engine(self, init_info):
        if self.session is not None:
            raise WsyncError(Status.INVALID_ARGUMENT, "the transfer engine is initialized",
                             "init_transfer_engine")
        tp_rank, tp_size = init_info.tp_rank, init_info.tp_size
        vrank, vsize = _vllm_tp()
        if tp_rank is None:
            tp_rank = vrank if vrank is not None else 0
        if tp_size is None:
            tp_size = vsize or getattr(self.parallel_config, "tensor_parallel_size", 1) or 1
        rank = init_info.rank
        if rank is None:
            dp_rank = getattr(self.parallel_config, "data_parallel_rank", 0) or 0
            rank = dp_rank * tp_size + tp_rank
        rules = [layouts.Rule(r[0], r[1], tuple(r[2:]) if len(r) > 3 else r[2])
                 for r in init_info.extra_rules]
        ep_size, ep_rank, placement = self._expert_parallel(init_info, tp_size, rank)
        self.layout = layouts.vllm_layout(self.model, tp_rank, tp_size,
                                          self._model_config(tp_size), rules=rules,
                                          skip=init_info.skip, ep_rank=ep_rank, ep_size=ep_size,
                                          expert_placement=placement)
        session = Session("rollout", rank=rank, num_trainers=init_info.num_trainers,
                          num_rollouts=init_info.num_rollouts, job_id=init_info.job_id,
                          coordinator=init_info.coordinator, secret_file=init_info.secret_file,
                          secret_env=None if init_info.secret_file else init_info.secret_env,
                          deadline_seconds=init_info.deadline_seconds,
                          path_transports=init_info.path_transports,
                          staging_budget_bytes=init_info.staging_budget_bytes,
                          node_id=init_info.node_id)
        try:
            self.layout.register(session)
            session.connect()
        except BaseException:
            session.finalize()
            raise
        self.session = session

    def start_weight_update(self):
        self._require("start_weight_update")  # In place: nothing to prepare.

    def receive_weights(self, update_info):
        self._require("receive_weights").sync(update_info.version)
        self.version = int(update_info.version)

    def finish_weight_update(self):
        state, version = self._require("finish_weight_update").state()
        if state.name == "DIRTY":
            raise WsyncError(Status.ABORTED, f"the last weight update failed (state DIRTY, "
                                             f"version {version}); do not serve",
                             "finish_weight_update")

    def shutdown(self):
        if self.session is not None:
            session, self.session = self.session, None
            session.finalize()

    def metrics_text(self):
        """Prometheus text of wsync's metrics for the engine's /metrics ("" until the plugin's
        exporter exists)."""
        if self.session is None:
            return ""
        try:
            return self.session.metrics_text()
        except WsyncError as error:
            if error.code == Status.UNSUPPORTED:
                return ""
            raise

    def stats(self):
        return self._require("stats").stats()

    def _require(self, call):
        if self.session is None:
            raise WsyncError(Status.INVALID_ARGUMENT,
                             "init_transfer_engine has not been called", call)
        return self.session

    # -- trainer side -----------------------------------------------------------------------------
    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        """vLLM's trainer hook. wsync reads the trainer's registered parameters in place, so the
        iterator is not consumed; trainer_args = {"sync": TrainerSync, "version": int}."""
        sync, version = trainer_args["sync"], trainer_args["version"]
        return sync.push(version)


def register():
    """The vllm.general_plugins entry point: registers "wsync" with vLLM's factory."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except Exception:  # noqa: BLE001 - no vLLM, or one without weight-transfer engines.
        return False
    try:
        WeightTransferEngineFactory.register_engine("wsync", "wsync.vllm",
                                                    "WsyncWeightTransferEngine")
    except ValueError:  # Already registered (the plugin loads once per process).
        pass
    return True
