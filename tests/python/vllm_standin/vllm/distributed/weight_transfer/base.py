"""Stand-in of vllm/distributed/weight_transfer/base.py (see ../../../README.md).

Names, fields and signatures as in vllm-project/vllm after the stateful trainer-send PRs
(#48042, #48981, #50902, released in v0.28.0; unchanged in v0.29.0):
  - worker `WeightTransferEngine(config, vllm_config, device, model)`: parse_init_info /
    parse_update_info (`init_info_cls(**dict)`, TypeError -> ValueError "Invalid init_info for
    <class>: ..."), abstract init_transfer_engine / start_weight_update / finish_weight_update /
    receive_weights / shutdown, update_weights = parse_update_info + receive_weights + a device
    synchronize, set/reset_weight_update_target, supports_draft_weight_update,
    defers_processing, and abort_weight_update (a no-op by default: "abort an active update and
    restore the serving model if needed", as m2n_engine.py @ 1825fdb3 overrides it);
    trainer_send_weights is still an abstract static method there (removed later);
  - `TrainerInitInfo`: a `backend` ClassVar every subclass must set (checked in
    __init_subclass__), `rank` keyword-only, `is_sender` = rank 0;
  - `ParamMeta`, `WeightSource` (metadata() + iteration), `ModuleSource(module)` (keeps the
    module as `_module`), the four-method `VLLMWeightSyncClient` protocol, and
    `TrainerWeightTransferEngine(*, client, source=None, is_sender=True)` with the classmethod
    `trainer_init(init_info, *, client, source=None)`, `send_weights()` and `shutdown()`
    (m2n_trainer.py @ 1ca6ac9f subclasses exactly these).
Two generations of the abort, chosen by `$VLLM_STANDIN_ABORT` (read at import):
  - "1" (default): abort_weight_update as above, with #57854's worker calling it on a failure;
  - "0": the releases (v0.28.0 / v0.29.0 and the base classes read up to 0.33: no
    abort_weight_update on WeightTransferEngine, nor anywhere in the worker): the class has no
    such method (`HAS_ABORT` False) and vllm_calls.Worker then reproduces the releases' worker
    (gpu_worker.py: a failed update_weights only clears the update flag and re-raises; a failed
    finish leaves it set).
Deviation: torch 1.13 has no `torch.accelerator`; update_weights synchronizes through it only
where it exists.
"""

import dataclasses
import os
from abc import ABC, abstractmethod
from typing import ClassVar, Protocol, runtime_checkable

import torch


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

    @staticmethod
    @abstractmethod
    def trainer_send_weights(iterator, trainer_args):
        raise NotImplementedError


HAS_ABORT = os.environ.get("VLLM_STANDIN_ABORT", "1") != "0"
if not HAS_ABORT:  # The releases' base class: no abort at all.
    del WeightTransferEngine.abort_weight_update


@runtime_checkable
class VLLMWeightSyncClient(Protocol):
    def init_weight_transfer_engine(self, init_info: dict) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: dict) -> None: ...

    def finish_weight_update(self) -> None: ...


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
