"""wsync inside a stock SGLang server, through SGLang's own call sequence (SGLang cannot be
installed here: `sglang_standin/` holds the modules wsync's hooks import and `sglang_calls.py` the
scheduler / TP worker calls above ModelRunner, each citing its sgl-project/sglang path: 0.5.x
for the custom-loader path, the receiver hook @ fd623da; wsync pins SGLang >=0.5.4,<0.6.0).

Each job: 2 Megatron-TP2 trainer ranks (TrainerSync.push, the trainer side of any RL framework)
and one SGLang engine of TP 2 (2 worker processes), in SGLang's numbering: the trainers are ranks
0-1 of the update group, so the engine's rank_offset is 2 and world_size 4.

- Custom loader (`--custom-weight-loader wsync.sglang.load_weights`): each round is SGLang's
  Engine.update_weights_from_tensor of wsync.sglang.update_request(version, init) through the
  scheduler, TpModelWorker and ModelRunner; the first round connects (SGLang's fields from the
  request, wsync's from $WSYNC_SGLANG_INIT). Versions 1 and 2 commit:
  SGLang reports success, records weight_version, and every element of every rollout tensor
  equals the worker's shard of the trainer's logical tensor (tiny_qwen's own oracle), parameters
  at their addresses. Version 3 fails (trainer rank 1 leaves the job): the trainers' push raises,
  and the loader raises out of SGLang's scheduler (the path has no failure result: fail-stop),
  the worker's weights marked dirty, no success and no weight_version 3 recorded.
- Receiver hook (`--weight-update-receivers wsync.sglang.create_receiver`), under DP attention
  (dp 2: attention TP 1, the MLP TP 2, the embedding whole): init_weights_update_group(receiver=)
  connects; update_weights_from_distributed(receiver_payload={"version": v}) per round, checked as
  above against the attention-TP / TP / whole shards; version 3's failure is SGLang's failure
  result (success False, the error's text), weights dirty.
- In-process: an SGLang outside the range refused on both paths (naming the version found and
  the range), an SGLang without the receiver hook refused, a request that is not wsync's refused
  before anything is connected, SGLang's rank_offset / world_size checked.
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "sglang_standin")
sys.path.insert(0, HERE)
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-sglang-engines-secret-0123456789"
TP = 2
TRAINERS = 2
GROUP = "weight_update_group"
DEADLINE = 30.0  # Connect included: 4 spawned torch processes on a loaded machine.
PATHS = "*=ucx:sm,cma,self"
COMMITTED = (1, 2)
FAILED = 3
LOADER = "wsync.sglang.load_weights"
RECEIVER = "wsync.sglang.create_receiver"


def _hf_config():
    import tiny_qwen as tq
    c = tq.CONFIG
    return {"num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
            "hidden_size": c["hidden"], "head_dim": c["head_dim"], "vocab_size": c["vocab"]}


def _seed(version):
    return 300 + version


def _trainer(rank, port):
    import tiny_qwen as tq
    from wsync import layouts
    from wsync._lib import WsyncError
    from wsync.trainer import TrainerSync

    config = layouts.ModelConfig.from_hf(_hf_config())
    model = tq.MegatronTiny(rank, TP, None)
    with TrainerSync(model, lambda m: layouts.megatron_layout(m, rank, TP, config), rank,
                     TRAINERS, f"127.0.0.1:{port}", SECRET, num_rollouts=TP, job_id=GROUP,
                     deadline_seconds=DEADLINE, path_transports=PATHS) as sync:
        for version in COMMITTED:
            tq.load_local(model, tq.megatron_shard(tq.random_logical(_seed(version)), rank, TP))
            sync.push(version)
        if rank == 1:
            return {"left": True}  # Leaves the job: version FAILED cannot commit anywhere.
        tq.load_local(model, tq.megatron_shard(tq.random_logical(_seed(FAILED)), rank, TP))
        try:
            sync.push(FAILED)
        except WsyncError as error:
            return {"failed": error.code.name}
        return {"failed": None}


def _dp_attention_model(rank):
    """An SGLang DP-attention worker's module tree (tp 2, dp 2): attention TP 1 (whole
    attention), the embedding whole, the MLP a TP-2 shard."""
    import tiny_qwen as tq
    model = tq.VllmTiny(rank, TP, None)
    whole = tq.VllmTiny(0, 1, None)
    for mine, full in zip(model.model.layers, whole.model.layers):
        mine.self_attn = full.self_attn
    model.model.embed_tokens = whole.model.embed_tokens
    model.lm_head = model.model.embed_tokens
    return model


def _expected(logical, rank, dp_attention):
    """{name: (expected tensor, real rows of the embedding or None)} from tiny_qwen's oracle."""
    import tiny_qwen as tq
    vocab = tq.CONFIG["vocab"]
    if not dp_attention:
        want = tq.vllm_shard(logical, rank, TP)
        emb_rank = rank
    else:
        want = tq.vllm_shard(logical, rank, TP)
        whole = tq.vllm_shard(logical, 0, 1)
        want.update({n: t for n, t in whole.items() if ".self_attn." in n or "embed" in n})
        emb_rank = 0
    rows = want["model.embed_tokens.weight"].shape[0]
    return want, max(0, min(rows, vocab - emb_rank * rows))


def _wrong(model, want, real_rows):
    import torch
    params = dict(model.named_parameters())
    emb = "model.embed_tokens.weight"
    return [n for n, t in want.items() if not torch.equal(
        params[n][:real_rows] if n == emb else params[n], t[:real_rows] if n == emb else t)]


def _rollout(index, port, path):
    sys.path.insert(0, STANDIN)
    import sglang_calls as sc
    import tiny_qwen as tq
    from sglang.srt.managers.io_struct import (DestroyWeightsUpdateGroupReqInput,
                                               InitWeightsUpdateGroupReqInput,
                                               UpdateWeightsFromDistributedReqInput)
    from sglang.srt.server_args import ServerArgs
    from wsync import sglang as ws
    from wsync import sglang_hooks

    os.environ["WSYNC_SECRET"] = SECRET
    rank = index - TRAINERS
    dp_attention = path == "receiver"
    model = _dp_attention_model(rank) if dp_attention else tq.VllmTiny(rank, TP, None)
    model.config = _hf_config()  # SGLang's models keep their HF config as .config.
    addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
    if dp_attention:
        args = ServerArgs(tp_size=TP, dp_size=2, enable_dp_attention=True,
                          weight_update_receivers=[RECEIVER])
    else:
        args = ServerArgs(tp_size=TP, custom_weight_loader=[LOADER])
    scheduler = sc.launch_worker(model, rank, args)
    wsync_args = {"num_trainers": TRAINERS, "deadline_seconds": DEADLINE,
                  "path_transports": PATHS}
    out = {"rounds": []}
    if dp_attention:
        done = scheduler.init_weights_update_group(InitWeightsUpdateGroupReqInput(
            master_address="127.0.0.1", master_port=port, rank_offset=TRAINERS,
            world_size=TRAINERS + TP, group_name=GROUP, receiver=RECEIVER,
            receiver_init_payload=wsync_args))
        out["init"] = (done.success, done.message)
        receiver = scheduler.tp_worker.model_runner.weight_updater._external_receivers.get(GROUP)
    for version in COMMITTED + (FAILED,):
        if dp_attention:
            status, result = sc.scheduler_process_step(
                scheduler.update_weights_from_distributed, UpdateWeightsFromDistributedReqInput(
                    group_name=GROUP, weight_version=str(version),
                    receiver_payload={"version": version}))
            dirty = receiver.weights_dirty
        else:
            # SGLang's fields in the request, wsync's from the server's environment.
            os.environ["WSYNC_SGLANG_INIT"] = json.dumps(wsync_args)
            init = dict(master_address="127.0.0.1", master_port=port, rank_offset=TRAINERS,
                        world_size=TRAINERS + TP, group_name=GROUP)
            request = ws.update_request(version, init)
            status, result = sc.scheduler_process_step(
                scheduler.update_weights_from_tensor, sc.engine_tensor_request(
                    TP, request["named_tensors"], request["load_format"],
                    request["flush_cache"], request["weight_version"]))
            dirty = sglang_hooks.worker(model).weights_dirty
        if status == "ok":
            result = (result.success, result.message)
        else:
            result = (type(result).__name__, getattr(result, "code", None) and result.code.name,
                      str(result))
        want, real_rows = _expected(tq.random_logical(_seed(version)), rank, dp_attention)
        out["rounds"].append({"version": version, "status": status, "result": result,
                              "dirty": dirty, "wrong": _wrong(model, want, real_rows),
                              "weight_version": scheduler.weight_version})
    out["moved"] = [n for n, p in model.named_parameters() if p.data_ptr() != addresses[n]]
    if dp_attention:
        done = scheduler.destroy_weights_update_group(
            DestroyWeightsUpdateGroupReqInput(group_name=GROUP))
        out["destroy"] = (done.success, done.message)
    else:
        sglang_hooks.shutdown(model)
    return out


def _process(index, port, path):
    if index < TRAINERS:
        return _trainer(index, port)
    return _rollout(index, port, path)


class SGLangEnginesTest(unittest.TestCase):
    def _run(self, path):
        port, = free_ports(1)
        results = run_processes(_process, TRAINERS + TP, (port, path), timeout=120)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        self.assertEqual(results[1][1], {"left": True})
        self.assertIn(results[0][1]["failed"], ("PEER_LOST", "TIMED_OUT", "ABORTED"))
        return [value for _, value in results[TRAINERS:]]

    def _check_committed(self, out):
        for done in out["rounds"][:len(COMMITTED)]:
            self.assertEqual(done["status"], "ok", done)
            self.assertTrue(done["result"][0], done)
            self.assertFalse(done["dirty"])
            self.assertEqual(done["wrong"], [], done)
            self.assertEqual(done["weight_version"], str(done["version"]))
        self.assertEqual(out["moved"], [])

    def test_custom_weight_loader(self):
        for out in self._run("loader"):
            self._check_committed(out)
            failed = out["rounds"][-1]
            # SGLang drops a loader's result and catches nothing: the failure is fail-stop.
            self.assertEqual(failed["status"], "scheduler exited", failed)
            self.assertEqual(failed["result"][0], "WsyncError", failed)
            self.assertIn(failed["result"][1], ("PEER_LOST", "TIMED_OUT", "ABORTED"))
            self.assertTrue(failed["dirty"])
            self.assertEqual(failed["weight_version"], str(COMMITTED[-1]))

    def test_receiver_hook_under_dp_attention(self):
        for out in self._run("receiver"):
            self._check_committed(out)
            failed = out["rounds"][-1]
            self.assertEqual(failed["status"], "ok", failed)  # SGLang's failure result:
            self.assertFalse(failed["result"][0], failed)
            self.assertTrue(failed["result"][1], failed)
            self.assertTrue(failed["dirty"])
            self.assertEqual(failed["weight_version"], str(COMMITTED[-1]))
            self.assertTrue(out["init"][0], out["init"])
            self.assertTrue(out["destroy"][0], out["destroy"])


class SGLangRefusalsTest(unittest.TestCase):
    """In this process, with the stand-in first on the path; nothing connects."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, STANDIN)
        import sglang
        cls.sglang = sglang
        cls.found = sglang.__version__

    def tearDown(self):
        self.sglang.__version__ = self.found

    def _model(self):
        import tiny_qwen as tq
        model = tq.VllmTiny(0, 1, None)
        model.config = _hf_config()
        return model

    def test_unsupported_versions_are_refused_on_both_paths(self):
        import sglang_calls as sc
        from sglang.srt.managers.io_struct import InitWeightsUpdateGroupReqInput
        from sglang.srt.server_args import ServerArgs
        from wsync import sglang as ws
        from wsync import sglang_hooks
        from wsync._lib import Status, WsyncError
        for version in ("0.5.3", "0.4.10", "0.6.0", "1.0.0", "dev"):
            self.sglang.__version__ = version
            model = self._model()
            scheduler = sc.launch_worker(model, 0, ServerArgs(
                custom_weight_loader=[LOADER], weight_update_receivers=[RECEIVER]))
            request = ws.update_request(1, {"master_address": "127.0.0.1", "master_port": 1,
                                            "rank_offset": 1, "world_size": 2})
            status, error = sc.scheduler_process_step(
                scheduler.update_weights_from_tensor, sc.engine_tensor_request(
                    1, request["named_tensors"], request["load_format"]))
            self.assertEqual(status, "scheduler exited")
            self.assertIsInstance(error, WsyncError)
            self.assertEqual(error.code, Status.UNSUPPORTED)
            self.assertIn(f"found SGLang {version}", str(error))
            self.assertIn(">=0.5.4,<0.6.0", str(error))
            self.assertIsNone(sglang_hooks.worker(model))
            init = scheduler.init_weights_update_group(InitWeightsUpdateGroupReqInput(
                master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2,
                receiver=RECEIVER))
            self.assertFalse(init.success)
            self.assertIn(f"found SGLang {version}", init.message)
        with self.assertRaises(WsyncError):
            ws.check_sglang_version("0.5.3")
        for version in ("0.5.4", "0.5.9", "0.5.10rc1", "0.5.4.post2"):
            self.assertEqual(ws.check_sglang_version(version), version)

    def test_sglang_without_the_receiver_hook_is_refused(self):
        from wsync import sglang_hooks
        from wsync._lib import Status, WsyncError
        name = "sglang.srt.weight_sync.external_receiver"
        saved = sys.modules.get(name)
        sys.modules[name] = None  # What an SGLang release without the hook gives: ImportError.
        try:
            with self.assertRaises(WsyncError) as caught:
                sglang_hooks.check_receiver_hook()
        finally:
            if saved is None:
                del sys.modules[name]
            else:
                sys.modules[name] = saved
        self.assertEqual(caught.exception.code, Status.UNSUPPORTED)
        self.assertIn(f"SGLang {self.found} has no weight-update receiver hook",
                      str(caught.exception))
        self.assertIn(f"--custom-weight-loader {LOADER}", str(caught.exception))

    def test_requests_that_are_not_wsyncs_are_refused_before_connecting(self):
        import torch
        from wsync import sglang as ws
        from wsync import sglang_hooks
        from wsync._lib import Status, WsyncError
        model = self._model()
        good = ws.update_request(4, {"master_port": 1})["named_tensors"]
        bad = [list(model.named_parameters())[:2],
               good + good,
               [("wsync.control", torch.tensor(list(b"not json"), dtype=torch.uint8))],
               [("wsync.control", torch.tensor(list(b'{"init": {}}'), dtype=torch.uint8))]]
        for named in bad:
            with self.assertRaises(WsyncError) as caught:
                ws.load_weights(model, named)
            self.assertEqual(caught.exception.code, Status.INVALID_ARGUMENT, named)
            self.assertIsNone(sglang_hooks.worker(model))
        self.assertEqual(sglang_hooks._control(good), (4, {"master_port": 1}))
        request = ws.update_request(4)
        self.assertEqual((request["load_format"], request["weight_version"]), (LOADER, "4"))

    def test_rank_offset_and_world_size_count_the_trainers(self):
        from wsync.sglang import WsyncSGLangAdapter
        from wsync._lib import WsyncError
        # Engine e of tp 2 after t trainers: rank_offset t + 2e, world_size t + 2 * engines.
        for trainers in (1, 2, 3):
            for engine in range(3):
                for tp_rank in range(2):
                    adapter = WsyncSGLangAdapter(None, tp_rank, 2, None)
                    self.assertEqual(adapter.rollout_rank(trainers + 2 * engine, trainers + 6,
                                                          trainers),
                                     (2 * engine + tp_rank, 6))
        adapter = WsyncSGLangAdapter(None, 1, 2, None)
        for offset, world, trainers in ((3, 4, 1), (0, 2, 2), (2, 4, 0), (4, 5, 2)):
            with self.assertRaises(WsyncError):
                adapter.rollout_rank(offset, world, trainers)


if __name__ == "__main__":
    unittest.main()
