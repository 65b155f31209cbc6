"""python/sglang/srt/distributed/parallel_state.py: the rank getters of the TP and MoE-EP groups
(SGLang derives them from its GroupCoordinators; here initialize_model_parallel records them)."""

_state = {}


def initialize_model_parallel(tp_rank, tp_size, ep_rank=0, ep_size=1):
    _state.update(tp_rank=tp_rank, tp_size=tp_size, ep_rank=ep_rank, ep_size=ep_size)


def get_tensor_model_parallel_rank():
    return _state["tp_rank"]


def get_tensor_model_parallel_world_size():
    return _state["tp_size"]


def get_moe_expert_parallel_rank():
    return _state["ep_rank"]


def get_moe_expert_parallel_world_size():
    return _state["ep_size"]
