"""python/sglang/srt/managers/io_struct.py: the weight-update requests and results wsync's path
uses. Two interface generations (see tests/python/sglang_standin/README.md):

- release: sgl-project/sglang @ b2d53a07e07c664d4318934b5dd699246be30677 (the fields its
  managers/scheduler_components/weight_updater.py reads: ``disable_draft_model`` routes a tensor
  update to the target worker alone, ``torch_empty_cache`` goes to the cache flush);
- session: okoge-kaz/sglang @ 23aaf6597dbbe47f9ceb6090e10372c844fed960 (the sglang-miles line):
  ``BeginWeightUpdateReqInput`` / ``EndWeightUpdateReqInput`` and a ``selector`` ("target",
  "draft" or "all", default "all") on the update requests.

No receiver fields: the external weight-update receiver hook is in neither generation."""

import dataclasses
from typing import List, Optional, Union


@dataclasses.dataclass
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: List[Union[str, bytes]]  # One per TP rank.
    load_format: Optional[str] = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    torch_empty_cache: bool = False
    disable_draft_model: bool = False  # release generation
    selector: str = "all"  # session generation


@dataclasses.dataclass
class UpdateWeightsFromTensorReqOutput:
    success: bool
    message: str


@dataclasses.dataclass
class BeginWeightUpdateReqInput:
    selector: str = "all"
    weight_version: Optional[str] = None


@dataclasses.dataclass
class BeginWeightUpdateReqOutput:
    success: bool
    message: str


@dataclasses.dataclass
class EndWeightUpdateReqInput:
    pass


@dataclasses.dataclass
class EndWeightUpdateReqOutput:
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


@dataclasses.dataclass
class InitWeightsUpdateGroupReqOutput:
    success: bool
    message: str
