"""Stand-in of the attention classes of vllm/model_executor/layers/attention/ that the layerwise
reload treats apart (`_DEFERRED_ATTENTION_TYPES` in model_loader/reload/layerwise.py @ 01424e4b):
`Attention` and `MLAAttention` are processed after every other layer, in
finalize_layerwise_reload, by their `process_weights_after_loading(act_dtype)`. Upstream's
MLAAttention keeps the `kv_b_proj` it is given (a registered submodule) and derives its
absorbed matrices W_UK_T / W_UV from `kv_b_proj.weight` there; subclasses in the tests do the
same with a stand-in formula."""

import torch


class Attention(torch.nn.Module):
    def process_weights_after_loading(self, act_dtype):
        pass


class MLAAttention(torch.nn.Module):
    def __init__(self, kv_b_proj):
        super().__init__()
        self.kv_b_proj = kv_b_proj

    def process_weights_after_loading(self, act_dtype):
        raise NotImplementedError


class MMEncoderAttention(Attention):
    pass
