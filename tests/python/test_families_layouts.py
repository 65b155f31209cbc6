"""wsync.layouts and wsync.fsdp against the module trees of today's model families (names and
sharding from the frameworks' source: see families.py), without the library: for every family
and a grid of parallelisms, the pieces of all ranks, read back through (storage, offset,
strides), must give every element of every logical parameter, and replicas must agree.

Rollout side: vLLM and SGLang with TP, DP replicas, EP (whole experts; vLLM's uneven split);
trainer side: FSDP2 / DTensor Shard(0) with Hugging Face names (uneven and empty chunks)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402,F401  (sets sys.path)
import torch  # noqa: E402

import families as fam  # noqa: E402
from test_layouts import _assemble  # noqa: E402
from wsync import layouts  # noqa: E402
from wsync.fsdp import fsdp2_layout  # noqa: E402

MOE = ("qwen3-moe", "qwen2-moe", "deepseek-v3", "kimi-k2")


def rollout_grid(f):
    """(tp, dp, ep) rollout configurations that fit the family: tp divides the heads, and
    either no EP or wide EP over every rank (vLLM's --enable-expert-parallel with DP)."""
    out = []
    for tp in (1, 2, 4):
        for dp in (1, 2):
            out.append((tp, dp, 1))
            if f["experts"] and tp * dp > 1:
                out.append((tp, dp, tp * dp))
    return out


def rollout_layouts(f, logical, tp, dp, ep, engine, prefix=""):
    make = layouts.vllm_layout if engine == "vllm" else layouts.sglang_layout
    sides = []
    for rank in range(tp * dp):
        tp_rank = rank % tp
        ep_rank = rank if ep > 1 else 0
        tensors = fam.rollout_tensors(logical, f, tp, tp_rank, ep, ep_rank, engine, prefix)
        tree = fam.module_tree(tensors)
        sides.append(make(tree, tp_rank, tp, fam.config_of(f), ep_rank=ep_rank, ep_size=ep))
    return sides


class FamilyLayoutTest(unittest.TestCase):
    def check_equal(self, sides, logical, prefix=""):
        got = _assemble(sides, self)
        self.assertEqual(sorted(got), sorted(prefix + n for n in logical))
        for name, value in logical.items():
            self.assertEqual(got[prefix + name].dtype, value.dtype, name)
            self.assertTrue(torch.equal(got[prefix + name], value), f"{prefix}{name} differs")

    def check_rollout(self, name, engine):
        f = fam.FAMILIES[name]
        logical = fam.random_logical(f, 11)
        grid = rollout_grid(f)
        for tp, dp, ep in grid:
            if engine == "sglang" and ep > 1 and f["experts"] % ep:
                continue  # SGLang refuses it (test_sglang_uneven_ep_is_refused).
            with self.subTest(family=name, engine=engine, tp=tp, dp=dp, ep=ep):
                self.check_equal(rollout_layouts(f, logical, tp, dp, ep, engine), logical)
        self.assertGreaterEqual(len(grid), 6)

    def check_fsdp2(self, name):
        f = fam.FAMILIES[name]
        logical = fam.random_logical(f, 12)
        hf = fam.hf_tensors(logical, f)
        for world in (1, 2, 3):
            with self.subTest(family=name, world=world):
                sides = [fsdp2_layout(fam.fsdp2_shards(hf, r, world), fam.config_of(f))
                         for r in range(world)]
                self.check_equal(sides, logical)

    # One test per family and side, so that docs/python_tests.md's table names each.
    def test_llama3_vllm(self):
        self.check_rollout("llama3", "vllm")

    def test_qwen25_vllm(self):
        self.check_rollout("qwen2.5", "vllm")

    def test_qwen3_vllm(self):
        self.check_rollout("qwen3", "vllm")

    def test_qwen3_moe_vllm(self):
        self.check_rollout("qwen3-moe", "vllm")

    def test_qwen2_moe_vllm(self):
        self.check_rollout("qwen2-moe", "vllm")

    def test_deepseek_v3_vllm(self):
        self.check_rollout("deepseek-v3", "vllm")

    def test_kimi_k2_vllm(self):
        self.check_rollout("kimi-k2", "vllm")

    def test_dense_sglang(self):
        for name in ("llama3", "qwen2.5", "qwen3"):
            self.check_rollout(name, "sglang")

    def test_moe_sglang(self):
        for name in MOE:
            self.check_rollout(name, "sglang")

    def test_fsdp2_dense(self):
        for name in ("llama3", "qwen2.5", "qwen3"):
            self.check_fsdp2(name)

    def test_fsdp2_moe(self):
        for name in MOE:
            self.check_fsdp2(name)

    def test_hsdp_replicate_then_shard(self):
        f = fam.FAMILIES["deepseek-v3"]
        logical = fam.random_logical(f, 17)
        hf = fam.hf_tensors(logical, f)
        sides = [fsdp2_layout(fam.fsdp2_shards(hf, r, 3, replicas=2), fam.config_of(f))
                 for r in range(6)]
        self.check_equal(sides, logical)
        # Replica 1 holds what replica 0 holds, rank by rank.
        for r in range(3):
            self.assertEqual([(p.param, p.origin, p.extent) for p in sides[r].pieces],
                             [(p.param, p.origin, p.extent) for p in sides[r + 3].pieces])

    def test_fsdp2_wrapper_names_and_partial_refused(self):
        f = fam.FAMILIES["qwen3"]
        logical = fam.random_logical(f, 19)
        hf = fam.hf_tensors(logical, f)
        shards = fam.fsdp2_shards(hf, 0, 1)
        # Activation checkpointing and torch.compile insert a component into the names.
        wrapped = [(n.replace("layers.0.", "layers.0._checkpoint_wrapped_module.")
                    .replace("model.", "_orig_mod.model.", 1), t) for n, t in shards]
        self.check_equal([fsdp2_layout(wrapped, fam.config_of(f))], logical)

        class Partial:
            def is_shard(self):
                return False

            def is_partial(self):
                return True
        name, dt = shards[0]
        dt.placements = (Partial(),)
        with self.assertRaises(layouts.LayoutError) as caught:
            fsdp2_layout([(name, dt)], fam.config_of(f))
        self.assertIn("is partial", caught.exception.message)

    def test_vision_language_prefix(self):
        f = fam.FAMILIES["qwen2.5"]
        logical = fam.random_logical(f, 13)
        sides = rollout_layouts(f, logical, 2, 1, 1, "vllm", prefix="language_model.")
        self.check_equal(sides, logical, prefix="language_model.")

    def test_vllm_uneven_ep_blocks(self):
        # kimi-k2 here has 6 experts; over ep = 4, vLLM gives ranks 2, 2, 1, 1 experts.
        f = fam.FAMILIES["kimi-k2"]
        logical = fam.random_logical(f, 14)
        sides = rollout_layouts(f, logical, 2, 2, 4, "vllm")
        name = "model.layers.1.mlp.experts.down_proj.weight"
        boxes = [[(p.origin[0], p.extent[0]) for p in s.pieces if p.param == name] for s in sides]
        self.assertEqual(boxes, [[(0, 2)], [(2, 2)], [(4, 1)], [(5, 1)]])

    def test_vllm_round_robin_placement(self):
        f = fam.FAMILIES["qwen3-moe"]
        logical = fam.random_logical(f, 15)
        w2 = logical["model.layers.0.mlp.experts.down_proj.weight"]
        sides = []
        for rank in range(4):
            local = {"model.layers.0.mlp.experts.w2_weight": w2[rank::4].clone()}
            sides.append(layouts.vllm_layout(local, rank % 2, 2, fam.config_of(f), ep_rank=rank,
                                             ep_size=4, expert_placement="round_robin"))
        got = _assemble(sides, self)
        self.assertTrue(torch.equal(got["model.layers.0.mlp.experts.down_proj.weight"], w2))

    def test_w13_order_per_engine(self):
        f = fam.FAMILIES["qwen3-moe"]
        logical = fam.random_logical(f, 18)
        name = "model.layers.1.mlp.experts.w13_weight"
        sides, default = [], []
        for rank in range(2):
            tensors = fam.rollout_tensors(logical, f, 2, rank)
            w13 = tensors[name]
            half = w13.shape[1] // 2
            swapped = {name: torch.cat([w13[:, half:], w13[:, :half]], dim=1)}  # [up | gate]
            sides.append(layouts.vllm_layout(swapped, rank, 2, fam.config_of(f),
                                             w13_order="up_gate"))
            default.append(layouts.vllm_layout(swapped, rank, 2, fam.config_of(f)))
        for order, layout_list in (("up_gate", sides), ("gate_up", default)):
            got = _assemble(layout_list, self)
            gate = "model.layers.1.mlp.experts.gate_proj.weight"
            self.assertEqual(torch.equal(got[gate], logical[gate]), order == "up_gate", order)

    def test_sglang_uneven_ep_is_refused(self):
        f = fam.FAMILIES["kimi-k2"]
        w2 = torch.zeros(2, f["hidden"], f["moe_intermediate"])
        with self.assertRaises(layouts.LayoutError) as caught:
            layouts.sglang_layout({"model.layers.1.mlp.experts.w2_weight": w2}, 0, 2,
                                  fam.config_of(f), ep_rank=0, ep_size=4)
        self.assertIn("does not divide the 6 experts", caught.exception.message)

    def test_wrong_local_expert_count_is_refused(self):
        f = fam.FAMILIES["qwen3-moe"]
        w2 = torch.zeros(3, f["hidden"], f["moe_intermediate"])  # Rank 3 of 4 holds 1 of 6.
        with self.assertRaises(layouts.LayoutError) as caught:
            layouts.vllm_layout({"model.layers.0.mlp.experts.w2_weight": w2}, 1, 2,
                                fam.config_of(f), ep_rank=3, ep_size=4)
        self.assertIn("holds 1 of 6", caught.exception.message)

    def test_every_unmapped_name_is_listed_with_a_rule(self):
        f = fam.FAMILIES["qwen3"]
        tensors = fam.rollout_tensors(fam.random_logical(f, 16), f, 2, 0)
        tensors["visual.blocks.0.attn.proj.weight"] = torch.zeros(8, 8)
        tensors["model.layers.1.mlp.mystery_norm.scale"] = torch.zeros(8)
        with self.assertRaises(layouts.LayoutError) as caught:
            layouts.vllm_layout(fam.module_tree(tensors), 0, 2, fam.config_of(f))
        message = caught.exception.message
        self.assertIn("no rule maps 2 parameter(s)", message)
        self.assertIn('visual.blocks.0.attn.proj.weight (8, 8): e.g. Rule(r"visual\\.blocks\\.'
                      '(\\d+)\\.attn\\.proj\\.weight", "replicated", r"visual.blocks.\\1.attn.proj.'
                      'weight")', message)
        self.assertIn("model.layers.1.mlp.mystery_norm.scale (8,): e.g. Rule(", message)
        # The suggested rules, passed back, map them.
        layout = layouts.vllm_layout(
            fam.module_tree(tensors), 0, 2, fam.config_of(f),
            rules=[layouts.Rule(r"visual\.blocks\.(\d+)\.attn\.proj\.weight", "column",
                                r"visual.blocks.\1.attn.proj.weight"),
                   layouts.Rule(r"model\.layers\.(\d+)\.mlp\.mystery_norm\.scale", "replicated",
                                r"model.layers.\1.mlp.mystery_norm.scale")])
        self.assertEqual(layout.params["visual.blocks.0.attn.proj.weight"].shape, (16, 8))


if __name__ == "__main__":
    unittest.main()
