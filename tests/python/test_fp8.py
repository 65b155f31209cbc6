"""FP8 rollout parameters from Python (wsync.fp8): uint8 tensors of e4m3 bytes flagged with
add_fp8 and their fp32 scale tensors, declared through the C ABI's declare_fp8_parameter.

- wsync.fp8.quantize (the Python reference) equals the C++ reference quantizer
  (integration/fill/fp8_reference.h, through fp8_reference_dump) bit for bit on random tensors:
  ragged blocks, all-zero blocks, subnormal and huge values, signed zeros, every scheme.
- Two bf16 trainers (TP cuts, one inside a 128-block) sync into two FP8 rollouts (block,
  per-channel and per-tensor expert parameters, the scale tensors under vLLM's names): every
  e4m3 byte and scale equals wsync.fp8.quantize of the whole bf16 tensor, bit for bit.
- Bad declarations are refused: a float view as FP8 bytes, fp16 scales (LayoutError), a scale
  tensor of another scheme's shape, an FP8 parameter on a trainer (WSYNC_INVALID_ARGUMENT).
"""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-fp8-secret-0123456789abcdefgh"
COMMON = dict(deadline_seconds=30, path_transports="*=ucx:sm,cma,self", job_id="python-fp8",
              num_trainers=2, num_rollouts=2)

# name, shape, scheme (None: stays bf16), scale name, trainer boxes, rollout boxes: per rank
# (origin, extent) of the parameter; the rollouts' scale boxes follow from their blocks.
PARAMS = [
    ("model.layers.0.mlp.down_proj.weight", (200, 300), "fp8_block",
     "model.layers.0.mlp.down_proj.weight_scale_inv",
     [((0, 0), (200, 150)), ((0, 150), (200, 150))],
     [((0, 0), (128, 300)), ((128, 0), (72, 300))]),
    ("model.layers.0.self_attn.o_proj.weight", (96, 80), "fp8_channel",
     "model.layers.0.self_attn.o_proj.weight_scale",
     [((0, 0), (48, 80)), ((48, 0), (48, 80))],
     [((0, 0), (96, 80)), ((0, 0), (96, 80))]),
    ("model.layers.0.mlp.experts.w2_weight", (4, 64, 96), "fp8_tensor",
     "model.layers.0.mlp.experts.w2_weight_scale",
     [((0, 0, 0), (2, 64, 96)), ((2, 0, 0), (2, 64, 96))],
     [((0, 0, 0), (2, 64, 96)), ((2, 0, 0), (2, 64, 96))]),
    ("model.norm.weight", (80,), None, None, [((0,), (80,))] * 2, [((0,), (80,))] * 2),
]


def _values(torch, shape, seed):
    """bf16 values over many magnitudes, one block-sized corner zero and a few huge values."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g) * torch.pow(
        10.0, torch.randint(-6, 7, shape[:-1] + (1,), generator=g).float())
    values = values.to(torch.bfloat16)
    if len(shape) >= 2:
        values[..., -72:, -44:] = 0  # The ragged last 128-block of [200, 300].
        if shape[-2] > 2:
            values[..., 2, :] = 0  # A zero channel.
            values[..., 1, ::5] = 3e30
    return values


def _slices(origin, extent):
    return tuple(slice(o, o + e) for o, e in zip(origin, extent))


def _scale_box(origin, extent, shape, scheme):
    """The scale elements of the whole-block box (origin, extent)."""
    from wsync import fp8
    rows, cols = fp8.blocks(scheme)
    scale = fp8.scale_shape(shape, scheme)
    lead_o, lead_e = tuple(origin[:-2]), tuple(extent[:-2])
    out_o, out_e = [], []
    for a, block in ((-2, rows), (-1, cols)):
        if block is None or block >= shape[a]:
            out_o.append(0)
            out_e.append(1)
        else:
            first = origin[a] // block
            out_o.append(first)
            out_e.append(min(scale[a], -(-(origin[a] + extent[a]) // block)) - first)
    return lead_o + tuple(out_o), lead_e + tuple(out_e)


def _job(index, port, seed):
    import torch
    import wsync
    from wsync import fp8
    from wsync.layouts import Layout
    trainer = index < 2
    rank = index % 2
    layout = Layout()
    keep = []
    for p, (name, shape, scheme, scale_name, trainer_boxes, rollout_boxes) in enumerate(PARAMS):
        origin, extent = (trainer_boxes if trainer else rollout_boxes)[rank]
        if trainer or scheme is None:
            view = _values(torch, shape, seed + p)[_slices(origin, extent)].clone() \
                if trainer else torch.zeros(extent, dtype=torch.bfloat16)
            layout.add(name, shape, origin, view)
        else:
            view = torch.full(extent, 0xA5, dtype=torch.uint8)
            scale_origin, scale_extent = _scale_box(origin, extent, shape, scheme)
            scales = torch.full(scale_extent, float("nan"))
            fp8.add_fp8(layout, name, shape, origin, view, scale_name, scale_origin, scales,
                        scheme)
            keep.append((name, view, scale_name, scale_origin, scales))
        keep.append((name, view, None, None, None))
    session = wsync.Session("trainer" if trainer else "rollout", rank,
                            coordinator=f"127.0.0.1:{port}", host_coordinator=index == 0,
                            secret=SECRET, **COMMON)
    try:
        layout.register(session)
        session.connect()
        session.sync(1)
        if trainer:
            return None
        out = {}
        for name, view, scale_name, scale_origin, scales in keep:
            if scale_name is None:
                out[name] = view.view(torch.int16).tolist() if view.dtype == torch.bfloat16 \
                    else view.tolist()
            else:
                out[scale_name] = (scale_origin, scales.view(torch.int32).tolist())
        return out
    finally:
        session.finalize()


def _refusals(index):
    import torch
    import wsync
    from wsync import fp8
    from wsync.layouts import Layout, LayoutError
    out = {}
    for what, view, scales in (("float bytes", torch.zeros(2, 2), torch.zeros(1, 1)),
                               ("fp16 scales", torch.zeros(2, 2, dtype=torch.uint8),
                                torch.zeros(1, 1, dtype=torch.float16))):
        try:
            fp8.add_fp8(Layout(), "w", (2, 2), (0, 0), view, "w_scale", (0, 0), scales)
            out[what] = "accepted"
        except LayoutError as error:
            out[what] = str(error)
    for role in ("rollout", "trainer"):
        session = wsync.Session(role, 0, coordinator="127.0.0.1:1", secret=SECRET,
                                job_id="python-fp8-refusals")
        try:
            session.declare_parameter("w", "fp8_e4m3" if role == "rollout" else "bf16", (200, 300))
            for scheme, shape in (("fp8_channel", (2, 3)), ("fp8_block", (2, 3))):
                try:
                    session.declare_fp8_parameter("w", scheme, "w_scale", shape)
                    out[(role, scheme)] = "accepted"
                except wsync.WsyncError as error:
                    out[(role, scheme)] = (error.code.name, error.message)
        finally:
            session.finalize()
    return out


class Fp8ReferenceTest(unittest.TestCase):
    def test_python_reference_equals_the_cpp_reference(self):
        import torch
        from wsync import fp8
        dump = os.environ.get("WSYNC_FP8_REFERENCE_DUMP")
        if not dump:
            self.skipTest("WSYNC_FP8_REFERENCE_DUMP is not set (ctest sets it)")
        g = torch.Generator().manual_seed(5)
        cases = [((1, 1), "fp8_block", None), ((7, 300), "fp8_block", None),
                 ((200, 300), "fp8_block", None), ((3, 130, 129), "fp8_block", (5, 7)),
                 ((96, 80), "fp8_channel", None), ((2, 33, 17), "fp8_channel", None),
                 ((64, 96), "fp8_tensor", None), ((4, 64, 96), "fp8_tensor", None)]
        for shape, scheme, block in cases:
            for trial in range(3):
                values = _values(torch, shape, 100 * trial + len(shape))
                if trial == 1:  # Subnormal quotients and signed zeros.
                    values = (torch.randn(shape, generator=g) * 1e-3).to(torch.bfloat16)
                    values.view(-1)[::11] = -0.0
                if trial == 2 and values.dim() >= 2:  # A huge value beside tiny ones.
                    values = (torch.rand(shape, generator=g) * 1e-4).to(torch.bfloat16)
                    values[..., 0, 0] = -1e38
                got_bytes, got_scales = fp8.quantize(values, scheme, block)
                rows, cols = fp8.blocks(scheme, block)
                matrices = values.reshape(-1, shape[-2], shape[-1])
                run = subprocess.run(
                    [dump, str(matrices.shape[0]), str(shape[-2]), str(shape[-1]),
                     str(rows or 0), str(cols or 0)],
                    input=values.contiguous().view(torch.int16).numpy().tobytes(),
                    capture_output=True, check=True)
                count = values.numel()
                want_bytes = torch.frombuffer(bytearray(run.stdout[:count]), dtype=torch.uint8)
                want_scales = torch.frombuffer(bytearray(run.stdout[count:]), dtype=torch.int32)
                where = f"{shape} {scheme} {block} trial {trial}"
                self.assertEqual(int((got_bytes.reshape(-1) != want_bytes).sum()), 0, where)
                self.assertEqual(got_scales.reshape(-1).view(torch.int32).tolist(),
                                 want_scales.tolist(), where)

    def test_nan_is_refused(self):
        import torch
        from wsync import fp8
        with self.assertRaises(ValueError):
            fp8.quantize(torch.tensor([[1.0, float("nan")]]))


class Fp8SyncTest(unittest.TestCase):
    def test_bf16_shards_into_fp8_rollouts_bit_for_bit(self):
        import torch
        from wsync import fp8
        seed = 22
        results = run_processes(_job, 4, (free_ports(1)[0], seed), timeout=150)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        for rank in (0, 1):
            got = results[2 + rank][1]
            for p, (name, shape, scheme, scale_name, _, rollout_boxes) in enumerate(PARAMS):
                origin, extent = rollout_boxes[rank]
                values = _values(torch, shape, seed + p)
                if scheme is None:
                    want = values[_slices(origin, extent)].view(torch.int16).tolist()
                    self.assertEqual(got[name], want, f"{name} on rollout {rank}")
                    continue
                want_bytes, want_scales = fp8.quantize(values, scheme)
                self.assertEqual(got[name], want_bytes[_slices(origin, extent)].tolist(),
                                 f"{name} on rollout {rank}")
                scale_origin, scales = got[scale_name]
                scale_extent = _scale_box(origin, extent, shape, scheme)[1]
                want = want_scales[_slices(scale_origin, scale_extent)].view(torch.int32)
                self.assertEqual(scales, want.tolist(), f"{scale_name} on rollout {rank}")

    def test_bad_declarations_are_refused(self):
        [(status, out)] = run_processes(_refusals, 1, timeout=60)
        self.assertEqual(status, "ok", out)
        self.assertIn("torch.uint8 tensor, not torch.float32", out["float bytes"])
        self.assertIn("are torch.float32, not torch.float16", out["fp16 scales"])
        code, message = out[("rollout", "fp8_channel")]
        self.assertEqual(code, "INVALID_ARGUMENT")
        self.assertIn("need (200, 1)", message)
        self.assertEqual(out[("rollout", "fp8_block")], "accepted")
        code, message = out[("trainer", "fp8_block")]
        self.assertEqual(code, "INVALID_ARGUMENT")
        self.assertIn("a trainer holds its parameters unquantized", message)


if __name__ == "__main__":
    unittest.main()
