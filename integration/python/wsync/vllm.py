"""wsync as a vLLM weight-transfer backend ("wsync"): the worker side.

Targets the vLLM versions in :data:`SUPPORTED_VLLM`: the releases 0.32.x and 0.33.x and vLLM
main's development builds after 0.33.0 (0.33.1.devN; the worker-side ``WeightTransferEngine`` of
``vllm/distributed/weight_transfer/base.py`` without ``trainer_send_weights``, the stateful
``TrainerWeightTransferEngine``; the tests' stand-ins mirror both generations).
:func:`register` never raises (vLLM calls every general plugin in every process without
catching, whatever backend is configured); a vLLM outside the range is refused, naming both
versions, only where the "wsync" backend is selected: when vLLM builds the worker engine and at
the trainer's ``trainer_init``.

vLLM's worker creates the engine with ``WeightTransferEngineFactory.create_engine(config,
vllm_config, device, model)`` and calls, per the WeightTransferEngine interface:

  init_transfer_engine(parse_init_info(init_info))       once (the RL controller's init RPC,
                                                          sent by the trainer engine's rank 0)
  start_weight_update()                                  each step
  update_weights(update_info) -> parse_update_info + receive_weights (+ device synchronize)
  finish_weight_update()                                 or, after a failure, abort_weight_update()
  shutdown()

Each parameter lands one of two ways, chosen at connect (``wsync.vllm_loader``): **direct**
ones are registered in place (no copy of the weights: the plugin writes the fused qkv_proj /
gate_up_proj / vocabulary shards directly); parameters vLLM post-processes after loading
(quantized layers, MLA's kv_b_proj, a layout changed since load) land **through the loader**:
wsync writes their checkpoint-format tensors into staging, and the worker hands them to
``model.load_weights`` inside vLLM's layerwise reload bracket. ``receive_weights`` is one
wsync sync of ``update_info.version``, which every trainer rank joins
(``wsync.vllm_trainer.WsyncTrainerWeightTransferEngine.send_weights``), with that loader step:
``loader_stream="whole"`` runs it after the sync committed (a failed sync hands nothing over);
``"layer"`` streams the sync in waves, one per decoder layer, and the wave callback hands each
wave to ``load_weights`` inside one bracket opened before the first loader wave and closed after
the sync, committed or failed (a failed streamed sync may leave earlier layers at the new
version: dirty either way); ``"auto"`` (default) streams only when the whole staging is over
``loader_staging_budget_bytes``.

A failed or aborted sync (or a failed loader step) leaves the weights dirty: ``weights_dirty``
is True, every later ``finish_weight_update`` raises ("do not serve") and
``abort_weight_update`` logs it, until a later sync commits. An abort while a sync runs fails
that sync on every process (the trainers' sends end too); the aborted session is replaced (same
rank, same layout) as soon as that sync has ended (else at the next ``start_weight_update``),
without reconnecting the rest of the job.

Trust: an init request (vLLM's RLHF route hands any HTTP client's ``init_info`` to the workers)
never chooses the secret source, the coordinator or rule regexes: the worker takes them from
the engine process's environment (:class:`LaunchConfig`), and ``parse_init_info`` refuses a
request naming them (:data:`LAUNCH_ONLY_FIELDS`).

Registration: the ``vllm.general_plugins`` entry point ``wsync = wsync.vllm:register`` registers
"wsync" with both of vLLM's factories (worker and trainer). vLLM is imported only in this module
and ``wsync.vllm_trainer``, and only when present; without it the info classes are plain
dataclasses and the engines work against any torch module with vLLM's parameter names.
"""

import dataclasses
import logging
import re
from typing import Any, List, Optional

from . import layouts, vllm_loader
from ._lib import State, Status, WsyncError
from .session import Session
from .vllm_trust import LAUNCH_ONLY_FIELDS, LaunchConfig, refuse_launch_only_fields  # noqa: F401

logger = logging.getLogger("wsync.vllm")

# The vLLM versions wsync's backend supports (the one place the range is stated; what the tests'
# stand-ins mirror): the releases 0.32.x / 0.33.x and main's builds after 0.33.0 (0.33.1.devN).
# ">=MIN,<MAX".
SUPPORTED_VLLM = ">=0.32.0,<0.34.0"

try:  # vLLM's classes when vLLM is installed; plain stand-ins with the same calls otherwise.
    from vllm.distributed.weight_transfer.base import (  # noqa: F401
        TrainerInitInfo as _TrainerInitBase,
        TrainerWeightTransferEngine as _TrainerEngineBase,
        WeightTransferEngine as _Base,
        WeightTransferInitInfo as _InitBase,
        WeightTransferUpdateInfo as _UpdateBase,
    )
    HAVE_VLLM = True
except Exception:  # noqa: BLE001 - ImportError, or a vLLM without this interface.
    HAVE_VLLM = False

    @dataclasses.dataclass
    class _InitBase:
        pass

    @dataclasses.dataclass
    class _UpdateBase:
        pass

    @dataclasses.dataclass
    class _TrainerInitBase:
        rank: int = dataclasses.field(kw_only=True)

        @property
        def is_sender(self):
            return self.rank == 0

    class _TrainerEngineBase:
        def __init__(self, *, client, source=None, is_sender=True):
            self.client = client
            self.source = source
            self.is_sender = is_sender

        def shutdown(self):
            pass

    class _Base:
        supports_draft_weight_update = True
        defers_processing = False

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

        def abort_weight_update(self):
            pass


def _version_tuple(text):
    """(major, minor, patch) of a version string ('0.28.1', '0.29.0rc1', '0.28.0+cu130'), or
    None when it does not start with one."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def vllm_version():
    """The installed vLLM's __version__, or None without vLLM."""
    try:
        import vllm
    except Exception:  # noqa: BLE001
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def _supported_bounds(spec=SUPPORTED_VLLM):
    """(inclusive minimum, exclusive maximum) version tuples of a ">=A,<B" range."""
    match = re.fullmatch(r">=([^,]+),<(.+)", spec)
    return _version_tuple(match.group(1)), _version_tuple(match.group(2))


VLLM_MIN, VLLM_MAX = _supported_bounds()


def vllm_version_supported(version):
    """Whether a vLLM version string is inside SUPPORTED_VLLM."""
    parsed = _version_tuple(version) if version is not None else None
    return parsed is not None and VLLM_MIN <= parsed < VLLM_MAX


def unsupported_vllm_message(version):
    return f"wsync's vLLM backend supports vLLM {SUPPORTED_VLLM}; found vLLM {version}"


def check_vllm_version(version=None, call="create_engine"):
    """Raises WsyncError(UNSUPPORTED) naming `version` (default: the installed vLLM's) and the
    supported range when it is outside it. Called where the "wsync" backend is selected."""
    version = vllm_version() if version is None else version
    if not vllm_version_supported(version):
        raise WsyncError(Status.UNSUPPORTED, unsupported_vllm_message(version), call)
    return version


@dataclasses.dataclass
class WsyncInitInfo(_InitBase):
    """The worker's init request (JSON-able), sent by the trainer engine's rank 0 (or by any RL
    controller) through the engine's init route. It carries the job's shape, never trust: the
    secret source, the coordinator and the rule regexes are the engine's launch configuration
    (:class:`LaunchConfig`, read from the engine process's environment), and a request naming
    one of :data:`LAUNCH_ONLY_FIELDS` is refused by ``parse_init_info``."""
    coordinator: Optional[str]  # must be the launch's WSYNC_COORDINATOR_HOST:_PORT (or None)
    num_trainers: int
    num_rollouts: int                # rollout processes of the job (all engines' workers)
    job_id: str = "wsync"
    rank: Optional[int] = None       # this worker's rollout rank; default: dp * tp + tp_rank
    tp_rank: Optional[int] = None    # default: vLLM's tensor-parallel rank
    tp_size: Optional[int] = None    # default: parallel_config.tensor_parallel_size
    deadline_seconds: Optional[float] = None  # None: the setting (WSYNC_DEADLINE_SECONDS, 60)
    path_transports: Optional[str] = None
    staging_budget_bytes: int = 0
    node_id: Optional[str] = None
    # Expert parallelism; defaults from vLLM's parallel_config: with enable_expert_parallel,
    # ep_size = tp * data_parallel_size and ep_rank = the rollout rank (vLLM's
    # FusedMoEParallelConfig), placement = expert_placement_strategy (default "linear").
    ep_size: Optional[int] = None
    ep_rank: Optional[int] = None
    expert_placement: Optional[str] = None
    loader_staging_budget_bytes: int = 0  # 0: unbounded; else refuse a larger staging
    # "auto" | "layer" | "whole": how the loader step runs (wsync.vllm_loader's docstring).
    loader_stream: str = "auto"


@dataclasses.dataclass
class WsyncUpdateInfo(_UpdateBase):
    """One update: the version to receive. vLLM's generic per-round fields are accepted and
    ignored (names, dtypes and shapes were agreed at init)."""
    version: int
    names: Optional[List[str]] = None
    dtype_names: Optional[List[str]] = None
    shapes: Optional[List[Any]] = None


def _vllm_tp():
    try:
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)
        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001 - no vLLM, or its TP group is not initialized here.
        return None, None


def make_rules(extra_rules):
    """layouts.Rule objects from JSON rows [pattern, kind, target...]."""
    return [layouts.Rule(r[0], r[1], tuple(r[2:]) if len(r) > 3 else r[2]) for r in extra_rules]


def session_options(info, trust=None):
    """The Session keywords of an init info: the job's fields from `info`, the coordinator and
    the secret source from `trust` (the worker's LaunchConfig; default `info`: the trainer's)."""
    trust = info if trust is None else trust
    return dict(job_id=info.job_id, coordinator=trust.coordinator,
                secret_file=trust.secret_file,
                secret_env=None if trust.secret_file else trust.secret_env,
                deadline_seconds=info.deadline_seconds, path_transports=info.path_transports,
                staging_budget_bytes=info.staging_budget_bytes, node_id=info.node_id)


class WsyncWeightTransferEngine(_Base):
    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo
    # The layout is registered against the model this engine was built for (in place), so it
    # cannot be retargeted at a draft model mid-flight.
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        if HAVE_VLLM:
            check_vllm_version()
        super().__init__(config, vllm_config, device, model)
        self.session = None
        self.layout = None
        self.landing = None          # vllm_loader.Landing: the two ways, the staging.
        self.version = -1
        self.launch = None           # LaunchConfig: what the engine trusts, read at init.
        self._init_info = None
        self._rank = None
        self._dirty = False          # A failed or aborted sync since the last commit.
        self._replace = False        # The session was aborted: replace it before the next sync.
        self._abort_requested = None  # A reason, when abort came before the sync started.
        self._syncing = False        # receive_weights is inside a sync (abort may come meanwhile).
        self._wave_loader = None     # vllm_loader.WaveLoader of the streamed sync running now.
        self._waves_loaded = 0       # Loader waves the last streamed sync handed the model.

    # -- worker side ------------------------------------------------------------------------------
    def _model_config(self):
        hf = getattr(self.model_config, "hf_config", None) if self.model_config is not None \
            else None
        return layouts.ModelConfig.from_hf(hf) if hf is not None else None

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

    def _ranks(self, init_info):
        """(rollout rank, tp_rank, tp_size): the request's, else vLLM's (the TP group when it is
        initialized, else parallel_config: `rank` within the DP group, `data_parallel_index`
        (`data_parallel_rank` before it) for the DP group, as nccl_common's
        worker_init_process_group numbers workers)."""
        pc = self.parallel_config
        vrank, vsize = _vllm_tp()
        tp_size = init_info.tp_size or vsize or getattr(pc, "tensor_parallel_size", 1) or 1
        tp_rank = init_info.tp_rank
        if tp_rank is None:
            tp_rank = vrank if vrank is not None else (getattr(pc, "rank", 0) or 0) % tp_size
        rank = init_info.rank
        if rank is None:
            dp = getattr(pc, "data_parallel_index", None)
            if dp is None:
                dp = getattr(pc, "data_parallel_rank", 0)
            rank = (dp or 0) * tp_size + tp_rank
        return rank, tp_rank, tp_size

    def parse_init_info(self, init_dict):
        """vLLM's parse of the init route's dict; a field only the launch configuration may set
        (LAUNCH_ONLY_FIELDS) is refused, naming it."""
        refuse_launch_only_fields(init_dict)
        return super().parse_init_info(init_dict)

    def init_transfer_engine(self, init_info):
        if self.session is not None:
            raise WsyncError(Status.INVALID_ARGUMENT, "the transfer engine is initialized",
                             "init_transfer_engine")
        launch = LaunchConfig.from_environment()
        launch.check_request(init_info)
        rank, tp_rank, tp_size = self._ranks(init_info)
        ep_size, ep_rank, placement = self._expert_parallel(init_info, tp_size, rank)
        self.landing = vllm_loader.vllm_landing(
            self.model, tp_rank, tp_size, self._model_config(),
            rules=make_rules(launch.extra_rules), landing_rules=launch.landing_rules,
            skip=launch.skip, ep_rank=ep_rank, ep_size=ep_size, expert_placement=placement,
            staging_budget_bytes=init_info.loader_staging_budget_bytes,
            stream=init_info.loader_stream)
        self.layout = self.landing.layout
        self._init_info, self._rank, self.launch = init_info, rank, launch
        self.session = self._open_session()

    def _open_session(self):
        info = self._init_info
        session = Session("rollout", rank=self._rank, num_trainers=info.num_trainers,
                          num_rollouts=info.num_rollouts, **session_options(info, self.launch))
        try:
            self.layout.register(session)
            if self.landing.streamed:
                session.set_wave_callback(self._on_wave)
            session.connect()
        except BaseException:
            session.finalize()
            raise
        return session

    def _replace_session(self):
        """A new session at this rank and layout for one an abort closed: the coordinator admits
        it in place of the lost process; the others reach it after the next sync's trigger."""
        old, self.session = self.session, None
        if old is not None:
            try:
                old.finalize()
            except WsyncError as error:
                logger.warning("wsync: finalizing the aborted session: %s", error)
        self.session = self._open_session()
        self._replace = False
        logger.info("wsync: rollout rank %d rejoined the job after an abort", self._rank)

    def start_weight_update(self):
        """In place: nothing to prepare, except a session an abort closed whose replacement
        failed when the aborted sync ended: it is tried again here (raising if it fails)."""
        if not self._replace:
            self._require("start_weight_update")
        self._abort_requested = None
        if self._replace:
            self._replace_session()

    def receive_weights(self, update_info):
        session = self._require("receive_weights")
        version = int(update_info.version)
        if self._abort_requested is not None:
            self._dirty = True
            raise WsyncError(Status.ABORTED, f"version {version} was aborted before it started: "
                                             f"{self._abort_requested}", "receive_weights")
        moved = self.landing.moved_parameters(self.model)
        if moved:  # E.g. a sleep / wake up reallocated them: sync into their new storage.
            unbound = self.landing.rebind_moved(self.model, session)
            if unbound:  # Never write memory the model gave up (the trainers time out here).
                self._dirty = True
                raise WsyncError(Status.UNSUPPORTED, f"the storage of {len(unbound)} directly "
                                 f"landed parameter(s) moved other than whole since connect "
                                 f"({', '.join(unbound[:3])}...): a storage that changed size, "
                                 "offset or was split cannot be rebound: initialize a new "
                                 "transfer engine", "receive_weights")
            logger.info("wsync: rollout rank %d: %d moved parameter(s) rebound in place",
                        self._rank, len(moved))
        self._syncing = True
        waves = vllm_loader.WaveLoader(self.landing, self.model, self.model_config) \
            if self.landing.streamed else None
        self._wave_loader, self._waves_loaded = waves, 0
        try:
            session.sync(version)
        except BaseException:
            self._syncing = False
            self._dirty = True
            self._wave_loader = None
            self._close_waves(waves, version)
            if self._replace:
                # Replaced at once, before the trainers start the next round: a process entering
                # a sync while this rank is lost fails it. A failure here is retried at the next
                # start_weight_update; the sync's own error is the one raised.
                try:
                    self._replace_session()
                except Exception as error:  # noqa: BLE001
                    logger.warning("wsync: replacing the aborted session: %s", error)
            raise
        finally:
            self._syncing = False
            self._wave_loader = None
        try:
            if waves is None:
                self.landing.apply(self.model, self.model_config)
            else:
                waves.close()
        except BaseException:
            self._dirty = True
            logger.error("wsync: version %d committed, but handing the loader parameters to the "
                         "model failed: rollout rank %s holds dirty weights", version, self._rank)
            raise
        self.version = version
        self._dirty = False

    def _on_wave(self, version, wave):
        """The session's wave callback (streamed landing): hands wave `wave` to the model. A
        raise fails the sync on every process."""
        waves = self._wave_loader
        if waves is None:
            raise WsyncError(Status.INTERNAL, f"wave {wave} of version {version} landed outside "
                             "receive_weights", "wave")
        waves.load(version, wave)
        self._waves_loaded = len(waves.loaded)

    def _close_waves(self, waves, version):
        """Ends a failed streamed sync's reload bracket (never raises: the sync's error is the
        one raised); the weights are dirty already."""
        if waves is None:
            return
        try:
            waves.close()
        except Exception as error:  # noqa: BLE001
            logger.error("wsync: closing the reload bracket of failed version %d: %s", version,
                         error)
        if waves.loaded:
            logger.error("wsync: version %d failed after %d loader wave(s) were handed to the "
                         "model: rollout rank %s holds layers of two versions", version,
                         len(waves.loaded), self._rank)

    def finish_weight_update(self):
        self._require("finish_weight_update")
        if self.weights_dirty:
            state, version = self.session.state()
            raise WsyncError(Status.ABORTED, f"the last weight update failed or was aborted "
                                             f"(state {state.name}, last committed version "
                                             f"{version}); do not serve", "finish_weight_update")

    def abort_weight_update(self):
        """The abort of an active update (vLLM main's base class declares it, a no-op default;
        no vLLM worker read calls it, and vLLM's serialized RPCs cannot deliver it while
        update_weights runs: a thread of the worker process can). The weights stay dirty until
        a later sync commits; a sync running now (on another thread) is failed on every
        process, so the trainers' sends end too. Never raises: it runs where the caller is
        already failing."""
        self._dirty = True
        session = self.session
        if session is None:
            return
        reason = "abort_weight_update on a vLLM worker"
        try:
            if self._syncing or session.state()[0] == State.SYNCING:
                # Closes this process's control connection: the job fails the sync everywhere
                # at once; the session is replaced when the aborted sync has ended.
                self._replace = True  # Before the abort: the sync thread reads it on failing.
                session.abort(reason)
            else:  # No sync running here: one about to start (another thread) fails up front.
                self._abort_requested = reason
        except Exception as error:  # noqa: BLE001
            logger.error("wsync: abort_weight_update: %s", error)
        logger.error("wsync: the weight update was aborted; rollout rank %s holds dirty weights "
                     "(last committed version %d) and must not serve", self._rank, self.version)

    @property
    def sync_in_flight(self):
        return self._syncing

    @property
    def weights_dirty(self):
        """True after a failed or aborted sync, until a later one commits: do not serve."""
        if self._dirty:
            return True
        if self.session is None:
            return False
        return self.session.state()[0] == State.DIRTY

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
        """The session's stats of the last sync, with the bytes landing each way per sync
        (direct_bytes, loader_bytes), the loader staging held (loader_staging_bytes) and the
        parameter counts (direct_parameters, loader_parameters); the loader step's mode
        (loader_stream: "whole" or "layer"), its waves (loader_waves; loader_waves_loaded: those
        the last streamed sync handed the model), loader_largest_wave_bytes (the pool) and
        loader_whole_staging_bytes (what whole staging takes)."""
        stats = self._require("stats").stats()
        stats.update(self.landing.report())
        stats["loader_waves_loaded"] = self._waves_loaded
        return stats

    def landing_report(self):
        """{local parameter name: (way, reason)}: how each parameter lands (streamed, a loader
        parameter's reason ends with its wave and layer)."""
        return self.landing.ways_report() if self.landing is not None else {}

    def _require(self, call):
        if self.session is None:
            raise WsyncError(Status.INVALID_ARGUMENT,
                             "the session was aborted and could not be replaced yet (the next "
                             "start_weight_update tries again)" if self._replace else
                             "init_transfer_engine has not been called", call)
        return self.session

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        """Not a vLLM hook any more (the worker ABC's static trainer hook was removed upstream;
        the supported versions have none). The stateful WsyncTrainerWeightTransferEngine
        replaces it; kept for callers that hold a TrainerSync:
        trainer_args = {"sync": TrainerSync, "version": int}. The iterator is not
        consumed (wsync reads the registered parameters in place)."""
        sync, version = trainer_args["sync"], trainer_args["version"]
        return sync.push(version)


def register():
    """The vllm.general_plugins entry point: registers "wsync" with vLLM's worker factory and
    its trainer factory. Never raises: vLLM runs every general plugin in every process of every
    `vllm serve` without catching (vllm/plugins/__init__.py, load_general_plugins), so a raise
    here would stop vLLM whatever backend it uses. Returns True when "wsync" is registered,
    False otherwise (no vLLM, a vLLM without weight-transfer factories, or a registration that
    failed: logged). A vLLM outside SUPPORTED_VLLM is logged here and still registered, so that
    selecting the "wsync" backend is refused by wsync's engines, naming both versions
    (check_vllm_version), instead of by vLLM as an unknown backend."""
    try:
        return _register()
    except Exception as error:  # noqa: BLE001 - never stop vLLM's start-up.
        logger.warning("wsync: not registered as a vLLM weight-transfer backend: %s: %s",
                       type(error).__name__, error)
        return False


def _register():
    version = vllm_version()
    if version is None:
        return False
    try:
        from vllm.distributed.weight_transfer import factory
    except Exception as error:  # noqa: BLE001 - a vLLM without weight-transfer engines.
        logger.info("wsync: vLLM %s has no weight-transfer factory (%s); backend \"wsync\" not "
                    "registered (wsync supports vLLM %s)", version, error, SUPPORTED_VLLM)
        return False
    if not vllm_version_supported(version):
        logger.warning("wsync: %s; the \"wsync\" weight-transfer backend will refuse to start "
                       "(other backends are unaffected)", unsupported_vllm_message(version))
    registered = False
    for registry, module, name in (
            (getattr(factory, "WeightTransferEngineFactory", None), "wsync.vllm",
             "WsyncWeightTransferEngine"),
            (getattr(factory, "WeightTransferTrainerFactory", None), "wsync.vllm_trainer",
             "WsyncTrainerWeightTransferEngine")):
        if registry is None:
            logger.warning("wsync: vLLM %s has no %s: %s not registered", version,
                           "WeightTransferTrainerFactory" if "trainer" in module else
                           "WeightTransferEngineFactory", name)
            continue
        try:
            registry.register_engine("wsync", module, name)
        except ValueError:  # Already registered (the plugin loads once per process).
            pass
        registered = True
    return registered
