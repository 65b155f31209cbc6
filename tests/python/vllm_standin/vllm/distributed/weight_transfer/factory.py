"""Stand-in of vllm/distributed/weight_transfer/factory.py (see ../../../README.md).

As in vllm-project/vllm after #50902 (v0.28.0 on, every generation of the stand-in; the same
calls in vllm/backends/distributed/weight_transfer/factory.py @ 055e47c2): two lazy registries,
`register_engine(name, module_path, class_name)` or `register_engine(name, cls)`, ValueError
"... is already registered." on a second registration of a name;
`WeightTransferEngineFactory.create_engine(config, vllm_config, device, model)` picks by
`config.backend`; `WeightTransferTrainerFactory.trainer_init(init_info, *, client, source=None)`
picks by `init_info.backend` (the TrainerInitInfo ClassVar) and calls the engine class's
`trainer_init(init_info=..., client=..., source=...)`. An unknown backend is a ValueError naming
the registered ones. The built-in nccl / ipc / sparse_nccl entries are left out.
"""

import importlib


class _Registry:
    _registry = None
    _what = "engine"

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None):
        if name in cls._registry:
            raise ValueError(f"Weight transfer {cls._what} '{name}' is already registered.")
        if isinstance(module_path_or_cls, str):
            if class_name is None:
                raise ValueError("class_name is required when registering with module path")
            module_path = module_path_or_cls

            def loader():
                return getattr(importlib.import_module(module_path), class_name)

            cls._registry[name] = loader
        else:
            engine_cls = module_path_or_cls
            cls._registry[name] = lambda: engine_cls

    @classmethod
    def _load(cls, backend):
        if backend not in cls._registry:
            raise ValueError(f"Invalid weight transfer backend: {backend}. "
                             f"Available {cls._what}s: {list(cls._registry)}")
        return cls._registry[backend]()


class WeightTransferEngineFactory(_Registry):
    _registry = {}

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        return cls._load(config.backend)(config, vllm_config, device, model)


class WeightTransferTrainerFactory(_Registry):
    _registry = {}
    _what = "trainer engine"

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        engine_cls = cls._load(init_info.backend)
        return engine_cls.trainer_init(init_info=init_info, client=client, source=source)
