"""python/sglang/srt/server_args.py (0.5.x): the ServerArgs fields wsync's hooks read or that the
weight-update path consults, and the scheduler-process global accessor."""

import dataclasses
from typing import List, Optional


@dataclasses.dataclass
class ServerArgs:
    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    enable_dp_attention: bool = False
    enable_dp_lm_head: bool = False
    custom_weight_loader: Optional[List[str]] = None  # --custom-weight-loader (nargs="*")
    weight_update_receivers: Optional[List[str]] = None  # --weight-update-receivers (hook)

    def __post_init__(self):
        if self.custom_weight_loader is None:  # As ServerArgs.__post_init__ does.
            self.custom_weight_loader = []


_global_server_args = None


def set_global_server_args_for_scheduler(server_args):
    global _global_server_args
    _global_server_args = server_args


def get_global_server_args():
    if _global_server_args is None:
        raise ValueError("Global server args is not set yet!")
    return _global_server_args
