"""End to end with real torch models: 2 trainer processes hold a Megatron-TP2 small qwen2.5-like
transformer and take real Adam steps (TP all-reduces over gloo); 2 rollout processes hold the same
model in vLLM's fused TP2 structure (qkv_proj, gate_up_proj, padded vocabulary). After each of 3
pushes, every rollout parameter equals the trainer's logical parameter (an all-gather oracle that
does not use wsync), padding rows stay untouched, and a forward pass on the same tokens gives the
same logits on both sides."""

import datetime
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

TP = 2
STEPS = 3
SECRET = "python-e2e-secret-0123456789abcdef"
PAD_VALUE = 7.0


def _process(index, wsync_port, gloo_port):
    import torch
    import torch.distributed as dist

    import tiny_qwen as tq
    from wsync import layouts
    from wsync.trainer import RolloutSync, TrainerSync

    trainer = index < TP
    rank = index % TP
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=index,
                            world_size=2 * TP, timeout=datetime.timedelta(seconds=60))
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = groups[0 if trainer else 1]
    c = tq.CONFIG
    config = layouts.ModelConfig(c["heads"], c["kv_heads"], c["head_dim"], c["vocab"])
    common = dict(coordinator=f"127.0.0.1:{wsync_port}", secret=SECRET, job_id="python-e2e",
                  deadline_seconds=30, path_transports="*=ucx:sm,cma,self")
    report = {"role": "trainer" if trainer else "rollout", "rank": rank, "steps": []}
    eval_tokens = torch.randint(0, c["vocab"], (2, 12), generator=torch.Generator().manual_seed(5))
    names = sorted(tq.hf_shapes())

    if trainer:
        model = tq.MegatronTiny(rank, TP, group)
        tq.load_local(model, tq.megatron_shard(tq.random_logical(0), rank, TP))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        sync = TrainerSync(model, lambda m: layouts.megatron_layout(m, rank, TP, config), rank,
                           TP, num_rollouts=TP, **common)
        report["schedule"] = sync.schedule()
    else:
        model = tq.VllmTiny(rank, TP, group)
        tq.load_local(model, tq.vllm_shard(tq.random_logical(1), rank, TP, pad_value=PAD_VALUE))
        addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
        sync = RolloutSync(model, lambda m: layouts.vllm_layout(m, rank, TP, config), rank, TP,
                           num_trainers=TP, **common)
        report["schedule"] = sync.schedule()

    # Before the first push the two sides hold different weights: the logits must differ, so
    # that their equality after each push means something.
    with torch.no_grad():
        logits = model(eval_tokens)
    reference = logits.clone() if index == 0 else torch.empty_like(logits)
    dist.broadcast(reference, src=0)
    report["differ_before"] = not torch.allclose(logits, reference, rtol=1e-3, atol=1e-3)

    previous = None
    with sync:
        for version in range(1, STEPS + 1):
            step = {"version": version}
            if trainer:
                # A real optimizer step on random tokens (the same on both TP ranks).
                g = torch.Generator().manual_seed(100 + version)
                tokens = torch.randint(0, c["vocab"], (4, 16), generator=g)
                logits = model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c["vocab"]),
                                                         tokens[:, 1:].reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step["loss"] = loss.item()
                step["stats"] = sync.push(version)
            else:
                step["stats"] = sync.pull(version)
                step["state"] = [int(s) for s in sync.state()]
            # The oracle: every TP rank's local tensors by all_gather, unsharded by test code.
            with torch.no_grad():
                local = tq.gather_local(model, group)
                logical = (tq.megatron_unshard if trainer else tq.vllm_unshard)(local)
                logits = model(eval_tokens)
            # Trainer rank 0's logical weights and logits to everyone (world broadcast).
            expected = {}
            for name in names:
                t = logical[name].clone() if index == 0 else torch.empty(tq.hf_shapes()[name])
                dist.broadcast(t, src=0)
                expected[name] = t
            reference = logits.clone() if index == 0 else torch.empty_like(logits)
            dist.broadcast(reference, src=0)
            mismatched = [n for n in names if not torch.equal(expected[n], logical[n])]
            step["mismatched"] = mismatched
            step["max_logit_diff"] = (logits - reference).abs().max().item()
            step["logits_close"] = bool(torch.allclose(logits, reference, rtol=1e-5, atol=1e-5))
            if trainer:
                step["changed"] = previous is None or any(
                    not torch.equal(previous[n], logical[n]) for n in names)
                previous = {n: logical[n].clone() for n in names}
            else:
                emb = model.model.embed_tokens.weight
                begin = rank * emb.shape[0]
                pad = emb[max(0, c["vocab"] - begin):]
                step["padding_untouched"] = bool((pad == PAD_VALUE).all().item())
                step["in_place"] = all(p.data_ptr() == addresses[n]
                                       for n, p in model.named_parameters())
            report["steps"].append(step)
    dist.destroy_process_group()
    return report


class EndToEndTest(unittest.TestCase):
    def test_megatron_tp2_to_vllm_tp2(self):
        wsync_port, gloo_port = free_ports(2)
        results = run_processes(_process, 2 * TP, (wsync_port, gloo_port), timeout=150)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        for status, report in results:
            who = f"{report['role']} {report['rank']}"
            self.assertEqual(len(report["steps"]), STEPS, who)
            if report["role"] == "trainer":
                self.assertGreater(report["schedule"]["sent_bytes"], 0, who)
            else:
                self.assertGreater(report["schedule"]["received_bytes"], 0, who)
                self.assertTrue(report["differ_before"], f"{who}: logits equal before any push")
            for step in report["steps"]:
                what = f"{who} version {step['version']}"
                self.assertEqual(step["mismatched"], [], what)
                self.assertTrue(step["logits_close"],
                                f"{what}: logits differ by {step['max_logit_diff']}")
                self.assertEqual(step["stats"]["version"], step["version"], what)
                if report["role"] == "trainer":
                    self.assertTrue(step["changed"], f"{what}: the optimizer step changed nothing")
                    self.assertGreater(step["stats"]["sent_bytes"], 0, what)
                else:
                    self.assertEqual(step["state"], [3, step["version"]], what)  # IDLE, version
                    self.assertTrue(step["padding_untouched"], what)
                    self.assertTrue(step["in_place"], what)
                    self.assertGreater(step["stats"]["received_bytes"], 0, what)
        losses = [s["loss"] for s in results[0][1]["steps"]]
        print("losses", losses, "max logit diff",
              max(s["max_logit_diff"] for _, r in results for s in r["steps"]))


if __name__ == "__main__":
    unittest.main()
