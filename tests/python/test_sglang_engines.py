"""wsync inside a stock SGLang server, through SGLang's own call sequence (SGLang cannot be
installed here: `sglang_standin/` holds the modules wsync's hooks import and `sglang_calls.py` the
scheduler / TP worker / Engine calls, each citing its upstream file and commit; two interface
generations, see sglang_standin/README.md; wsync pins SGLang >=0.5.4,<0.6.0).

Each job: 2 Megatron-TP2 trainer ranks (TrainerSync.push, the trainer side of any RL framework)
and one SGLang engine of TP 2 (2 worker processes) launched with `--custom-weight-loader
wsync.sglang.load_weights`, in SGLang's numbering: the trainers are ranks 0-1 of the update group,
so the engine's rank_offset is 2 and world_size 4. Each round is wsync.sglang.update_weights
(engine, version, init): the request's init carries the update group's fields only, the
coordinator and wsync's settings come from $WSYNC_SGLANG_INIT (the server's launch
configuration). Versions 1 and 2 commit: SGLang reports success, every element of every rollout
tensor equals the worker's shard of the trainer's logical tensor (tiny_qwen's oracle), parameters
at their addresses. Version 3 fails (trainer rank 1 leaves the job).

- Session generation, with a speculative-decoding draft model (`--speculative-algorithm`): each
  round opens and closes SGLang's weight-update session on the target runner (begin, end with
  run_post_load False), the applied weight version is the round's; the draft runner is never
  selected and keeps its weights. Version 3: SGLang's failure result (the loader's WsyncError
  caught by the scheduler), update_weights raises ABORTED, weights dirty, applied version 2; the
  failed session stays open upstream, so the next begin_weight_update asserts and ends the
  scheduler.
- Release generation (no session) under DP attention (dp 2: attention TP 1, the MLP TP 2, the
  embedding whole): the update carries disable_draft_model; version 3's loader raise ends the
  scheduler (fail-stop), weights dirty, no weight_version 3 recorded.
- In-process: an update outside a session ends the scheduler as upstream's assert does; a
  selector reaching the draft model is refused by the draft's class name (and update_weights
  refuses such a selector before any call); request init keys that pick the coordinator, the
  secret's source or rules are refused; an SGLang outside the range is refused; a request that is
  not wsync's is refused before anything connects; SGLang's rank_offset / world_size checked.
"""

import json
import os
import sys
import unittest

import torch

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


class TinyEagleDraft(torch.nn.Module):
    """A speculative-decoding draft model's stand-in (SGLang's EAGLE heads are their own
    classes): one layer, never synced by wsync."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)


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


def _server_init(port):
    """$WSYNC_SGLANG_INIT: the server's launch configuration (coordinator, wsync's settings)."""
    return json.dumps({"master_address": "127.0.0.1", "master_port": port,
                       "num_trainers": TRAINERS, "deadline_seconds": DEADLINE,
                       "path_transports": PATHS})


def _rollout(index, port, generation):
    os.environ["SGLANG_STANDIN_GENERATION"] = generation
    os.environ["WSYNC_SECRET"] = SECRET
    os.environ["WSYNC_SGLANG_INIT"] = _server_init(port)
    sys.path.insert(0, STANDIN)
    import sglang_calls as sc
    import tiny_qwen as tq
    from sglang.srt.server_args import ServerArgs
    from wsync import sglang as ws
    from wsync import sglang_hooks
    from wsync._lib import WsyncError

    rank = index - TRAINERS
    dp_attention = generation == "release"
    model = _dp_attention_model(rank) if dp_attention else tq.VllmTiny(rank, TP, None)
    model.config = _hf_config()  # SGLang's models keep their HF config as .config.
    addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
    draft = TinyEagleDraft()
    draft_before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    if dp_attention:
        args = ServerArgs(tp_size=TP, dp_size=2, enable_dp_attention=True,
                          custom_weight_loader=[LOADER])
    else:
        args = ServerArgs(tp_size=TP, custom_weight_loader=[LOADER], speculative_algorithm="EAGLE")
    scheduler = sc.launch_worker(model, rank, args, draft_model=draft)
    engine = sc.Engine([scheduler], TP)
    init = dict(rank_offset=TRAINERS, world_size=TRAINERS + TP, group_name=GROUP)
    out = {"rounds": []}
    for version in COMMITTED + (FAILED,):
        try:
            ws.update_weights(engine, version, init)
            result = ("ok",)
        except WsyncError as error:
            result = ("WsyncError", error.code.name, str(error))
        except sc.SchedulerExited as error:
            cause = error.cause
            result = ("scheduler exited", type(cause).__name__,
                      getattr(cause, "code", None) and cause.code.name)
        want, real_rows = _expected(tq.random_logical(_seed(version)), rank, dp_attention)
        out["rounds"].append({
            "version": version, "result": result,
            "dirty": sglang_hooks.worker(model).weights_dirty,
            "wrong": _wrong(model, want, real_rows),
            "weight_version": scheduler.weight_version,
            "applied": scheduler.applied_weight_version,
            "session_calls": list(scheduler.tp_worker.model_runner.session_calls)})
    out["moved"] = [n for n, p in model.named_parameters() if p.data_ptr() != addresses[n]]
    out["draft_calls"] = scheduler.draft_worker.model_runner.session_calls \
        if scheduler.draft_worker else None
    out["draft_changed"] = [n for n, p in draft.named_parameters()
                            if not torch.equal(p, draft_before[n])]
    if generation == "session":  # The failed session stayed open: the next begin asserts.
        try:
            engine.begin_weight_update(selector="target", weight_version="4")
            out["next_begin"] = "ok"
        except sc.SchedulerExited as error:
            out["next_begin"] = (type(error.cause).__name__, str(error.cause))
    sglang_hooks.shutdown(model)
    return out


def _process(index, port, generation):
    if index < TRAINERS:
        return _trainer(index, port)
    return _rollout(index, port, generation)


class SGLangEnginesTest(unittest.TestCase):
    def _run(self, generation):
        port, = free_ports(1)
        results = run_processes(_process, TRAINERS + TP, (port, generation), timeout=120)
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
        self.assertEqual(results[1][1], {"left": True})
        self.assertIn(results[0][1]["failed"], ("PEER_LOST", "TIMED_OUT", "ABORTED"))
        return [value for _, value in results[TRAINERS:]]

    def _check_committed(self, out):
        for done in out["rounds"][:len(COMMITTED)]:
            self.assertEqual(done["result"], ("ok",), done)
            self.assertFalse(done["dirty"])
            self.assertEqual(done["wrong"], [], done)
            self.assertEqual(done["weight_version"], str(done["version"]))
        self.assertEqual(out["moved"], [])
        self.assertEqual(out["draft_changed"], [])

    def test_session_generation_with_a_draft_model(self):
        for out in self._run("session"):
            self._check_committed(out)
            for number, done in enumerate(out["rounds"][:len(COMMITTED)], 1):
                self.assertEqual(done["applied"], done["version"])
                self.assertEqual(done["session_calls"], ["begin", ("end", False)] * number)
            self.assertEqual(out["draft_calls"], [])  # Never selected.
            failed = out["rounds"][-1]
            self.assertEqual(failed["result"][:2], ("WsyncError", "ABORTED"), failed)
            self.assertIn("update_weights_from_tensor", failed["result"][2])
            self.assertTrue(failed["dirty"])
            self.assertEqual(failed["applied"], COMMITTED[-1])
            self.assertEqual(failed["weight_version"], str(COMMITTED[-1]))
            self.assertEqual(failed["session_calls"][-1], "begin")  # Not closed upstream.
            self.assertEqual(out["next_begin"][0], "AssertionError", out["next_begin"])
            self.assertIn("already open", out["next_begin"][1])

    def test_release_generation_under_dp_attention(self):
        for out in self._run("release"):
            self._check_committed(out)
            for done in out["rounds"]:
                self.assertEqual(done["session_calls"], [])
            failed = out["rounds"][-1]
            # Release SGLang drops a loader's result and catches nothing: fail-stop.
            self.assertEqual(failed["result"][:2], ("scheduler exited", "WsyncError"), failed)
            self.assertIn(failed["result"][2], ("PEER_LOST", "TIMED_OUT", "ABORTED"))
            self.assertTrue(failed["dirty"])
            self.assertEqual(failed["weight_version"], str(COMMITTED[-1]))
            self.assertIsNone(out["draft_calls"])


class _StubAdapter:
    """Stands for a connected worker in the in-process tests (records the synced versions)."""

    def __init__(self):
        self.versions, self.weights_dirty, self.session = [], False, None

    def sync(self, version):
        self.versions.append(version)


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

    def _launch(self, speculative=False):
        import sglang_calls as sc
        from sglang.srt.server_args import ServerArgs
        model, draft = self._model(), TinyEagleDraft()
        scheduler = sc.launch_worker(model, 0, ServerArgs(
            custom_weight_loader=[LOADER], speculative_algorithm="EAGLE" if speculative else None),
            draft_model=draft)
        return model, draft, scheduler, sc.Engine([scheduler], 1)

    def test_an_update_outside_a_session_ends_the_scheduler(self):
        import sglang_calls as sc
        from wsync import sglang as ws
        from wsync import sglang_hooks
        model, _, scheduler, engine = self._launch()
        self.assertEqual(scheduler.weight_version, "default")  # SGLang's before any update.
        request = ws.update_request(1, {"rank_offset": 1, "world_size": 2})
        with self.assertRaises(sc.SchedulerExited) as caught:
            engine.update_weights_from_tensor(selector="target", **request)
        self.assertIsInstance(caught.exception.cause, AssertionError)
        self.assertIn("requires an open begin_weight_update session", str(caught.exception))
        self.assertIsNone(sglang_hooks.worker(model))  # The loader was never reached.
        with self.assertRaises(sc.SchedulerExited):  # The scheduler is gone.
            engine.begin_weight_update(selector="target", weight_version="1")
        self.assertEqual(scheduler.weight_version, "default")

    def test_the_draft_model_is_refused_by_name(self):
        from wsync import sglang as ws
        from wsync import sglang_hooks
        from wsync._lib import Status, WsyncError
        model, draft, scheduler, engine = self._launch(speculative=True)
        for selector in ("all", "draft"):
            with self.assertRaises(WsyncError) as caught:
                ws.update_weights(engine, 1, selector=selector)
            self.assertEqual(caught.exception.code, Status.UNSUPPORTED)
            self.assertIn("target model only", str(caught.exception))
        self.assertEqual(scheduler.tp_worker.model_runner.session_calls, [])  # Nothing sent.
        # A client sending SGLang's default selector "all": the target's worker syncs, the
        # draft runner's loader call is refused naming the draft's class.
        stub = _StubAdapter()
        sglang_hooks._WORKERS[id(model)] = stub
        try:
            self.assertTrue(engine.begin_weight_update(selector="all", weight_version="1")[0])
            success, message = engine.update_weights_from_tensor(
                selector="all", **ws.update_request(1, {"rank_offset": 1}))
            ended = engine.end_weight_update()
        finally:
            del sglang_hooks._WORKERS[id(model)]
        self.assertEqual(stub.versions, [1])
        self.assertFalse(success)
        self.assertIn("TinyEagleDraft: a second model in this SGLang scheduler", message)
        self.assertFalse(ended[0])  # SGLang reports the failed session.
        self.assertIsNone(sglang_hooks.worker(draft))
        self.assertEqual(scheduler.draft_worker.model_runner.session_calls, ["begin"])

    def test_request_init_cannot_pick_the_coordinator_the_secret_or_rules(self):
        from wsync import sglang as ws
        from wsync import sglang_hooks
        from wsync._lib import Status, WsyncError
        model = self._model()
        for key, value in (("master_address", "evil.example"), ("master_port", 1),
                           ("secret_env", "HOME"), ("secret_file", "/etc/passwd"),
                           ("extra_rules", [["(a+)+$", "replicated"]]), ("rules", []),
                           ("hf_config", {}), ("path_transports", "*=tcp")):
            named = ws.update_request(1, {"rank_offset": 1, key: value})["named_tensors"]
            with self.assertRaises(WsyncError) as caught:
                ws.load_weights(model, named)
            self.assertEqual(caught.exception.code, Status.INVALID_ARGUMENT)
            self.assertIn(f"may not set ['{key}']", str(caught.exception))
            self.assertIn("WSYNC_SGLANG_INIT", str(caught.exception))
            self.assertIsNone(sglang_hooks.worker(model))
        allowed = {key: 1 for key in sglang_hooks.REQUEST_INIT_KEYS}
        self.assertEqual(sglang_hooks._control(ws.update_request(2, allowed)["named_tensors"]),
                         (2, allowed))

    def test_unsupported_versions_are_refused(self):
        from wsync import sglang as ws
        from wsync import sglang_hooks
        from wsync._lib import Status, WsyncError
        for version in ("0.5.3", "0.4.10", "0.6.0", "1.0.0", "dev"):
            self.sglang.__version__ = version
            model, _, _, engine = self._launch()
            with self.assertRaises(WsyncError) as caught:
                ws.update_weights(engine, 1, {"rank_offset": 1, "world_size": 2})
            self.assertEqual(caught.exception.code, Status.ABORTED)
            self.assertIn(f"found SGLang {version}", str(caught.exception))
            self.assertIn(">=0.5.4,<0.6.0", str(caught.exception))
            self.assertIsNone(sglang_hooks.worker(model))
        with self.assertRaises(WsyncError):
            ws.check_sglang_version("0.5.3")
        for version in ("0.5.4", "0.5.9", "0.5.10rc1", "0.5.4.post2", "0.5.23"):
            self.assertEqual(ws.check_sglang_version(version), version)

    def test_requests_that_are_not_wsyncs_are_refused_before_connecting(self):
        import torch
        from wsync import sglang as ws
        from wsync import sglang_hooks
        from wsync._lib import Status, WsyncError
        model = self._model()
        good = ws.update_request(4, {"rank_offset": 1})["named_tensors"]
        bad = [list(model.named_parameters())[:2],
               good + good,
               [("wsync.control", torch.tensor(list(b"not json"), dtype=torch.uint8))],
               [("wsync.control", torch.tensor(list(b'{"init": {}}'), dtype=torch.uint8))]]
        for named in bad:
            with self.assertRaises(WsyncError) as caught:
                ws.load_weights(model, named)
            self.assertEqual(caught.exception.code, Status.INVALID_ARGUMENT, named)
            self.assertIsNone(sglang_hooks.worker(model))
        self.assertEqual(sglang_hooks._control(good), (4, {"rank_offset": 1}))
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
