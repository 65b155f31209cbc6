"""Rule tables: how each framework's local parameter names map to logical (Hugging Face) names.

Names are as the frameworks' own source spells them (paths cited per table). A :class:`Rule`'s
pattern is matched in full against the local name; its targets are templates expanded with the
match. Every table lets a name carry a wrapper prefix (``language_model.`` of vision-language
models, ``module.`` of DDP...): the prefix is kept in the logical name, so both sides of a job
must spell it the same way (or a caller's rule maps it).
"""

import dataclasses
import re
from typing import Sequence


@dataclasses.dataclass
class Rule:
    pattern: str
    kind: str
    targets: Sequence[str]  # One template, or one per part (packed, qkv: q, k, v).

    def __post_init__(self):
        if isinstance(self.targets, str):
            self.targets = (self.targets,)
        self._regex = re.compile(self.pattern)

    def match(self, name):
        return self._regex.fullmatch(name)


LANDING_WAYS = ("direct", "loader")


@dataclasses.dataclass
class LandingRule:
    """How a vLLM worker lands the local parameters whose name `pattern` matches in full:
    ``direct`` (wsync writes the live parameter in place) or ``loader`` (wsync writes the
    checkpoint-format tensor into a staging tensor that the model's own ``load_weights`` reads
    inside vLLM's layerwise reload, so the model's post-processing runs). Tried in order before
    wsync's own classification (``wsync.vllm_loader.classify``); the first match wins."""
    pattern: str
    way: str

    def __post_init__(self):
        if self.way not in LANDING_WAYS:
            raise ValueError(f"LandingRule({self.pattern!r}): way must be one of "
                             f"{', '.join(LANDING_WAYS)}, not {self.way!r}")
        self._regex = re.compile(self.pattern)

    def match(self, name):
        return self._regex.fullmatch(name)


_L = r"(?:module\.)*"  # DDP / wrapper prefixes.
_M = _L + r"decoder\.layers\.(\d+)\."  # A Megatron-core transformer layer.
_H = r"model.layers.\1."  # The same layer's logical (HF) prefix.

# megatron/core/models/gpt (GPTModel: embedding, decoder, output_layer), transformer/attention.py
# (linear_qkv, linear_proj, q_layernorm / k_layernorm with qk_layernorm), transformer/moe/
# (router.py at 005742ff: TopKRouter.weight, the fp32 buffer expert_bias; experts.py: TEGroupedMLP linear_fc1.weight<k> per
# local expert, SequentialMLP local_experts.<k>; shared_experts.py: SharedExpertMLP gate_weight).
MEGATRON_RULES = [
    Rule(_L + r"embedding\.word_embeddings\.weight", "vocab", "model.embed_tokens.weight"),
    Rule(_M + r"self_attention\.linear_qkv\.(weight|bias)", "megatron_qkv",
         (_H + r"self_attn.q_proj.\2", _H + r"self_attn.k_proj.\2", _H + r"self_attn.v_proj.\2")),
    Rule(_M + r"(?:self_attention\.linear_qkv\.layer_norm_weight|input_layernorm\.weight)",
         "replicated", _H + "input_layernorm.weight"),
    Rule(_M + r"self_attention\.linear_proj\.weight", "row", _H + "self_attn.o_proj.weight"),
    Rule(_M + r"self_attention\.(q|k)_layernorm\.weight", "replicated",
         _H + r"self_attn.\2_norm.weight"),
    Rule(_M + r"(?:mlp\.linear_fc1\.layer_norm_weight|pre_mlp_layernorm\.weight)", "replicated",
         _H + "post_attention_layernorm.weight"),
    Rule(_M + r"mlp\.linear_fc1\.weight", "packed",
         (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight")),
    Rule(_M + r"mlp\.linear_fc2\.weight", "row", _H + "mlp.down_proj.weight"),
    Rule(_M + r"mlp\.router\.weight", "replicated", _H + "mlp.gate.weight"),
    Rule(_M + r"mlp\.router\.expert_bias", "replicated", _H + "mlp.gate.e_score_correction_bias"),
    Rule(_M + r"mlp\.experts\.(?:linear_fc1\.weight(?P<expert>\d+)|"
         r"local_experts\.(?P<expert2>\d+)\.linear_fc1\.weight)", "expert_packed",
         (_H + "mlp.experts.gate_proj.weight", _H + "mlp.experts.up_proj.weight")),
    Rule(_M + r"mlp\.experts\.(?:linear_fc2\.weight(?P<expert>\d+)|"
         r"local_experts\.(?P<expert2>\d+)\.linear_fc2\.weight)", "expert_row",
         _H + "mlp.experts.down_proj.weight"),
    Rule(_M + r"mlp\.shared_experts\.linear_fc1\.weight", "packed",
         (_H + "mlp.shared_experts.gate_proj.weight", _H + "mlp.shared_experts.up_proj.weight")),
    Rule(_M + r"mlp\.shared_experts\.linear_fc2\.weight", "row",
         _H + "mlp.shared_experts.down_proj.weight"),
    Rule(_M + r"mlp\.shared_experts\.gate_weight", "replicated",
         _H + "mlp.shared_expert_gate.weight"),
    Rule(_L + r"decoder\.final_layernorm\.weight", "replicated", "model.norm.weight"),
    Rule(_L + r"output_layer\.weight", "vocab", "lm_head.weight"),
]

# Megatron-core multi-latent attention (megatron/core/transformer/multi_latent_attention.py,
# MLASelfAttention at 003b4ce2): linear_q_down_proj (hidden -> q_lora_rank) and
# linear_kv_down_proj (hidden -> kv_lora_rank + qk_pos_emb_head_dim) are whole (TELinear,
# parallel_mode 'duplicated') or column-split (ColumnParallelLinear): kind mla_down tells them
# apart by their rows; linear_q_up_proj / linear_kv_up_proj are column-parallel with rows per
# head [nope | rope] and [nope | v], as HF's q_b_proj / kv_b_proj; q_layernorm / kv_layernorm
# (or TE's fused linear_*_up_proj.layer_norm_weight) are the latent norms. Tried before
# MEGATRON_RULES when the ModelConfig has kv_lora_rank (q_layernorm is Qwen3's q_norm else).
MEGATRON_MLA_RULES = [
    Rule(_M + r"self_attention\.linear_q_proj\.weight", "column", _H + "self_attn.q_proj.weight"),
    Rule(_M + r"self_attention\.linear_q_down_proj\.weight", "mla_down",
         _H + "self_attn.q_a_proj.weight"),
    Rule(_M + r"self_attention\.linear_kv_down_proj\.weight", "mla_down",
         _H + "self_attn.kv_a_proj_with_mqa.weight"),
    Rule(_M + r"self_attention\.linear_q_up_proj\.weight", "column",
         _H + "self_attn.q_b_proj.weight"),
    Rule(_M + r"self_attention\.linear_kv_up_proj\.weight", "column",
         _H + "self_attn.kv_b_proj.weight"),
    Rule(_M + r"self_attention\.(?:linear_q_up_proj\.layer_norm_weight|q_layernorm\.weight)",
         "replicated", _H + "self_attn.q_a_layernorm.weight"),
    Rule(_M + r"self_attention\.(?:linear_kv_up_proj\.layer_norm_weight|kv_layernorm\.weight)",
         "replicated", _H + "self_attn.kv_a_layernorm.weight"),
]

# vllm/model_executor/models/{llama,qwen2,qwen3,qwen2_moe,qwen3_moe,deepseek_v2}.py and
# layers/{linear,vocab_parallel_embedding}.py, layers/fused_moe/layer.py: QKVParallelLinear
# qkv_proj, MergedColumnParallelLinear gate_up_proj (also the shared experts'), RowParallelLinear
# o_proj / down_proj, Qwen3's per-head q_norm / k_norm, the MoE router `gate` (ReplicatedLinear or
# GateLinear, with DeepSeek's fp32 e_score_correction_bias), Qwen2-MoE's shared_expert_gate,
# FusedMoE w13_weight [E_local, 2 * I, H] (w1 = gate, then w3 = up) and w2_weight
# [E_local, H, I], MLA's fused_qkv_a_proj = q_a_proj | kv_a_proj_with_mqa (replicated) with
# ColumnParallel q_b_proj / kv_b_proj (q_proj without q_lora_rank), VocabParallelEmbedding.
VLLM_RULES = [
    Rule(r"(.*)\.self_attn\.qkv_proj\.(weight|bias)", "qkv",
         (r"\1.self_attn.q_proj.\2", r"\1.self_attn.k_proj.\2", r"\1.self_attn.v_proj.\2")),
    Rule(r"(.*)\.self_attn\.fused_qkv_a_proj\.weight", "mla_qkv_a",
         (r"\1.self_attn.q_a_proj.weight", r"\1.self_attn.kv_a_proj_with_mqa.weight")),
    Rule(r"(.*)\.gate_up_proj\.weight", "packed", (r"\1.gate_proj.weight", r"\1.up_proj.weight")),
    Rule(r"(.*)\.experts\.w13_weight", "experts_packed",
         (r"\1.experts.gate_proj.weight", r"\1.experts.up_proj.weight")),
    Rule(r"(.*)\.experts\.w2_weight", "experts_row", r"\1.experts.down_proj.weight"),
    Rule(r"(.*\.mlp\.(?:gate\.(?:weight|e_score_correction_bias)|shared_expert_gate\.weight))",
         "replicated", r"\1"),
    Rule(r"(.*\.self_attn\.(?:q_a_proj|kv_a_proj_with_mqa)\.weight)", "replicated", r"\1"),
    Rule(r"(.*\.(?:o_proj|down_proj)\.weight)", "row", r"\1"),
    Rule(r"(.*\.(?:q_proj|k_proj|v_proj|q_b_proj|kv_b_proj|gate_proj|up_proj)\.(?:weight|bias))",
         "column", r"\1"),
    Rule(r"((?:.*\.)?(?:embed_tokens|lm_head)\.weight)", "vocab", r"\1"),
    Rule(r"(.*(?:norm|layernorm)\.weight|.*\.(?:o_proj|down_proj)\.bias)", "replicated", r"\1"),
]

# SGLang (python/sglang/srt/models/deepseek_v2.py) fuses MLA's a-projections as
# fused_qkv_a_proj_with_mqa; every other name is vLLM's (SGLang's models derive from vLLM's).
SGLANG_RULES = [
    Rule(r"(.*)\.self_attn\.fused_qkv_a_proj_with_mqa\.weight", "mla_qkv_a",
         (r"\1.self_attn.q_a_proj.weight", r"\1.self_attn.kv_a_proj_with_mqa.weight")),
] + VLLM_RULES

# Hugging Face transformers module trees (as FSDP-based trainers hold them): every parameter is
# its logical self, except per-expert MoE weights (Qwen2-MoE / Qwen3-MoE / DeepSeek-V3:
# mlp.experts.<k>.{gate,up,down}_proj.weight), stacked into one [E, ...] logical tensor per layer
# as the engines fuse them.
HF_RULES = [
    Rule(r"(.*)\.experts\.(?P<expert>\d+)\.(gate_proj|up_proj|down_proj)\.weight", "hf_expert",
         r"\1.experts.\3.weight"),
    Rule(r"(.*)", "replicated", r"\1"),
]

# For the error of a name no rule maps: the kind a rule for it would most likely have.
_HINTS = [
    (r".*(?:norm|layernorm)\.weight|.*\.bias", "replicated"),
    (r".*\.(?:o_proj|down_proj|out_proj|dense|fc2|linear_proj|linear_fc2|wo)\.weight", "row"),
    (r".*\.(?:gate|router)\.weight", "replicated"),
    (r".*(?:embed_tokens|word_embeddings|lm_head|output_layer)\.weight", "vocab"),
    (r".*(?:_proj|fc1|linear_fc1|wq|wk|wv)\.weight", "column"),
]


def suggest_rule(name, tensor_dim):
    """The Rule that would map `name` (layer numbers generalised), as source text."""
    kind = "replicated"
    if tensor_dim >= 2:
        for pattern, hint in _HINTS:
            if re.fullmatch(pattern, name):
                kind = hint
                break
    pattern = re.sub(r"\\\.\d+\\\.", r"\\.(\\d+)\\.", re.escape(name))
    layers = 0
    target = []
    for part in re.split(r"(\.\d+\.)", name):
        if re.fullmatch(r"\.\d+\.", part):
            layers += 1
            target.append(f".\\{layers}.")
        else:
            target.append(part)
    return f"Rule(r\"{pattern}\", \"{kind}\", r\"{''.join(target)}\")"
