"""python/sglang/srt/weight_sync/external_receiver.py @ fd623da (the receiver hook; in no SGLang
release we could read): the per-TP-worker context a receiver factory gets, and the allowlisted
build (the factory's object must have receive(payload) and destroy())."""

import dataclasses
from typing import Any, Dict, Optional

from sglang.srt.utils import dynamic_import


@dataclasses.dataclass(frozen=True)
class WeightUpdateReceiverContext:
    model: Any
    device: Any
    tp_rank: int
    tp_size: int
    group_name: str
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    init_payload: Optional[Dict[str, Any]] = None


def build_weight_update_receiver(path, allowed, context):
    if path not in (allowed or ()):
        raise ValueError(f"receiver {path!r} is not listed in --weight-update-receivers")
    receiver = dynamic_import(path)(context)
    if not callable(getattr(receiver, "receive", None)) or \
            not callable(getattr(receiver, "destroy", None)):
        raise TypeError(f"receiver factory {path!r} must return an object with "
                        "receive(payload) and destroy()")
    return receiver
