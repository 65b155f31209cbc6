"""Megatron-core trainers of dense and MoE families from their module names (families.py): TP,
PP (each stage numbering its layers from 0, megatron_layout's layer_offset), EP (grouped-GEMM
experts linear_fc1.weight<k>, local expert k of EP rank e being global e * E / ep + k), global
ranks in Megatron's "tp-cp-ep-dp-pp" order (layouts.megatron_ranks). All ranks' pieces, read
back through (storage, offset, strides), give every element of every logical parameter; and,
where the named_layout_dump tool is available, each rank covers exactly the elements the C++
megatron(tp, pp, ep, dp) layout gives the same rank (boxes and buffers legitimately differ:
linear_qkv interleaves q, k and v per query group, and C++ packs one buffer per process where
Megatron keeps a storage per parameter here)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402,F401  (sets sys.path)
import torch  # noqa: E402

import families as fam  # noqa: E402
from test_layouts import _assemble  # noqa: E402
from test_named_layout_oracle import DUMP, cpp_layout  # noqa: E402
from wsync import layouts  # noqa: E402

GRID = [(tp, pp, ep) for tp in (1, 2) for pp in (1, 2) for ep in (1, 2)]


def megatron_sides(f, logical, tp, pp, ep, down_split=False):
    sides = []
    config = fam.config_of(f)
    for rank in range(tp * pp * ep):
        tp_rank, _, stage, ep_rank = layouts.megatron_ranks(rank, tp, pp, ep)
        tensors = fam.megatron_tensors(logical, f, tp, tp_rank, pp, stage, ep, ep_rank,
                                       down_split)
        offset = fam.megatron_stage_layers(f, pp, stage)[0]
        sides.append(layouts.megatron_layout(
            fam.module_tree(tensors), tp_rank, tp, config, layer_offset=offset, ep_rank=ep_rank,
            ep_size=ep, tied_embeddings=f["tied"], shared_expert=f["shared"] or "shared_experts"))
    return sides


def _covered(boxes, shapes):
    """{param: elements the boxes cover}: Megatron's linear_qkv is one box per query group,
    the C++ layout's q / k / v one box per rank; both must cover the same elements."""
    out = {}
    for name, origin, extent in boxes:
        mask = out.setdefault(name, torch.zeros(shapes[name], dtype=torch.bool))
        mask[tuple(slice(o, o + e) for o, e in zip(origin, extent))] = True
    return out


class MegatronFamilyTest(unittest.TestCase):
    def check(self, name, down_split=False):
        f = fam.FAMILIES[name]
        logical = fam.random_logical(f, 31, torch.bfloat16)
        for tp, pp, ep in GRID:
            if ep > 1 and not f["experts"] or f["layers"] % pp:
                continue
            with self.subTest(family=name, tp=tp, pp=pp, ep=ep):
                sides = megatron_sides(f, logical, tp, pp, ep, down_split)
                got = _assemble(sides, self)
                self.assertEqual(sorted(got), sorted(logical))
                for n, value in logical.items():
                    self.assertTrue(torch.equal(got[n], value), n)
                if DUMP and not down_split:
                    self.check_cpp_boxes(f, name, sides, tp, pp, ep)

    def check_cpp_boxes(self, f, name, sides, tp, pp, ep):
        cpp = cpp_layout(fam.CPP_MODELS[name], f"megatron(tp={tp},pp={pp},ep={ep},dp={ep})")
        self.assertNotIsInstance(cpp, str, cpp)
        params, processes = cpp
        py_params = {(n, p.shape) for s in sides for n, p in s.params.items()}
        self.assertEqual(py_params, {(n, shape) for n, _, shape in params})
        shapes = {n: shape for n, _, shape in params}
        for rank, (side, pieces) in enumerate(zip(sides, processes)):
            mine = _covered([(p.param, p.origin, p.extent) for p in side.pieces], shapes)
            theirs = _covered([(n, o, e) for n, _, o, e, _, _ in pieces], shapes)
            self.assertEqual(sorted(mine), sorted(theirs), f"rank {rank}")
            for n in mine:
                self.assertTrue(torch.equal(mine[n], theirs[n]), f"rank {rank}: {n}")

    def test_llama3_megatron(self):
        self.check("llama3")

    def test_qwen25_tied_megatron(self):
        self.check("qwen2.5")

    def test_qwen3_megatron(self):
        self.check("qwen3")

    def test_qwen3_moe_megatron(self):
        self.check("qwen3-moe")

    def test_qwen2_moe_megatron(self):
        # Qwen2-MoE's shared_expert and its sigmoid gate (SharedExpertMLP.gate_weight), qkv bias.
        self.check("qwen2-moe")

    def test_deepseek_v3_megatron(self):
        # MLA (down projections duplicated, TE's fused latent norms), a first dense layer, shared
        # experts, the router's expert_bias; 3 layers, so pp = 1 only.
        self.check("deepseek-v3")

    def test_kimi_k2_megatron_column_split_down_projections(self):
        self.check("kimi-k2", down_split=True)

    def test_megatron_ranks_order(self):
        # tp=2, pp=2, ep=2 (dp=2): rank = (pp_rank * dp + dp_rank) * tp + tp_rank.
        self.assertEqual(layouts.megatron_ranks(5, 2, 2, 2), (1, 0, 1, 0))
        self.assertEqual(layouts.megatron_ranks(3, 2, 2, 2), (1, 1, 0, 1))


if __name__ == "__main__":
    unittest.main()
