"""wsync.sglang's adapter through the calls SGLang's ModelRunner gets (SGLang cannot be installed
here): init_weights_update_group, update_weights_from_distributed with a version, and
destroy_weights_update_group, each returning (success, message), with SGLang's argument meanings
(the trainer is rank 0 of world_size 1 + TP, the engine's rank_offset 1); against a torch module
with SGLang's (vLLM's) parameter names, TP2, fed by one Megatron TP1 trainer."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-sglang-secret-0123456789abcdef"
TP = 2


def _process(index, port):
    import torch

    import tiny_qwen as tq
    from wsync import layouts
    from wsync.sglang import WsyncSGLangAdapter
    from wsync.trainer import TrainerSync

    c = tq.CONFIG
    config = layouts.ModelConfig(c["heads"], c["kv_heads"], c["head_dim"], c["vocab"])
    os.environ["WSYNC_SECRET"] = SECRET
    if index == 0:
        model = tq.MegatronTiny(0, 1, None)
        with TrainerSync(model, lambda m: layouts.megatron_layout(m, 0, 1, config), 0, 1,
                         f"127.0.0.1:{port}", SECRET, num_rollouts=TP, job_id="wsync",
                         deadline_seconds=30, path_transports="*=ucx:sm,cma,self") as sync:
            for version in (1, 2):
                tq.load_local(model, tq.megatron_shard(tq.random_logical(20 + version), 0, 1))
                sync.push(version)
        return None
    rank = index - 1
    model = tq.VllmTiny(rank, TP, None)
    adapter = WsyncSGLangAdapter(model, rank, TP, config)
    out = {"unknown": adapter.update_weights_from_distributed(version=1)}
    out["init"] = adapter.init_weights_update_group(
        "127.0.0.1", port, rank_offset=1, world_size=1 + TP, group_name="wsync", backend="wsync",
        num_trainers=1, deadline_seconds=30, path_transports="*=ucx:sm,cma,self")
    out["updates"] = []
    for version in (1, 2):
        ok = adapter.update_weights_from_distributed(
            names=["ignored"], dtypes=["bfloat16"], shapes=[[1]], group_name="wsync",
            version=version)
        want = tq.vllm_shard(tq.random_logical(20 + version), rank, TP)
        params = dict(model.named_parameters())
        emb = "model.embed_tokens.weight"
        real = c["vocab"] - rank * params[emb].shape[0]
        wrong = [n for n, t in want.items() if not torch.equal(
            params[n][:real] if n == emb else params[n], t[:real] if n == emb else t)]
        out["updates"].append((ok, wrong))
    out["destroy"] = adapter.destroy_weights_update_group("wsync")
    return out


class SGLangAdapterTest(unittest.TestCase):
    def test_adapter_calls(self):
        port, = free_ports(1)
        results = run_processes(_process, 1 + TP, (port,), timeout=120)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        for _, out in results[1:]:
            self.assertFalse(out["unknown"][0])
            self.assertTrue(out["init"][0], out["init"])
            for (ok, wrong) in out["updates"]:
                self.assertTrue(ok[0], ok)
                self.assertEqual(wrong, [])
            self.assertTrue(out["destroy"][0])

    def test_expert_parallel_layout(self):
        # An SGLang EP rank of a DeepSeek-V3 module tree (fused_qkv_a_proj_with_mqa, EP 2 over
        # its 2 TP ranks): the adapter's layout holds its 4 of the 8 experts.
        import families as fam
        from wsync.sglang import WsyncSGLangAdapter
        f = fam.FAMILIES["deepseek-v3"]
        tensors = fam.rollout_tensors(fam.random_logical(f, 5), f, 2, 1, 2, 1, "sglang")
        adapter = WsyncSGLangAdapter(fam.module_tree(tensors), 1, 2, fam.config_of(f),
                                     ep_rank=1, ep_size=2)
        boxes = {(p.origin[0], p.extent[0]) for p in adapter.layout().pieces
                 if p.param == "model.layers.2.mlp.experts.down_proj.weight"}
        self.assertEqual(boxes, {(4, 4)})

    def test_w13_order_and_dp_attention_groups(self):
        # w13_order="up_gate" (a kernel keeping [up | gate]): gate_proj is the second half of
        # w13. Under DP attention (tp 2, attention TP 1) self_attn is whole, the MLP a TP shard.
        import torch

        import families as fam
        from wsync.sglang import WsyncSGLangAdapter
        f = fam.FAMILIES["qwen3-moe"]
        tensors = fam.rollout_tensors(fam.random_logical(f, 7), f, 2, 1, 1, 0, "sglang")
        name = "model.layers.1.mlp.experts.w13_weight"
        half = tensors[name].shape[1] // 2
        tree = fam.module_tree(tensors)
        for order, gate_half in (("up_gate", slice(half, None)), ("gate_up", slice(0, half))):
            adapter = WsyncSGLangAdapter(tree, 1, 2, fam.config_of(f), w13_order=order)
            gate = [p.view for p in adapter.layout().pieces
                    if p.param == "model.layers.1.mlp.experts.gate_proj.weight"]
            self.assertEqual(len(gate), 1)
            self.assertTrue(torch.equal(gate[0], tensors[name][:, gate_half]), order)
        import tiny_qwen as tq
        from test_sglang_engines import _dp_attention_model, _hf_config
        adapter = WsyncSGLangAdapter(_dp_attention_model(1), 1, 2, _hf_config(), attn_tp_rank=0,
                                     attn_tp_size=1)
        boxes = {p.param: (p.origin, p.extent) for p in adapter.layout().pieces}
        c = tq.CONFIG
        self.assertEqual(boxes["model.layers.0.self_attn.q_proj.weight"],
                         ((0, 0), (c["heads"] * c["head_dim"], c["hidden"])))
        self.assertEqual(boxes["model.embed_tokens.weight"], ((0, 0), (c["vocab"], c["hidden"])))
        inter = c["intermediate"] // 2
        self.assertEqual(boxes["model.layers.0.mlp.up_proj.weight"],
                         ((inter, 0), (inter, c["hidden"])))


if __name__ == "__main__":
    unittest.main()
