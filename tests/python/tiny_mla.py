"""A tiny vLLM-style model whose parameters land both ways (written for the tests): MLA-like
decoder layers (one by default, `layers` of them) with vLLM's parameter names and loading
machinery, TP-sharded, and with `head=True` a quantized ``lm_head`` outside the layers.

- ``input_layernorm.weight`` (replicated) and ``mlp.down_proj.weight`` / ``.bias``
  (RowParallelLinear, unquantized): live parameters are plain slices of the checkpoint tensors
  (direct).
- ``self_attn.kv_b_proj.weight`` (ColumnParallelLinear): a plain slice too, but the layer's
  MLAAttention derives W_UK_T / W_UV from it in ``process_weights_after_loading``, as vLLM's
  MLA does (loader).
- ``self_attn.o_proj.weight`` (RowParallelLinear with a stand-in quantization method): after
  loading, the method rounds the weight to a 1/16 grid and stores it transposed, a kernel layout
  no affine view of the checkpoint gives (loader).
- with ``shuffled_down=True``, ``mlp.down_proj`` has an unquantized method that reorders its
  weight in place after loading (same shape, stride and dtype as the checkpoint, other bytes:
  a repacked parameter; loader).
- ``lm_head.weight`` (vocabulary rows over TP, the same stand-in quantization; `head=True`):
  a loader parameter outside every decoder layer.

Loading follows vLLM: each parameter carries a ``weight_loader(param, loaded_weight)`` that
narrows the whole checkpoint tensor to its rank's part (vllm/model_executor/layers/linear.py),
``load_weights(weights)`` routes checkpoint names to them, and after the first load
``process_weights_after_loading(model, dtype)`` runs every quant method's and then every
attention layer's post-processing (vllm/model_executor/model_loader/utils.py), once
``record_metadata_for_reloading`` recorded the checkpoint-format parameters.
"""

import torch

from vllm.model_executor.layers.attention import Attention, MLAAttention
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

HIDDEN, HEADS, NOPE, V_DIM, KV_LORA, INTER = 8, 2, 4, 3, 6, 10
GRID = 16.0
DTYPE = torch.float32
P = "model.layers.0."
NORM, KV_B, O_PROJ = P + "input_layernorm.weight", P + "self_attn.kv_b_proj.weight", \
    P + "self_attn.o_proj.weight"
DOWN, DOWN_BIAS = P + "mlp.down_proj.weight", P + "mlp.down_proj.bias"
DIRECT = (NORM, DOWN, DOWN_BIAS)
LOADER = (KV_B, O_PROJ)
VOCAB = 16
HEAD = "lm_head.weight"
HF_CONFIG = {"num_attention_heads": HEADS, "num_key_value_heads": HEADS, "hidden_size": HIDDEN,
             "head_dim": NOPE + V_DIM, "vocab_size": VOCAB, "kv_lora_rank": KV_LORA}


def prefix(layer):
    return f"model.layers.{layer}."


def layer_names(layer):
    """(norm, kv_b, o_proj, down, down_bias) of decoder layer `layer`."""
    p = prefix(layer)
    return (p + "input_layernorm.weight", p + "self_attn.kv_b_proj.weight",
            p + "self_attn.o_proj.weight", p + "mlp.down_proj.weight", p + "mlp.down_proj.bias")


def loader_names(layers=1, head=False):
    """The parameters landing through the loader, in the model's order."""
    names = [n for i in range(layers) for n in layer_names(i)[1:3]]
    return names + ([HEAD] if head else [])


def derived_names(layers=1):
    return [prefix(i) + "self_attn.attn." + m for i in range(layers) for m in ("W_UK_T", "W_UV")]


def logical_shapes(layers=1, head=False):
    shapes = {}
    for i in range(layers):
        norm, kv_b, o_proj, down, bias = layer_names(i)
        shapes.update({norm: (HIDDEN,), kv_b: (HEADS * (NOPE + V_DIM), KV_LORA),
                       o_proj: (HIDDEN, HEADS * V_DIM), down: (HIDDEN, INTER), bias: (HIDDEN,)})
    if head:
        shapes[HEAD] = (VOCAB, HIDDEN)
    return shapes


def random_logical(seed, layers=1, head=False):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g, dtype=DTYPE)
            for n, s in logical_shapes(layers, head).items()}


def grid_quantize(weight):
    return (weight * GRID).round() / GRID


def shuffle(weight):
    """UnquantizedShuffledLinearMethod's kernel order: columns reversed."""
    return weight.flip(-1)


def derive(kv_b_local):
    """MLA's absorbed matrices from a rank's kv_b_proj rows [heads_local * (nope + v), lora]."""
    w = kv_b_local.view(-1, NOPE + V_DIM, KV_LORA)
    return w[:, :NOPE, :].transpose(1, 2).contiguous(), w[:, NOPE:, :].contiguous() * 0.5


def expected(logical, rank, tp, shuffled_down=False):
    """{name: tensor} a rank's live state must equal: parameters and derived matrices (the
    layers and head `logical` has; `shuffled_down`: down_proj's weights in the shuffled kernel
    order)."""
    rows = KV_B_ROWS // tp
    o_cols, d_cols = HEADS * V_DIM // tp, INTER // tp
    out = {}
    layer = 0
    while prefix(layer) + "input_layernorm.weight" in logical:
        norm, kv_b_name, o_proj, down, bias = layer_names(layer)
        kv_b = logical[kv_b_name][rank * rows:(rank + 1) * rows]
        o_local = logical[o_proj][:, rank * o_cols:(rank + 1) * o_cols]
        uk, uv = derive(kv_b)
        out.update({norm: logical[norm], kv_b_name: kv_b, bias: logical[bias],
                    down: (shuffle if shuffled_down else (lambda w: w))(
                        logical[down][:, rank * d_cols:(rank + 1) * d_cols]),
                    o_proj: grid_quantize(o_local).t(),
                    prefix(layer) + "self_attn.attn.W_UK_T": uk,
                    prefix(layer) + "self_attn.attn.W_UV": uv})
        layer += 1
    if HEAD in logical:
        vocab_rows = VOCAB // tp
        out[HEAD] = grid_quantize(logical[HEAD][rank * vocab_rows:(rank + 1) * vocab_rows]).t()
    return out


KV_B_ROWS = HEADS * (NOPE + V_DIM)


def live(model):
    """The same names as expected(): the model's parameters and its derived matrices."""
    state = {n: p.detach() for n, p in model.named_parameters()}
    for i, layer in enumerate(model.model.layers):
        state[prefix(i) + "self_attn.attn.W_UK_T"] = layer.self_attn.attn.W_UK_T
        state[prefix(i) + "self_attn.attn.W_UV"] = layer.self_attn.attn.W_UV
    return state


class UnquantizedLinearMethod(QuantizeMethodBase):
    """Kernel format = checkpoint format: a reload may load into the runtime parameters
    themselves (the identity mapping; vLLM's layerwise reload still compares their layouts)."""

    def get_runtime_weight_reload_mapping(self, layer, checkpoint_params, runtime_params):
        return dict(runtime_params)


class UnquantizedShuffledLinearMethod(QuantizeMethodBase):
    """An unquantized method whose kernel reorders the weight in place after loading (as ROCm
    AITER's weight shuffle does): the same shape, stride and dtype as the checkpoint format, other
    bytes. It gives no runtime reload mapping, so vLLM reprocesses the layer on a reload."""

    def process_weights_after_loading(self, layer):
        layer.weight.data.copy_(shuffle(layer.weight.data))


class GridQuantLinearMethod(QuantizeMethodBase):
    """Stand-in of a quantization method: after loading, the weight is rounded to a grid and
    replaced by a transposed copy (vLLM's methods replace the parameter likewise)."""

    def process_weights_after_loading(self, layer):
        layer.weight = torch.nn.Parameter(grid_quantize(layer.weight.data).t().contiguous(),
                                          requires_grad=False)


class _Linear(torch.nn.Module):
    def __init__(self, shape, axis, tp_rank, tp, quant_method=None, bias=None):
        super().__init__()
        self.axis, self.tp_rank = axis, tp_rank
        self.quant_method = quant_method or UnquantizedLinearMethod()
        self.weight = torch.nn.Parameter(torch.zeros(shape, dtype=DTYPE), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias is not None:
            self.bias = torch.nn.Parameter(torch.zeros(bias, dtype=DTYPE), requires_grad=False)
            self.bias.weight_loader = default_weight_loader

    def weight_loader(self, param, loaded_weight):
        size = param.shape[self.axis]
        param.data.copy_(loaded_weight.narrow(self.axis, self.tp_rank * size, size))


class RMSNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(HIDDEN, dtype=DTYPE), requires_grad=False)
        self.weight.weight_loader = default_weight_loader


class KvScaleMethod(QuantizeMethodBase):
    """An attention layer's quant method as vLLM main's reload uses one (a KV-cache scale
    method: `create_weights(layer)` makes the layer's scale anew with a sentinel, the reload
    loads into it, `process_weights_after_loading(layer)`)."""

    def create_weights(self, layer):
        layer.k_scale = torch.nn.Parameter(torch.tensor(-1.0, dtype=torch.float32),
                                           requires_grad=False)


class TinyMLAAttention(MLAAttention):
    def process_weights_after_loading(self, act_dtype):
        self.W_UK_T, self.W_UV = derive(self.kv_b_proj.weight.data.to(act_dtype))


class _Attention(torch.nn.Module):
    def __init__(self, tp_rank, tp):
        super().__init__()
        self.kv_b_proj = _Linear((KV_B_ROWS // tp, KV_LORA), 0, tp_rank, tp)
        self.o_proj = _Linear((HIDDEN, HEADS * V_DIM // tp), 1, tp_rank, tp,
                              quant_method=GridQuantLinearMethod())
        self.attn = TinyMLAAttention(self.kv_b_proj)


class _Mlp(torch.nn.Module):
    def __init__(self, tp_rank, tp, shuffled=False):
        super().__init__()
        self.down_proj = _Linear((HIDDEN, INTER // tp), 1, tp_rank, tp, bias=HIDDEN,
                                 quant_method=UnquantizedShuffledLinearMethod() if shuffled
                                 else None)


class _Layer(torch.nn.Module):
    def __init__(self, tp_rank, tp, shuffled_down=False):
        super().__init__()
        self.input_layernorm = RMSNorm()
        self.self_attn = _Attention(tp_rank, tp)
        self.mlp = _Mlp(tp_rank, tp, shuffled_down)


class TinyMLA(torch.nn.Module):
    """Built and loaded as vLLM's loader does: create, record the checkpoint-format metadata,
    load_weights, process_weights_after_loading."""

    def __init__(self, tp_rank, tp, logical, layers=1, head=False, shuffled_down=False):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([_Layer(tp_rank, tp, shuffled_down)
                                                 for _ in range(layers)])
        if head:
            self.lm_head = _Linear((VOCAB // tp, HIDDEN), 0, tp_rank, tp,
                                   quant_method=GridQuantLinearMethod())
        record_metadata_for_reloading(self)
        self.load_weights(logical.items())
        process_weights_after_loading(self, DTYPE)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded


def process_weights_after_loading(model, dtype):
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(module)
    for module in model.modules():
        if isinstance(module, (Attention, MLAAttention)):
            module.process_weights_after_loading(dtype)


def trainer_module(logical, names):
    """A module holding `names` of the logical tensors under their Hugging Face names (a trainer
    rank's whole parameters, layout "hf")."""
    root = torch.nn.Module()
    for name in names:
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, torch.nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, torch.nn.Parameter(logical[name].clone(),
                                                         requires_grad=False))
    return root


def load_trainer(module, logical):
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(logical[name])
