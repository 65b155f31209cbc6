"""End to end with a MoE model: 2 FSDP2 trainer processes (DTensor Shard(0) shards of a
Qwen3-MoE module tree with Hugging Face names; 6 experts, q_norm / k_norm) and 2 vLLM rollout
processes with wide expert parallelism (tp 1, dp 2, ep 2: each holds 3 whole experts in
FusedMoE's w13 / w2 and the rest of the model whole). The trainers' logits come from their
shards gathered over gloo (as FSDP2's forward does); the rollouts' from their own tensors, the
expert outputs all-reduced over the EP group. Before the sync the logits differ; after it every
rollout element equals the oracle's and the logits are equal."""

import datetime
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-moe-e2e-secret-0123456789abc"
FAMILY = "qwen3-moe"


def _gather_fsdp2(shards, group):
    """Whole HF tensors from every trainer's Shard(0) shards (padded all_gather, trimmed)."""
    import torch
    import torch.distributed as dist
    world = dist.get_world_size(group)
    out = {}
    for name, dt in shards:
        rows = dt.shape[0]
        chunk = -(-rows // world)
        local = dt.to_local()
        padded = torch.zeros((chunk,) + tuple(dt.shape[1:]), dtype=local.dtype)
        padded[:local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded, group=group)
        out[name] = torch.cat(parts)[:rows]
    return out


def _stack_experts(hf, f):
    """The logical tensors of whole HF tensors: per-expert matrices stacked [E, ...]."""
    import torch
    out = {n: t for n, t in hf.items() if ".mlp.experts." not in n}
    for i in range(f["layers"]):
        p = f"model.layers.{i}.mlp.experts."
        for proj in ("gate_proj", "up_proj", "down_proj"):
            out[p + proj + ".weight"] = torch.stack(
                [hf[f"{p}{k}.{proj}.weight"] for k in range(f["experts"])])
    return out


def _process(index, wsync_port, gloo_port):
    import torch
    import torch.distributed as dist

    import families as fam
    import moe_forward
    from wsync import layouts
    from wsync.fsdp import fsdp2_layout
    from wsync.trainer import RolloutSync, TrainerSync

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=index,
                            world_size=4, timeout=datetime.timedelta(seconds=60))
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    trainer, rank = index < 2, index % 2
    group = groups[0 if trainer else 1]
    f = fam.FAMILIES[FAMILY]
    config = fam.config_of(f)
    logical = fam.random_logical(f, 41)
    tokens = torch.randint(0, f["vocab"], (2, 10), generator=torch.Generator().manual_seed(3))
    common = dict(coordinator=f"127.0.0.1:{wsync_port}", secret=SECRET, job_id="moe-e2e",
                  deadline_seconds=30, path_transports="*=ucx:sm,cma,self")
    report = {"trainer": trainer, "rank": rank}
    if trainer:
        shards = fam.fsdp2_shards(fam.hf_tensors(logical, f), rank, 2)
        layout = fsdp2_layout(shards, config)
        with torch.no_grad():
            logits = moe_forward.hf_logits(tokens, f, _stack_experts(_gather_fsdp2(shards, group),
                                                                     f))
    else:
        ids = fam.experts_of(f, 2, rank, "vllm")
        local = fam.rollout_tensors(fam.random_logical(f, 42), f, 1, 0, 2, rank, "vllm")
        model = fam.module_tree(local)
        layout = layouts.vllm_layout(model, 0, 1, config, ep_rank=rank, ep_size=2)
        params = dict(model.named_parameters())

        def all_reduce(x):
            x = x.contiguous().clone()
            dist.all_reduce(x, group=group)
            return x

        def rollout_logits():
            with torch.no_grad():
                return moe_forward.vllm_ep_logits(tokens, f, params, ids, all_reduce)
        logits = rollout_logits()
    reference = logits.clone() if index == 0 else torch.empty_like(logits)
    dist.broadcast(reference, src=0)
    report["max_diff_before"] = (logits - reference).abs().max().item()
    if trainer:
        with TrainerSync(shards, layout, rank, 2, num_rollouts=2, **common) as sync:
            report["stats"] = sync.push(1)
    else:
        with RolloutSync(model, layout, rank, 2, num_trainers=2, **common) as sync:
            report["stats"] = sync.pull(1)
        want = fam.rollout_tensors(logical, f, 1, 0, 2, rank, "vllm")
        report["mismatched"] = [n for n in want if not torch.equal(params[n], want[n])]
        logits = rollout_logits()
        report["max_diff_after"] = (logits - reference).abs().max().item()
        report["close_after"] = bool(torch.allclose(logits, reference, rtol=1e-5, atol=1e-5))
    dist.destroy_process_group()
    return report


class MoeEndToEndTest(unittest.TestCase):
    def test_fsdp2_to_vllm_wide_ep_logits(self):
        wsync_port, gloo_port = free_ports(2)
        results = run_processes(_process, 4, (wsync_port, gloo_port), timeout=150)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        for _, report in results:
            who = f"{'trainer' if report['trainer'] else 'rollout'} {report['rank']}"
            self.assertEqual(report["stats"]["version"], 1, who)
            if report["trainer"]:
                continue
            self.assertGreater(report["max_diff_before"], 1e-2, f"{who}: equal before the sync")
            self.assertEqual(report["mismatched"], [], who)
            self.assertTrue(report["close_after"],
                            f"{who}: logits differ by {report['max_diff_after']}")
        print("max logit diff before / after:",
              [(r["max_diff_before"], r.get("max_diff_after")) for _, r in results])


if __name__ == "__main__":
    unittest.main()
