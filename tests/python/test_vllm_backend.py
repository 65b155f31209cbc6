"""wsync.vllm's WsyncWeightTransferEngine driven through the calls vLLM makes (vLLM itself cannot
be installed here): create_engine's constructor (config, vllm_config, device, model),
parse_init_info + init_transfer_engine, then per step start_weight_update, update_weights
(parse_update_info + receive_weights), finish_weight_update, and shutdown; against a torch module
with vLLM's parameter names and shapes (qwen2.5 structure, TP2). One trainer (Megatron TP1) pushes
3 versions, one of them through trainer_send_weights."""

import os
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-vllm-secret-0123456789abcdef"
TP = 2


def _process(index, port):
    import torch

    import tiny_qwen as tq
    from wsync import layouts
    from wsync.trainer import TrainerSync
    from wsync.vllm import WsyncWeightTransferEngine

    c = tq.CONFIG
    os.environ["WSYNC_SECRET"] = SECRET
    os.environ["WSYNC_COORDINATOR_PORT"] = str(port)  # The engine's launch configuration.
    if index == 0:
        model = tq.MegatronTiny(0, 1, None)
        config = layouts.ModelConfig(c["heads"], c["kv_heads"], c["head_dim"], c["vocab"])
        with TrainerSync(model, lambda m: layouts.megatron_layout(m, 0, 1, config), 0, 1,
                         f"127.0.0.1:{port}", SECRET, num_rollouts=TP, job_id="python-vllm",
                         deadline_seconds=30, path_transports="*=ucx:sm,cma,self") as sync:
            for version in (1, 2, 3):
                tq.load_local(model, tq.megatron_shard(tq.random_logical(10 + version), 0, 1))
                if version == 2:
                    WsyncWeightTransferEngine.trainer_send_weights(
                        iter(()), {"sync": sync, "version": version})
                else:
                    sync.push(version)
        return None

    rank = index - 1
    model = tq.VllmTiny(rank, TP, None)
    hf_config = {"num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
                 "hidden_size": c["hidden"], "head_dim": c["head_dim"], "vocab_size": c["vocab"]}
    vllm_config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=TP, data_parallel_rank=0),
        model_config=types.SimpleNamespace(hf_config=hf_config))
    engine = WsyncWeightTransferEngine(types.SimpleNamespace(backend="wsync"), vllm_config,
                                       torch.device("cpu"), model)
    addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
    engine.init_transfer_engine(engine.parse_init_info({
        "coordinator": f"127.0.0.1:{port}", "num_trainers": 1, "num_rollouts": TP,
        "job_id": "python-vllm", "tp_rank": rank, "deadline_seconds": 30,
        "path_transports": "*=ucx:sm,cma,self"}))
    checks = []
    for version in (1, 2, 3):
        engine.start_weight_update()
        engine.update_weights({"version": version, "names": ["ignored"]})
        engine.finish_weight_update()
        want = tq.vllm_shard(tq.random_logical(10 + version), rank, TP)
        params = dict(model.named_parameters())
        emb = "model.embed_tokens.weight"
        real = c["vocab"] - rank * params[emb].shape[0]  # Rows of the real vocabulary here.
        wrong = [n for n, t in want.items() if not torch.equal(
            params[n][:real] if n == emb else params[n], t[:real] if n == emb else t)]
        checks.append({"version": version, "wrong": wrong, "engine_version": engine.version,
                       "stats_version": engine.stats()["version"],
                       "in_place": all(p.data_ptr() == addresses[n]
                                       for n, p in model.named_parameters())})
    metrics = engine.metrics_text()
    engine.shutdown()
    try:
        engine.start_weight_update()
        after_shutdown = None
    except Exception as error:  # noqa: BLE001
        after_shutdown = type(error).__name__
    try:
        engine.parse_init_info({"coordinator": "x:1"})
        bad_init = None
    except ValueError as error:
        bad_init = str(error)
    return {"checks": checks, "metrics_is_text": isinstance(metrics, str),
            "after_shutdown": after_shutdown, "bad_init": bad_init}


class VllmBackendTest(unittest.TestCase):
    def test_engine_calls(self):
        port, = free_ports(1)
        results = run_processes(_process, 1 + TP, (port,), timeout=120)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        for status, report in results[1:]:
            self.assertEqual(len(report["checks"]), 3)
            for check in report["checks"]:
                self.assertEqual(check["wrong"], [], check)
                self.assertEqual(check["engine_version"], check["version"])
                self.assertEqual(check["stats_version"], check["version"])
                self.assertTrue(check["in_place"])
            self.assertTrue(report["metrics_is_text"])
            self.assertEqual(report["after_shutdown"], "WsyncError")
            self.assertIn("Invalid init_info", report["bad_init"])

    def test_expert_parallel_from_vllm_parallel_config(self):
        import types
        from wsync.vllm import WsyncInitInfo, WsyncWeightTransferEngine
        pc = types.SimpleNamespace(tensor_parallel_size=2, data_parallel_size=2,
                                   enable_expert_parallel=True)
        engine = WsyncWeightTransferEngine(None, types.SimpleNamespace(parallel_config=pc), "cpu",
                                           None)
        info = WsyncInitInfo("127.0.0.1:1", 1, 4)
        self.assertEqual(engine._expert_parallel(info, 2, 3), (4, 3, "linear"))
        pc.expert_placement_strategy = "round_robin"
        self.assertEqual(engine._expert_parallel(info, 2, 1), (4, 1, "round_robin"))
        pc.enable_expert_parallel = False
        self.assertEqual(engine._expert_parallel(info, 2, 3)[:2], (1, 0))
        info.ep_size, info.ep_rank = 2, 1  # The request overrides vLLM's config.
        self.assertEqual(engine._expert_parallel(info, 2, 3)[:2], (2, 1))

    def test_register_without_vllm(self):
        import wsync.vllm
        if not wsync.vllm.HAVE_VLLM:
            self.assertFalse(wsync.vllm.register())


if __name__ == "__main__":
    unittest.main()
