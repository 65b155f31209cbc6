"""wsync in SGLang: a TP worker's adapter with SGLang's weight-update call shapes, and the two
entry points a stock SGLang server loads by name (see :mod:`wsync.sglang_hooks`):

- ``--custom-weight-loader wsync.sglang.load_weights``: the trainer posts
  ``/update_weights_from_tensor`` with ``load_format="wsync.sglang.load_weights"`` and the
  request :func:`update_request` builds; the first call connects the worker, each call is one
  wsync sync of the request's version.
- :func:`update_weights` (the trainer side, over SGLang's Engine or its HTTP client): SGLang's
  ``begin_weight_update`` / ``update_weights_from_tensor`` / ``end_weight_update`` session
  around every update where the engine has it, the target model only.

The loader refuses an SGLang outside :data:`SUPPORTED_SGLANG` with ``WsyncError(UNSUPPORTED)``
naming the version found and the range.

:class:`WsyncSGLangAdapter` keeps SGLang's ``init_weights_update_group`` /
``update_weights_from_distributed`` / ``destroy_weights_update_group`` shapes, ``(success,
message)`` results and argument meanings (python/sglang/srt/model_executor/model_runner.py and
weight_updater.py): ``world_size`` counts every process of the update group, the trainer side
included, and a worker's rank in it is ``rank_offset + tp_rank``. In wsync's job the trainers are
ranks ``[0, num_trainers)`` of that group (SGLang's single NCCL sender is rank 0: num_trainers =
1), so a worker's rollout rank is ``rank_offset + tp_rank - num_trainers`` of ``world_size -
num_trainers`` rollouts. One engine of TP 2 after 2 trainers: ``rank_offset=2, world_size=4``;
the next engine: ``rank_offset=4, world_size=6`` (world_size counts all engines).

``names``, ``dtypes`` and ``shapes`` of an update are accepted and ignored: the layout was agreed
at init. Pause and resume stay with the caller (the RL controller), as with NCCL.
"""

from . import layouts
from ._lib import Status, WsyncError
from .session import Session

DEFAULT_GROUP = "weight_update_group"  # SGLang's default group_name (io_struct.py).


def _merge(parts):
    """One Layout holding the pieces of every layout in `parts`."""
    merged = layouts.Layout()
    for part in parts:
        for piece in part.pieces:
            merged.add(piece.param, part.params[piece.param].shape, piece.origin, piece.view)
    return merged


class WsyncSGLangAdapter:
    def __init__(self, model, tp_rank, tp_size, model_config, rules=(), skip=(), ep_rank=0,
                 ep_size=1, attn_tp_rank=None, attn_tp_size=None, dp_lm_head=False,
                 w13_order="gate_up"):
        """model: the worker's torch module (SGLang's names); model_config: a
        wsync.layouts.ModelConfig, or a Hugging Face config (object or dict); ep_rank, ep_size:
        SGLang's MoE expert parallelism (--ep-size; each EP rank holds E / ep_size experts).

        DP attention (``--enable-dp-attention``, attention TP = tp / dp): pass the worker's
        attention-TP rank and size (SGLang's get_attention_tp_rank / _size). Its ``self_attn``
        parameters are then the attention-TP shard, the embedding is whole
        (VocabParallelEmbedding with ``enable_tp=not is_dp_attention_enabled()``), ``lm_head``
        the attention-TP shard under ``--enable-dp-lm-head`` and the TP shard otherwise, and
        everything else the TP shard. w13_order: "up_gate" where the MoE kernel keeps up before
        gate (wsync.layouts._w13_rules)."""
        if not isinstance(model_config, layouts.ModelConfig) and model_config is not None:
            model_config = layouts.ModelConfig.from_hf(model_config)
        self.model, self.tp_rank, self.tp_size = model, int(tp_rank), int(tp_size)
        self.model_config, self.rules, self.skip = model_config, list(rules), list(skip)
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.attn_tp_rank, self.attn_tp_size = attn_tp_rank, attn_tp_size
        self.dp_lm_head, self.w13_order = bool(dp_lm_head), w13_order
        self.session = None
        self.group_name = None
        self.version = -1
        self.weights_dirty = False

    def _part(self, named, tp_rank, tp_size):
        return layouts.sglang_layout(named, tp_rank, tp_size, self.model_config, self.rules,
                                     self.skip, self.ep_rank, self.ep_size, self.w13_order)

    def layout(self):
        """The worker's layout (wsync.layouts.sglang_layout; per group under DP attention)."""
        attn = self.attn_tp_size
        if attn is None or int(attn) == self.tp_size:
            return self._part(self.model, self.tp_rank, self.tp_size)
        attn_rank, attn = int(self.attn_tp_rank), int(attn)
        tp = (self.tp_rank, self.tp_size)
        groups = {"attention": (attn_rank, attn), "embedding": (0, 1),
                  "lm_head": (attn_rank, attn) if self.dp_lm_head else tp, "rest": tp}
        named = {key: [] for key in groups}
        for name, tensor in self.model.named_parameters():
            key = ("attention" if ".self_attn." in name else
                   "embedding" if "embed_tokens." in name else
                   "lm_head" if name.startswith("lm_head.") else "rest")
            named[key].append((name, tensor))
        return _merge([self._part(named[key], *groups[key]) for key in groups if named[key]])

    def rollout_rank(self, rank_offset, world_size, num_trainers):
        """(rollout rank, rollout count) of this worker under SGLang's rank_offset / world_size
        (which count the trainers); WsyncError(INVALID_ARGUMENT) when they do not fit."""
        rank = int(rank_offset) + self.tp_rank
        if num_trainers < 1 or not num_trainers <= rank < int(world_size):
            raise WsyncError(Status.INVALID_ARGUMENT,
                             f"rank_offset {rank_offset} + tp_rank {self.tp_rank} = {rank} is not a "
                             f"rollout rank of world_size {world_size} after {num_trainers} "
                             "trainer(s) (SGLang's world_size counts the trainers, which hold "
                             f"ranks 0..{num_trainers - 1})", "init_weights_update_group")
        return rank - num_trainers, int(world_size) - num_trainers

    def connect(self, master_address, master_port, rank_offset, world_size,
                group_name=DEFAULT_GROUP, backend="wsync", num_trainers=1, job_id=None,
                secret_env=None, secret_file=None, deadline_seconds=None,
                path_transports=None):
        """init_weights_update_group, raising WsyncError instead of returning (False, ...)."""
        if backend not in ("wsync", None):
            raise WsyncError(Status.INVALID_ARGUMENT,
                             f"backend {backend!r}: this adapter speaks wsync only", "init")
        if self.session is not None:
            raise WsyncError(Status.INVALID_ARGUMENT,
                             f"weights update group {self.group_name} is already initialized",
                             "init")
        rank, num_rollouts = self.rollout_rank(rank_offset, world_size, int(num_trainers))
        layout = self.layout()
        session = Session("rollout", rank=rank, num_trainers=int(num_trainers),
                          num_rollouts=num_rollouts, job_id=job_id or group_name,
                          coordinator=f"{master_address}:{int(master_port)}",
                          secret_env=None if secret_file else secret_env,
                          secret_file=secret_file, deadline_seconds=deadline_seconds,
                          path_transports=path_transports)
        try:
            layout.register(session)
            session.connect()
        except BaseException:
            session.finalize()
            raise
        self.session, self.group_name = session, group_name

    def sync(self, version):
        """One wsync sync of `version`; raises WsyncError (the weights are then marked dirty:
        wsync wrote some of them, and the worker must not serve until a later sync commits)."""
        if self.session is None:
            raise WsyncError(Status.INVALID_ARGUMENT,
                             "init_weights_update_group has not been called", "sync")
        try:
            self.session.sync(int(version))
        except WsyncError:
            self.weights_dirty = True
            raise
        self.version, self.weights_dirty = int(version), False

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size,
                                  group_name=DEFAULT_GROUP, backend="wsync", **wsync_args):
        """SGLang's call; wsync_args: num_trainers, job_id, secret_env, secret_file,
        deadline_seconds, path_transports (see connect)."""
        try:
            self.connect(master_address, master_port, rank_offset, world_size, group_name,
                         backend, **wsync_args)
        except WsyncError as error:
            return False, str(error)
        return True, "Succeeded to initialize the wsync weights update group."

    def update_weights_from_distributed(self, names=None, dtypes=None, shapes=None,
                                        group_name=DEFAULT_GROUP, version=None, load_format=None,
                                        flush_cache=True):
        if self.session is None:
            return False, "init_weights_update_group has not been called"
        if group_name != self.group_name:
            return False, f"unknown weights update group {group_name!r}"
        if version is None:
            return False, "wsync needs the version of the update"
        try:
            self.sync(version)
        except WsyncError as error:
            return False, str(error)  # The worker is DIRTY: do not resume generation.
        return True, f"Succeeded to update weights to version {version}."

    def destroy_weights_update_group(self, group_name=DEFAULT_GROUP):
        if self.session is None or group_name != self.group_name:
            return False, f"unknown weights update group {group_name!r}"
        session, self.session = self.session, None
        session.finalize()
        return True, "Succeeded to destroy the wsync weights update group."


# The entry points a stock SGLang server imports by name (after the adapter they build on).
from .sglang_hooks import (SUPPORTED_SGLANG, check_sglang_version, load_weights,  # noqa: E402
                           update_request, update_weights)

__all__ = ["DEFAULT_GROUP", "SUPPORTED_SGLANG", "WsyncSGLangAdapter", "check_sglang_version",
           "load_weights", "update_request", "update_weights"]
