"""python/sglang/srt/managers/io_struct.py (0.5.x; ``receiver`` / ``receiver_init_payload`` /
``receiver_payload`` from the receiver hook @ fd623da): the weight-update requests and results."""

import dataclasses
from typing import Any, Dict, List, Optional, Union


@dataclasses.dataclass
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: List[Union[str, bytes]]  # One per TP rank.
    load_format: Optional[str] = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None


@dataclasses.dataclass
class UpdateWeightsFromTensorReqOutput:
    success: bool
    message: str


@dataclasses.dataclass
class InitWeightsUpdateGroupReqInput:
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"
    receiver: Optional[str] = None
    receiver_init_payload: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class InitWeightsUpdateGroupReqOutput:
    success: bool
    message: str


@dataclasses.dataclass
class UpdateWeightsFromDistributedReqInput:
    names: List[str] = dataclasses.field(default_factory=list)
    dtypes: List[str] = dataclasses.field(default_factory=list)
    shapes: List[List[int]] = dataclasses.field(default_factory=list)
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    load_format: Optional[str] = None
    receiver_payload: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class UpdateWeightsFromDistributedReqOutput:
    success: bool
    message: str


@dataclasses.dataclass
class DestroyWeightsUpdateGroupReqInput:
    group_name: str = "weight_update_group"


@dataclasses.dataclass
class DestroyWeightsUpdateGroupReqOutput:
    success: bool
    message: str
