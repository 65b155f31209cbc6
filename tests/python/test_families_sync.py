"""One real multi-process sync per model family: 2 FSDP2 trainer processes (DTensor Shard(0)
shards of a Hugging Face module tree, torch.chunk's uneven and empty shards included) and 2
rollout processes holding the family's vLLM or SGLang module tree (TP, wide EP, TP-split
experts); and three Megatron-core trainers (PP 2, EP 2 with DP replicas of everything else,
TP 2 with MLA). After the push, every element of every rollout tensor, vocabulary padding included,
equals what the test's own oracle (families.rollout_tensors of the trainer's logical weights)
puts there; before it, the rollouts hold other weights. The processes run the families one
after another, one wsync job each."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

TRAINERS = 2
ROLLOUTS = 2
SECRET = "python-families-secret-0123456789ab"
PAD_VALUE = 7.0

# (family, engine, rollout tp, rollout dp, ep, trainer): ep = tp * dp is vLLM's wide EP
# (SGLang's --ep-size over its TP ranks), ep = 1 splits the experts over TP. The trainer is
# "fsdp2" (Shard(0) over both) or Megatron-core's (tp, pp, ep) with dp = ep.
CASES = [
    ("llama3", "vllm", 2, 1, 1, "fsdp2"),
    ("qwen2.5", "vllm", 2, 1, 1, "fsdp2"),
    ("qwen3", "sglang", 2, 1, 1, "fsdp2"),
    ("qwen3-moe", "vllm", 1, 2, 2, "fsdp2"),
    ("qwen2-moe", "sglang", 2, 1, 2, "fsdp2"),
    ("deepseek-v3", "vllm", 2, 1, 2, "fsdp2"),
    ("kimi-k2", "vllm", 2, 1, 1, "fsdp2"),
    ("qwen3", "sglang", 2, 1, 1, (1, 2, 1)),
    ("qwen3-moe", "vllm", 2, 1, 1, (1, 1, 2)),
    ("deepseek-v3", "vllm", 1, 2, 2, (2, 1, 1)),
]


def _trainer_layout(f, logical, index, trainer):
    """(tensors kept alive, layout) of trainer `index`."""
    import families as fam
    from wsync import layouts
    from wsync.fsdp import fsdp2_layout
    config = fam.config_of(f)
    if trainer == "fsdp2":
        shards = fam.fsdp2_shards(fam.hf_tensors(logical, f), index, TRAINERS)
        return shards, fsdp2_layout(shards, config)
    tp, pp, ep = trainer
    tp_rank, _, stage, ep_rank = layouts.megatron_ranks(index, tp, pp, ep)
    tensors = fam.megatron_tensors(logical, f, tp, tp_rank, pp, stage, ep, ep_rank)
    offset = fam.megatron_stage_layers(f, pp, stage)[0]
    return tensors, layouts.megatron_layout(tensors, tp_rank, tp, config, layer_offset=offset,
                                            ep_rank=ep_rank, ep_size=ep,
                                            tied_embeddings=f["tied"])


def _case(index, case, port):
    import torch

    import families as fam
    from wsync import layouts
    from wsync.trainer import RolloutSync, TrainerSync

    name, engine, tp, dp, ep, trainer = case
    f = fam.FAMILIES[name]
    config = fam.config_of(f)
    logical = fam.random_logical(f, 100 + CASES.index(case))
    common = dict(coordinator=f"127.0.0.1:{port}", secret=SECRET,
                  job_id=f"families-{CASES.index(case)}", deadline_seconds=30,
                  path_transports="*=ucx:sm,cma,self")
    out = {"case": case, "index": index}
    if index < TRAINERS:
        tensors, layout = _trainer_layout(f, logical, index, trainer)
        with TrainerSync(tensors, layout, index, TRAINERS, num_rollouts=ROLLOUTS,
                         **common) as sync:
            out["stats"] = sync.push(1)
        return out
    rank = index - TRAINERS
    tp_rank, ep_rank = rank % tp, (rank if ep > 1 else 0)
    stale = fam.random_logical(f, 900)
    model = fam.module_tree(fam.rollout_tensors(stale, f, tp, tp_rank, ep, ep_rank, engine,
                                                pad_value=PAD_VALUE))
    make = layouts.vllm_layout if engine == "vllm" else layouts.sglang_layout
    layout = make(model, tp_rank, tp, config, ep_rank=ep_rank, ep_size=ep)
    want = fam.rollout_tensors(logical, f, tp, tp_rank, ep, ep_rank, engine, pad_value=PAD_VALUE)
    params = dict(model.named_parameters())
    out["names"] = sorted(params) == sorted(want)
    out["differ_before"] = [n for n in want if not torch.equal(params[n], want[n])]
    addresses = {n: p.data_ptr() for n, p in params.items()}
    with RolloutSync(model, layout, rank, ROLLOUTS, num_trainers=TRAINERS, **common) as sync:
        out["stats"] = sync.pull(1)
        out["state"] = [int(s) for s in sync.state()]
    out["mismatched"] = [n for n in want if not torch.equal(params[n], want[n])]
    out["elements"] = sum(t.numel() for t in want.values())
    out["in_place"] = all(p.data_ptr() == addresses[n] for n, p in params.items())
    return out


def _process(index, ports):
    return [_case(index, case, port) for case, port in zip(CASES, ports)]


class FamilySyncTest(unittest.TestCase):
    def test_fsdp2_to_vllm_and_sglang_every_family(self):
        ports = free_ports(len(CASES))
        results = run_processes(_process, TRAINERS + ROLLOUTS, (ports,), timeout=170)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        checked = {}
        for status, reports in results:
            self.assertEqual(len(reports), len(CASES))
            for report in reports:
                what = f"{report['case']} process {report['index']}"
                self.assertEqual(report["stats"]["version"], 1, what)
                if report["index"] < TRAINERS:
                    continue
                self.assertTrue(report["names"], what)
                self.assertTrue(report["differ_before"], f"{what}: equal before the sync")
                self.assertEqual(report["mismatched"], [], what)
                self.assertEqual(report["state"], [3, 1], what)  # IDLE at version 1.
                self.assertTrue(report["in_place"], what)
                self.assertGreater(report["stats"]["received_bytes"], 0, what)
                key = f"{report['case'][0]} <- {report['case'][5]}"
                checked[key] = checked.get(key, 0) + report["elements"]
        self.assertEqual(len(checked), len(CASES))
        print("rollout elements checked per family:", checked)


if __name__ == "__main__":
    unittest.main()
