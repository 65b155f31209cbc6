"""Stand-in of vllm/model_executor/model_loader/reload/layerwise.py (see ../../../../README.md).

Written for the tests from upstream @ 01424e4b (not copied). What it reproduces, per layer (a
module with its own parameters, `recurse=False`):

- `record_metadata_for_reloading(model)` (the model loader calls it once the layers are created,
  before loading and processing): the checkpoint-format parameters as meta tensors, with their
  attributes (`weight_loader`...), in `LAYERWISE_INFO[layer].restore_metadata`.
- `initialize_layerwise_reload(model)`: keeps the live ("kernel") parameters aside, puts
  checkpoint-format meta parameters in their place and wraps their weight loaders: a load is
  buffered and counted; when a layer has received as many elements as it has, it is processed
  at once (materialized, the buffered loads run with the original loaders,
  `quant_method.process_weights_after_loading(layer)`, the results copied into the kernel
  tensors' storage, the kernel tensors put back).
- `finalize_layerwise_reload(model, model_config)`: a layer that received nothing gets its kernel
  tensors back untouched; a layer that received part of its elements is processed (its unloaded
  elements are whatever materialization left: upstream's "Delayed processing"); attention
  layers (`Attention`, `MLAAttention`) are processed last, by
  `process_weights_after_loading(model_config.dtype)`.

A loader call counts the elements it writes, as upstream counts them per load
(`get_numel_loaded`, called so in reload/layerwise.py @ fc26ee2a): a layer handed part of a
parameter (one shard of a fused one) is processed once every element arrived, else at finalize
("Delayed processing").

Attention layers that received loads, per generation: "0.33" (@ 01424e4b) raises at finalize
("Layerwise loading of attention layers is not supported"); "main" (the newer layerwise.py,
stored file id 51768495098: `_finalize_attention_layer` / `_reload_attention_scales`) puts the
kernel tensors back and reloads what was loaded only through the layer's quant method
(`create_weights(layer)`, the buffered loads, `process_weights_after_loading(layer)`, copied
into the kernel tensors); without a quant method the loads are dropped without a word.

Deviation: upstream binds some layers directly to their runtime tensors ("mapped layers") when
their layout matches the checkpoint's; here every layer takes the layerwise path (the outcome for
the tests' layers is the same).
"""

import functools
from weakref import WeakKeyDictionary

import torch

import vllm
from vllm.model_executor.layers.attention import Attention, MLAAttention, MMEncoderAttention
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

_DEFERRED_ATTENTION_TYPES = (Attention, MLAAttention, MMEncoderAttention)


class LayerReloadingInfo:
    def __init__(self):
        self.restore_metadata = ({}, {})  # (parameters, buffers) as meta tensors.
        self.kernel_tensors = None        # The live parameters while a reload is open.
        self.loaded_weights = []          # (parameter name, args, kwargs) buffered.
        self.load_numel = 0
        self.load_numel_total = None

    def can_load(self):
        return self.load_numel_total is not None

    def reset(self):
        self.kernel_tensors = None
        self.loaded_weights = []
        self.load_numel = 0
        self.load_numel_total = None


LAYERWISE_INFO = WeakKeyDictionary()


def get_layerwise_info(layer):
    if layer not in LAYERWISE_INFO:
        LAYERWISE_INFO[layer] = LayerReloadingInfo()
    return LAYERWISE_INFO[layer]


def _meta_like(tensor):
    meta = torch.nn.Parameter(torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"),
                              requires_grad=False)
    meta.__dict__.update({k: v for k, v in tensor.__dict__.items()})
    return meta


def record_metadata_for_reloading(model):
    for layer in model.modules():
        params = {n: _meta_like(p) for n, p in layer.named_parameters(recurse=False)}
        get_layerwise_info(layer).restore_metadata = (params, {})


def _original_loader(param):
    loader = getattr(param, "weight_loader", default_weight_loader)
    while getattr(loader, "__name__", "") == "online_process_loader":
        loader = loader.__wrapped__
    return loader


def _set_params(layer, params):
    for name in list(layer._parameters):
        del layer._parameters[name]
    for name, param in params.items():
        layer.register_parameter(name, param)


@torch.no_grad()
def initialize_layerwise_reload(model):
    for layer in model.modules():
        info = get_layerwise_info(layer)
        if info.can_load():
            continue
        info.kernel_tensors = dict(layer.named_parameters(recurse=False))
        restore = {n: _meta_like(m) for n, m in info.restore_metadata[0].items()}
        _set_params(layer, restore)
        info.load_numel = 0
        info.load_numel_total = sum(p.numel() for p in restore.values())
        for name, param in restore.items():
            param.weight_loader = _online_loader(layer, info, name, _original_loader(param))


def _online_loader(layer, info, name, original):
    @functools.wraps(original)
    def online_process_loader(param, *args, **kwargs):
        if not info.can_load():
            return None  # Loaded again after it was processed: upstream ignores it too.
        info.loaded_weights.append((name, args, kwargs))
        info.load_numel += _numel_written(original, param, args, kwargs)
        if isinstance(layer, _DEFERRED_ATTENTION_TYPES):
            return None
        if info.load_numel >= info.load_numel_total:
            _layerwise_process(layer, info)
        return None

    online_process_loader.__name__ = "online_process_loader"
    online_process_loader.__wrapped__ = original
    return online_process_loader


def _numel_written(original, param, args, kwargs):
    """The elements one call of the original loader writes (upstream's get_numel_loaded counts
    them; here the loader runs into a NaN-filled float64 scratch of the parameter's shape and
    attributes, and the elements it no longer holds NaN are counted)."""
    scratch = torch.nn.Parameter(torch.full(tuple(param.shape), float("nan"),
                                            dtype=torch.float64), requires_grad=False)
    scratch.__dict__.update({k: v for k, v in param.__dict__.items() if k != "weight_loader"})
    original(scratch, *args, **kwargs)
    return int((~torch.isnan(scratch)).sum())


@torch.no_grad()
def _layerwise_process(layer, info):
    kernel = info.kernel_tensors
    device = next(iter(kernel.values())).device if kernel else torch.device("cpu")
    materialized = {}
    for name, meta in info.restore_metadata[0].items():
        param = torch.nn.Parameter(torch.empty(meta.shape, dtype=meta.dtype, device=device),
                                   requires_grad=False)
        param.__dict__.update(meta.__dict__)
        param.weight_loader = _original_loader(meta)
        materialized[name] = param
    _set_params(layer, materialized)
    for name, args, kwargs in info.loaded_weights:
        param = getattr(layer, name)
        param.weight_loader(param, *args, **kwargs)
    quant_method = getattr(layer, "quant_method", None)
    if quant_method is not None:
        quant_method.process_weights_after_loading(layer)
    _copy_and_restore_kernel_tensors(layer, info)
    info.reset()


def _copy_and_restore_kernel_tensors(layer, info):
    for name, param in info.kernel_tensors.items():
        loaded = getattr(layer, name)
        if param.data_ptr() != loaded.data_ptr():
            param.data.copy_(loaded)
    _set_params(layer, info.kernel_tensors)


@torch.no_grad()
def finalize_layerwise_processing(model, model_config):
    deferred = []
    for layer in model.modules():
        info = get_layerwise_info(layer)
        if not info.can_load():
            continue
        if isinstance(layer, _DEFERRED_ATTENTION_TYPES):
            deferred.append((layer, info))
            continue
        if info.load_numel <= 0:
            _set_params(layer, info.kernel_tensors)
        elif info.load_numel < info.load_numel_total:
            _layerwise_process(layer, info)
        info.reset()
    for layer, info in deferred:
        if info.load_numel > 0 and vllm.STANDIN_GENERATION != "main":
            raise ValueError("Layerwise loading of attention layers is not supported. "
                             "Attention must always process after linears.")
        _set_params(layer, info.kernel_tensors)
        if info.load_numel > 0:
            _reload_attention_scales(layer, info)
        layer.process_weights_after_loading(model_config.dtype)
        info.reset()


def _reload_attention_scales(layer, info):
    """main: what an attention layer was loaded goes through its quant method (recreate its
    parameters, replay the buffered loads, process, copy into the kernel tensors); a layer
    without a quant method keeps its kernel tensors: the loads are dropped, silently."""
    quant_method = getattr(layer, "quant_method", None)
    if quant_method is None:
        return
    quant_method.create_weights(layer)
    for name, args, kwargs in info.loaded_weights:
        param = getattr(layer, name)
        _original_loader(param)(param, *args, **kwargs)
    quant_method.process_weights_after_loading(layer)
    _copy_and_restore_kernel_tensors(layer, info)


def finalize_layerwise_reload(*args, **kwargs):
    finalize_layerwise_processing(*args, **kwargs)
