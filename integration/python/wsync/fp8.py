"""FP8 e4m3 target parameters for rollout engines that serve FP8 weights, with torch 1.13.

torch 1.13 has no float8 dtype: an FP8 weight is a ``torch.uint8`` tensor of e4m3 bytes (OCP
e4m3 "fn", torch.float8_e4m3fn's bits; a newer torch's float8_e4m3fn tensor is accepted too),
flagged as e4m3 by :func:`add_fp8`, with its ``torch.float32`` scale tensor under the engine's
name for it (vLLM: ``<module>.weight_scale_inv`` for block FP8, ``<module>.weight_scale`` for
per-channel and per-tensor FP8). The sync quantizes the trainers' bf16 or fp32 values into both
(the C ABI's ``declare_fp8_parameter``); trainers declare the parameter unquantized.

Schemes (``block``: rows x cols of one scale, None: the whole axis; a 3-D
``[experts, rows, cols]`` tensor is scaled expert by expert):

===============  ==================  ==========================================
scheme           block               scale shape
===============  ==================  ==========================================
``fp8_block``    (128, 128) default  ``[ceil(rows / 128), ceil(cols / 128)]``
``fp8_channel``  (1, None)           ``[rows, 1]``
``fp8_tensor``   (None, None)        ``[1, 1]``
===============  ==================  ==========================================

:func:`quantize` is a reference quantizer in Python, for tests and for checking an engine's
weights; tests/python/test_fp8.py checks it bit for bit against the C++ reference
(integration/fill/fp8_reference.h) and against what a sync wrote. Its rule is the library's:
``scale = fp32(max(amax, 1e-10) / 448)`` per block (an all-zero block gets 1e-10 / 448 and
zeros), ``fp8 = e4m3(clamp(fp32(x / scale), -448, 448))`` rounded to nearest even, signed zeros
keep their sign; dequantized = fp8 * scale. NaN and infinities are refused.
"""

import dataclasses
from typing import Optional, Tuple

import torch

from ._lib import Status, WsyncError
from .layouts import LayoutError

FP8_MAX = 448.0
AMAX_FLOOR = 1e-10
SCHEMES = ("fp8_block", "fp8_channel", "fp8_tensor")


@dataclasses.dataclass
class Fp8Spec:
    """How a Layout's FP8 parameter is scaled (Layout.fp8 values)."""
    scheme: str
    scale_name: str
    scale_shape: Tuple[int, ...]
    block: Optional[Tuple[int, int]] = None  # fp8_block only; None: 128 x 128.


def blocks(scheme, block=None):
    """(rows, cols) of one scale block of `scheme`; None for a whole axis."""
    if scheme not in SCHEMES:
        raise WsyncError(Status.INVALID_ARGUMENT, f"unknown FP8 scheme {scheme!r}; expected one "
                         f"of {', '.join(SCHEMES)}", "fp8")
    if scheme == "fp8_block":
        return (128, 128) if block is None else (int(block[0]), int(block[1]))
    if block is not None:
        raise WsyncError(Status.INVALID_ARGUMENT, f"{scheme} has no block size", "fp8")
    return (1, None) if scheme == "fp8_channel" else (None, None)


def _count(extent, block):
    return 1 if block is None or block >= extent else -(-extent // block)


def scale_shape(shape, scheme, block=None):
    """The scale tensor's shape for an FP8 parameter of `shape` ([rows, cols] or
    [experts, rows, cols])."""
    rows, cols = blocks(scheme, block)
    shape = tuple(int(s) for s in shape)
    return shape[:-2] + (_count(shape[-2], rows), _count(shape[-1], cols))


def _is_e4m3(tensor):
    return tensor.dtype == torch.uint8 or str(tensor.dtype) == "torch.float8_e4m3fn"


def add_fp8(layout, param, shape, origin, view, scale_name, scale_origin, scale_view,
            scheme="fp8_block", block=None):
    """Adds to `layout` (a wsync.layouts.Layout) the piece `view` (uint8 e4m3 bytes, shaped like
    its box at `origin`) of FP8 parameter `param` of `shape`, and the piece `scale_view` (fp32,
    at `scale_origin` of the scale tensor) of its scales `scale_name`. Every piece of one
    parameter gives the same scheme, block and scale name. LayoutError otherwise."""
    if not _is_e4m3(view):
        raise LayoutError(f"parameter {param}: FP8 bytes come as a torch.uint8 tensor, not "
                          f"{view.dtype}")
    if scale_view.dtype != torch.float32:
        raise LayoutError(f"parameter {param}: its scales {scale_name} are torch.float32, not "
                          f"{scale_view.dtype}")
    spec = Fp8Spec(scheme, scale_name, scale_shape(shape, scheme, block),
                   None if block is None else (int(block[0]), int(block[1])))
    known = layout.fp8.get(param)
    if known is not None and known != spec:
        raise LayoutError(f"parameter {param}: FP8 {spec} here, {known} from another tensor")
    layout.add(param, shape, origin, view, dtype="fp8_e4m3")
    layout.add(scale_name, spec.scale_shape, scale_origin, scale_view)
    layout.fp8[param] = spec


def encode_e4m3(values):
    """e4m3 bytes (torch.uint8) of fp32 `values` within [-448, 448], rounded to nearest even."""
    magnitude = values.abs().double()
    mantissa, exponent = torch.frexp(magnitude)  # magnitude = mantissa * 2**exponent, [0.5, 1).
    # Normal numbers: 8 codes per binade from 2**-6 (code 8); a mantissa that rounds up to 8
    # carries into the next binade, which the code's arithmetic does by itself.
    normal = (exponent.double() + 6) * 8 + torch.round(mantissa * 16 - 8)
    subnormal = torch.round(magnitude * 512)  # Steps of 2**-9 below 2**-6.
    code = torch.where(magnitude < 2.0 ** -6, subnormal, normal).to(torch.int64)
    return (code + torch.signbit(values).to(torch.int64) * 128).to(torch.uint8)


def quantize(tensor, scheme="fp8_block", block=None):
    """(e4m3 bytes as torch.uint8 of tensor's shape, fp32 scales of scale_shape) of a bf16 or
    fp32 `tensor` ([rows, cols] or [experts, rows, cols]). ValueError for NaN or infinity."""
    values = tensor.detach().to("cpu", torch.float32)
    if not bool(torch.isfinite(values).all()):
        raise ValueError("cannot quantize NaN or an infinity to FP8")
    shape = tuple(values.shape)
    rows, cols = shape[-2:]
    block_rows, block_cols = blocks(scheme, block)
    block_rows = rows if block_rows is None else min(block_rows, max(rows, 1))
    block_cols = cols if block_cols is None else min(block_cols, max(cols, 1))
    matrices = values.reshape(-1, rows, cols)
    out = torch.empty(matrices.shape, dtype=torch.uint8)
    scales = torch.empty(matrices.shape[0], _count(rows, block_rows), _count(cols, block_cols),
                         dtype=torch.float32)
    for i in range(scales.shape[1]):
        for j in range(scales.shape[2]):
            box = (slice(None), slice(i * block_rows, (i + 1) * block_rows),
                   slice(j * block_cols, (j + 1) * block_cols))
            amax = matrices[box].abs().amax(dim=(1, 2))
            scale = torch.clamp(amax, min=AMAX_FLOOR) / FP8_MAX  # fp32 operations.
            scales[:, i, j] = scale
            quotient = (matrices[box] / scale.view(-1, 1, 1)).clamp(-FP8_MAX, FP8_MAX)
            out[box] = encode_e4m3(quotient)
    return out.reshape(shape), scales.reshape(shape[:-2] + tuple(scales.shape[1:]))
