"""wsync.layouts without the library: every piece, read back through (buffer, offset, strides)
as the plugin reads it, must equal the box of the logical parameter it claims; the pieces of all
ranks must cover every logical element."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402,F401  (sets sys.path)
import torch  # noqa: E402

import tiny_qwen as tq  # noqa: E402
from wsync import layouts  # noqa: E402


def _through_buffer(piece):
    """The piece's elements read as the plugin does: from the storage, at offset and strides."""
    view = piece.view
    base = torch.tensor([], dtype=view.dtype).set_(view.storage())
    return torch.as_strided(base, piece.extent, piece.strides, piece.offset)


def _assemble(all_layouts, test):
    """Logical tensors from the pieces of every rank; checks overlapping boxes agree."""
    out, seen = {}, {}
    for layout in all_layouts:
        for piece in layout.pieces:
            param = layout.params[piece.param]
            if piece.param not in out:
                out[piece.param] = torch.full(param.shape, float("nan"), dtype=param.dtype)
                seen[piece.param] = torch.zeros(param.shape, dtype=torch.bool)
            box = tuple(slice(o, o + e) for o, e in zip(piece.origin, piece.extent))
            data = _through_buffer(piece)
            test.assertTrue(torch.equal(data, piece.view), piece.param)
            prior = seen[piece.param][box]
            if prior.any():
                test.assertTrue(torch.equal(out[piece.param][box][prior], data[prior]),
                                f"replicas of {piece.param} disagree")
            out[piece.param][box] = data
            seen[piece.param][box] = True
    for name, mask in seen.items():
        test.assertTrue(mask.all().item(), f"{name} is not covered")
    return out


def _config(c):
    return layouts.ModelConfig(c["heads"], c["kv_heads"], c["head_dim"], c["vocab"])


class LayoutTest(unittest.TestCase):
    def check_model(self, c, tp):
        logical = tq.random_logical(3, c)
        megatron, vllm = [], []
        for rank in range(tp):
            m = tq.MegatronTiny(rank, tp, None, c)
            tq.load_local(m, tq.megatron_shard(logical, rank, tp, c))
            megatron.append(layouts.megatron_layout(m, rank, tp, _config(c)))
            v = tq.VllmTiny(rank, tp, None, c)
            tq.load_local(v, tq.vllm_shard(logical, rank, tp, c))
            vllm.append(layouts.vllm_layout(v, rank, tp, _config(c)))
        for side in (megatron, vllm):
            got = _assemble(side, self)
            self.assertEqual(sorted(got), sorted(logical))
            for name in logical:
                self.assertTrue(torch.equal(got[name], logical[name]), name)

    def test_qwen_tp2(self):
        self.check_model(tq.CONFIG, 2)

    def test_two_query_groups_per_rank_tp2(self):
        c = dict(tq.CONFIG, heads=8, kv_heads=4, vocab=300)
        self.check_model(c, 2)

    def test_tp4_vocab_tail(self):
        c = dict(tq.CONFIG, heads=8, kv_heads=4, vocab=130)
        self.check_model(c, 4)

    def test_vllm_replicates_kv_heads_below_tp(self):
        c = dict(tq.CONFIG, heads=4, kv_heads=1)
        d, tp = c["head_dim"], 2
        logical = tq.random_logical(4, c)
        for rank in range(tp):
            v = tq.VllmTiny(rank, tp, None, c)
            q = logical["model.layers.0.self_attn.q_proj.weight"]
            k = logical["model.layers.0.self_attn.k_proj.weight"]
            val = logical["model.layers.0.self_attn.v_proj.weight"]
            with torch.no_grad():
                v.model.layers[0].self_attn.qkv_proj.weight.copy_(
                    torch.cat([q[rank * 2 * d:(rank + 1) * 2 * d], k, val]))
            layout = layouts.vllm_layout(v, rank, tp, _config(c))
            pieces = {p.param: p for p in layout.pieces if "layers.0.self_attn" in p.param
                      and p.param.endswith("weight") and "o_proj" not in p.param}
            self.assertEqual(pieces["model.layers.0.self_attn.k_proj.weight"].origin, (0, 0))
            self.assertEqual(pieces["model.layers.0.self_attn.q_proj.weight"].origin,
                             (rank * 2 * d, 0))
            self.assertTrue(torch.equal(pieces["model.layers.0.self_attn.k_proj.weight"].view, k))

    def test_shared_storage_is_one_buffer_and_strides_follow_views(self):
        flat = torch.arange(64, dtype=torch.float32)
        a = flat[:32].view(4, 8)
        b = flat[32:].view(8, 4).t()  # Transposed: strides (1, 4).
        layout = layouts.hf_layout([("a", a), ("b", b)])
        buffers, _ = layout.buffers()
        self.assertEqual(len(buffers), 1)
        self.assertEqual(buffers[0][2], 64 * 4)
        pb = [p for p in layout.pieces if p.param == "b"][0]
        self.assertEqual((pb.offset, pb.strides, pb.extent), (32, (1, 4), (4, 8)))
        self.assertTrue(torch.equal(_through_buffer(pb), b))

    def test_fused_experts(self):
        e, inter, h, tp = 3, 8, 4, 2
        gate = torch.randn(e, inter, h)
        up = torch.randn(e, inter, h)
        down = torch.randn(e, h, inter)
        sides = []
        for rank in range(tp):
            n = inter // tp
            w13 = torch.cat([gate[:, rank * n:(rank + 1) * n], up[:, rank * n:(rank + 1) * n]], 1)
            w2 = down[:, :, rank * n:(rank + 1) * n].clone()
            sides.append(layouts.vllm_layout({"model.layers.0.mlp.experts.w13_weight": w13,
                                              "model.layers.0.mlp.experts.w2_weight": w2},
                                             rank, tp, None))
        got = _assemble(sides, self)
        self.assertTrue(torch.equal(got["model.layers.0.mlp.experts.gate_proj.weight"], gate))
        self.assertTrue(torch.equal(got["model.layers.0.mlp.experts.up_proj.weight"], up))
        self.assertTrue(torch.equal(got["model.layers.0.mlp.experts.down_proj.weight"], down))

    def test_fsdp_flat_shards(self):
        shapes = [("a", (3, 5)), ("b", (7,)), ("c", (2, 3, 4))]
        logical = {n: torch.randn(s) for n, s in shapes}
        everything = torch.cat([logical[n].reshape(-1) for n, _ in shapes])
        world = 4
        per = -(-everything.numel() // world)
        padded = torch.zeros(per * world)
        padded[: everything.numel()] = everything
        sides = [layouts.fsdp_flat_layout(padded[r * per:(r + 1) * per].clone(), shapes, r * per)
                 for r in range(world)]
        got = _assemble(sides, self)
        for name in logical:
            self.assertTrue(torch.equal(got[name], logical[name]), name)

    def test_megatron_pipeline_stage_layer_offset(self):
        c = dict(tq.CONFIG, layers=1)
        m = tq.MegatronTiny(0, 1, None, c)
        named = [(n, t) for n, t in m.named_parameters() if n.startswith("decoder.layers.")]
        layout = layouts.megatron_layout(named, 0, 1, _config(c), layer_offset=5)
        self.assertTrue(layout.params)
        self.assertTrue(all(name.startswith("model.layers.5.") for name in layout.params),
                        sorted(layout.params))

    def test_dtype_names(self):
        from wsync.session import dtype_name
        self.assertEqual(dtype_name(torch.bfloat16), "bf16")
        self.assertEqual(dtype_name(torch.float32), "fp32")
        self.assertEqual(dtype_name("int8"), "int8")


if __name__ == "__main__":
    unittest.main()
