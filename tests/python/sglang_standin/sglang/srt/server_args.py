"""python/sglang/srt/server_args.py (sgl-project/sglang @ b2d53a07e07c664d4318934b5dd699246be30677):
the ServerArgs fields read on the weight-update path (``--custom-weight-loader``, a list;
``--speculative-algorithm``, which gives the scheduler a draft worker; ``--weight-version``, the
version served before any update, "default"; DP attention), and the scheduler-process global
accessor. There is no ``--weight-update-receivers``."""

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
    speculative_algorithm: Optional[str] = None  # e.g. "EAGLE": a draft worker is built
    weight_version: str = "default"

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
