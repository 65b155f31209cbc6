"""wsync beside SGLang's update_weights_from_distributed.

SGLang's RL flow (ModelRunner / the HTTP server) is:

  POST /init_weights_update_group   {master_address, master_port, rank_offset, world_size,
                                     group_name, backend}
  POST /pause_generation            (the controller pauses serving)
  POST /update_weights_from_distributed  {names, dtypes, shapes, group_name, flush_cache}
  POST /continue_generation

:class:`WsyncSGLangAdapter` keeps those call shapes on each TP worker (method names and
``(success, message)`` results as ModelRunner's), with wsync underneath: init registers the
worker's parameters in place (SGLang uses vLLM's fused module names) and connects to the wsync
coordinator at ``master_address:master_port``; each update is one wsync sync of ``version``.
Pause and resume stay with the caller (the RL controller), as with NCCL.

The controller's requests (one engine of 2 TP workers, rollout ranks 0-1, 2 trainers):

  {"master_address": "trainer-0", "master_port": 29700, "rank_offset": 0, "world_size": 2,
   "group_name": "wsync", "backend": "wsync", "num_trainers": 2}
  {"group_name": "wsync", "version": 7, "flush_cache": true}

Unlike an NCCL group, ``world_size`` counts rollout processes only (trainers are
``num_trainers``), and a worker's rollout rank is ``rank_offset + tp_rank``. ``names``, ``dtypes``
and ``shapes`` are accepted and ignored: the layout was agreed at init.
"""

from . import layouts
from ._lib import WsyncError
from .session import Session


class WsyncSGLangAdapter:
    def __init__(self, model, tp_rank, tp_size, model_config, rules=(), skip=(), ep_rank=0,
                 ep_size=1):
        """model: the worker's torch module (SGLang's names); model_config: a
        wsync.layouts.ModelConfig, or a Hugging Face config (object or dict); ep_rank, ep_size:
        SGLang's MoE expert parallelism (--ep-size; each EP rank holds E / ep_size experts)."""
        if not isinstance(model_config, layouts.ModelConfig) and model_config is not None:
            model_config = layouts.ModelConfig.from_hf(model_config)
        self.model, self.tp_rank, self.tp_size = model, tp_rank, tp_size
        self.model_config, self.rules, self.skip = model_config, list(rules), list(skip)
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.session = None
        self.group_name = None

    def layout(self):
        """The worker's layout (wsync.layouts.sglang_layout)."""
        return layouts.sglang_layout(self.model, self.tp_rank, self.tp_size, self.model_config,
                                     self.rules, self.skip, self.ep_rank, self.ep_size)

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size,
                                  group_name="wsync", backend="wsync", num_trainers=1,
                                  job_id=None, secret_env="WSYNC_SECRET", secret_file=None,
                                  deadline_seconds=60.0, path_transports=None):
        if backend not in ("wsync", None):
            return False, f"backend {backend!r}: this adapter speaks wsync only"
        if self.session is not None:
            return False, f"weights update group {self.group_name} is already initialized"
        session = None
        try:
            layout = self.layout()
            session = Session("rollout", rank=rank_offset + self.tp_rank,
                              num_trainers=num_trainers, num_rollouts=world_size,
                              job_id=job_id or group_name,
                              coordinator=f"{master_address}:{master_port}",
                              secret_env=None if secret_file else secret_env,
                              secret_file=secret_file, deadline_seconds=deadline_seconds,
                              path_transports=path_transports)
            layout.register(session)
            session.connect()
        except WsyncError as error:
            if session is not None:
                session.finalize()
            return False, str(error)
        self.session, self.group_name = session, group_name
        return True, "Succeeded to initialize the wsync weights update group."

    def update_weights_from_distributed(self, names=None, dtypes=None, shapes=None,
                                        group_name="wsync", version=None, load_format=None,
                                        flush_cache=True):
        if self.session is None:
            return False, "init_weights_update_group has not been called"
        if group_name != self.group_name:
            return False, f"unknown weights update group {group_name!r}"
        if version is None:
            return False, "wsync needs the version of the update"
        try:
            self.session.sync(version)
        except WsyncError as error:
            return False, str(error)  # The worker is DIRTY: do not resume generation.
        return True, f"Succeeded to update weights to version {version}."

    def destroy_weights_update_group(self, group_name="wsync"):
        if self.session is None or group_name != self.group_name:
            return False, f"unknown weights update group {group_name!r}"
        session, self.session = self.session, None
        session.finalize()
        return True, "Succeeded to destroy the wsync weights update group."
