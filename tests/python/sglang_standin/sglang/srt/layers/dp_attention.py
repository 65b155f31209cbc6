"""python/sglang/srt/layers/dp_attention.py: compute_dp_attention_world_info and the attention-TP
getters. Under DP attention the TP group of tp ranks holds dp attention replicas of
attn_tp = tp / dp ranks each: attn_tp_rank = tp_rank % attn_tp, attn_dp_rank = tp_rank //
attn_tp."""

_state = {"enabled": False}


def compute_dp_attention_world_info(enable_dp_attention, tp_rank, tp_size, dp_size):
    if not enable_dp_attention:
        return tp_rank, tp_size, 0
    attn_tp_size = tp_size // dp_size
    return tp_rank % attn_tp_size, attn_tp_size, tp_rank // attn_tp_size


def initialize_dp_attention(server_args, tp_rank):
    attn_tp_rank, attn_tp_size, attn_dp_rank = compute_dp_attention_world_info(
        server_args.enable_dp_attention, tp_rank, server_args.tp_size, server_args.dp_size)
    _state.update(enabled=server_args.enable_dp_attention, attn_tp_rank=attn_tp_rank,
                  attn_tp_size=attn_tp_size, attn_dp_rank=attn_dp_rank)


def is_dp_attention_enabled():
    return _state["enabled"]


def get_attention_tp_rank():
    return _state["attn_tp_rank"]


def get_attention_tp_size():
    return _state["attn_tp_size"]
