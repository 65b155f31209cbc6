"""Stand-in of vllm/distributed/weight_transfer/base.py (see ../../../README.md), one class set
per interface generation (`vllm.STANDIN_GENERATION`, from `$VLLM_STANDIN_VERSION`). Written for
the tests: names, fields, signatures and call sequences as read in vllm-project/vllm, no code.

Read (the stored copies of vllm-project/vllm; where the index gave no commit, its file id):
  - "0.33" (releases 0.32.x / 0.33.x, wsync's supported releases): base.py, stored file id
    57510213075: no `trainer_send_weights` on the worker ABC (removed by the stateful
    trainer-send series, vllm-project/vllm#47357 / #50902), no `abort_weight_update` anywhere,
    `defers_processing` + `drain_pending`, `VLLMWeightSyncClient.finish_weight_update(
    weight_version=None)`, `TrainerInitInfo` with the `backend` ClassVar checked in
    `__init_subclass__`, `TrainerWeightTransferEngine(*, client, source=None, is_sender=True)`
    with `trainer_init(init_info, *, client, source=None)`;
  - "main": base.py, stored file id 58770368394: the same, plus `abort_weight_update()` with a
    no-op default ("abort an active update and restore the serving model if needed"), the
    checkpoint vs runtime `weight_format` of the engine's config, the rank-local checkpoint
    filter (`rank_local_checkpoint_names` / `filter_rank_local_weights`, None unless
    `weight_format == "checkpoint"` and the model has an exact manifest: the stand-in has no
    manifest, so "legacy": None) and `RankLocalWeightSource`; no `defers_processing` there;
  - "0.29" (v0.28.x / v0.29.x, below the supported range): base.py @ 02f250b0 and the releases
    as the older stand-in read them: `trainer_send_weights` an abstract static method of the
    worker ABC, no abort, the client's finish without a version.
Shared by all: `WeightTransferEngine(config, vllm_config, device, model)`, parse_init_info /
parse_update_info (`cls(**dict)`, TypeError -> ValueError "Invalid init_info for <class>: ..."),
the abstract init_transfer_engine / start_weight_update / finish_weight_update /
receive_weights / shutdown, update_weights = parse + receive_weights + a device synchronize,
set/reset_weight_update_target, supports_draft_weight_update, `ParamMeta`, `WeightSource`,
`ModuleSource`. `HAS_ABORT`: whether the base class has `abort_weight_update` ("main" only).
Deviation: torch 1.13 has no `torch.accelerator`; update_weights synchronizes through it only
where it exists.
"""

import dataclasses
from abc import ABC, abstractmethod
from typing import ClassVar, Protocol, runtime_checkable

import torch

import vllm

GENERATION = vllm.STANDIN_GENERATION


def materialize_full_tensor(tensor):
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


@dataclasses.dataclass(frozen=True)
class ParamMeta:
    name: str
    dtype: torch.dtype
    shape: tuple


class WeightSource(ABC):
    @abstractmethod
    def metadata(self):
        raise NotImplementedError

    @abstractmethod
    def __iter__(self):
        raise NotImplementedError


class ModuleSource(WeightSource):
    def __init__(self, module):
        self._module = module

    def metadata(self):
        return [ParamMeta(n, p.dtype, tuple(p.shape)) for n, p in self._module.named_parameters()]

    def __iter__(self):
        for name, param in self._module.named_parameters():
            yield name, materialize_full_tensor(param)


@dataclasses.dataclass
class WeightTransferInitInfo(ABC):  # noqa: B024 - a marker base, as upstream.
    pass


@dataclasses.dataclass
class WeightTransferUpdateInfo(ABC):  # noqa: B024
    pass


@dataclasses.dataclass
class TrainerInitInfo:
    backend: ClassVar[str]
    rank: int = dataclasses.field(kw_only=True)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "backend", None):
            raise TypeError(f"{cls.__name__} must set a class-level `backend` string")

    @property
    def is_sender(self):
        return self.rank == 0


@dataclasses.dataclass
class WeightTransferInitRequest:
    init_info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class WeightTransferUpdateRequest:
    update_info: dict = dataclasses.field(default_factory=dict)


class WeightTransferEngine(ABC):
    init_info_cls: type
    update_info_cls: type
    supports_draft_weight_update: bool = True
    defers_processing: bool = False

    def __init__(self, config, vllm_config, device, model):
        self.config = config
        self.vllm_config = vllm_config
        self.parallel_config = vllm_config.parallel_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.model = model
        self._default_model_config = self.model_config
        self._default_model = model

    def drain_pending(self):
        pass

    def set_weight_update_target(self, model, model_config):
        self.model, self.model_config = model, model_config

    def reset_weight_update_target(self):
        self.model, self.model_config = self._default_model, self._default_model_config

    def parse_init_info(self, init_dict):
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError(f"Invalid init_info for {self.__class__.__name__}: {e}") from e

    def parse_update_info(self, update_dict):
        try:
            return self.update_info_cls(**update_dict)
        except TypeError as e:
            raise ValueError(f"Invalid update_info for {self.__class__.__name__}: {e}") from e

    @abstractmethod
    def init_transfer_engine(self, init_info):
        raise NotImplementedError

    @abstractmethod
    def start_weight_update(self):
        raise NotImplementedError

    @abstractmethod
    def finish_weight_update(self):
        raise NotImplementedError

    def abort_weight_update(self):
        """Abort an active update and restore the serving model if needed (default: nothing)."""

    def update_weights(self, update_info):
        self.receive_weights(self.parse_update_info(update_info))
        accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6 only.
        if accelerator is not None and accelerator.is_available():
            accelerator.synchronize()

    @abstractmethod
    def receive_weights(self, update_info):
        raise NotImplementedError

    @abstractmethod
    def shutdown(self):
        raise NotImplementedError

    if GENERATION == "0.29":  # Removed from the worker ABC in the newer generations.
        @staticmethod
        @abstractmethod
        def trainer_send_weights(iterator, trainer_args):
            raise NotImplementedError

    if GENERATION == "main":
        def rank_local_checkpoint_names(self):
            """Checkpoint names this rank loads, or None: always None here ("runtime" format;
            "checkpoint" with no exact manifest, upstream's "legacy" state: the stand-in's
            models record none)."""
            return None

        def filter_rank_local_weights(self, weights):
            allowed = self.rank_local_checkpoint_names()
            for name, tensor in weights:
                if allowed is None or name in allowed:
                    yield name, tensor


HAS_ABORT = GENERATION == "main"
if not HAS_ABORT:  # The releases' base class: no abort at all.
    del WeightTransferEngine.abort_weight_update
if GENERATION == "main":  # Not in main's base class as read.
    del WeightTransferEngine.defers_processing
    del WeightTransferEngine.drain_pending


@runtime_checkable
class VLLMWeightSyncClient(Protocol):
    def init_weight_transfer_engine(self, init_info: dict) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict) -> None: ...

    if GENERATION == "0.29":
        def finish_weight_update(self) -> None: ...
    else:
        def finish_weight_update(self, weight_version=None) -> None: ...


class TrainerWeightTransferEngine(ABC):
    init_info_cls: type

    def __init__(self, *, client, source=None, is_sender=True):
        self.is_sender = is_sender
        self.client = client
        self.source = source

    @classmethod
    @abstractmethod
    def trainer_init(cls, init_info, *, client, source=None):
        raise NotImplementedError

    @abstractmethod
    def send_weights(self):
        raise NotImplementedError

    def shutdown(self):
        pass
