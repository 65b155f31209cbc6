"""Loader staging streamed layer by layer (wsync.vllm_loader, loader_stream "layer" / "auto").

vLLM's layerwise reload keeps its state per layer (``LAYERWISE_INFO``: loads are buffered per
layer and a layer is processed once its elements are in, whichever ``load_weights`` call brought
them), so several ``load_weights`` calls share one ``initialize_layerwise_reload`` /
``finalize_layerwise_reload`` bracket: vllm/model_executor/model_loader/reload/layerwise.py
@ 01424e4b (``online_process_loader``, ``finalize_layerwise_processing``), and vLLM's NCCL engine
calls ``load_weights`` once per received batch inside the worker's one bracket
(vllm/distributed/weight_transfer/nccl_engine.py @ 04b06efe, ``receive_weights``). The stand-in
(tests/python/vllm_standin/.../reload/layerwise.py) does the same: per-layer state, processing
on the load that completes a layer, attention layers at finalize.

The model: tiny_mla with three decoder layers and a quantized lm_head (loader parameters in
waves 1, 2, 3 and 4095), TP 2. A budget between the largest wave and the whole staging makes
"auto" stream.

Two jobs of 2 trainer ranks and 2 vLLM workers (vLLM's worker calls and HTTP routes). Job
"waves":
- versions 1, 2, 4 commit: on every worker every element of every parameter and derived matrix
  equals the oracle of that version, each sync opened one reload bracket and closed it, handed
  4 loader waves, and the pool is smaller than whole staging;
- version 3: worker 1's load of wave 2 raises: the sync fails on every process (trainers too),
  worker 1's error carries the exception as `wave_error`, both workers are dirty with the bracket
  closed, and worker 1 holds layer 0 at version 3 and the rest at version 2 (mixed: dirty);
- version 5: worker 0 aborts from inside wave 2 (abort_weight_update): dirty, bracket closed,
  layers 0 and 1 at version 5 and the rest at version 4; its session is replaced;
- version 6 commits: worker 0's replacement rejoined before trainer rank 0's send of version 5
  returned (it answers the update once rejoined), and the trainer ranks step together (a gloo
  barrier after each send, as their training step's collectives hold them), so no rank starts
  version 6 while worker 0 is still being replaced (that sync would fail at once: a process
  entering a sync while a rank is lost fails it).
Job "trainer": version 1 commits; in version 2 trainer 1 aborts its session while the workers
are inside wave 2: the sync fails everywhere; both workers dirty, bracket closed.
"""

import os
import sys
import threading
import time
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_standin")
sys.path.insert(0, HERE)
from harness import free_ports, role_reports, run_processes  # noqa: E402

SECRET = "python-vllm-loader-stream-secret-0123456789"
TP = 2
LAYERS = 3
# Versions are consecutive from 1 (the trainer engine numbers its sends).
VERSIONS = {"waves": (1, 2, 3, 4, 5, 6), "trainer": (1, 2)}
COMMITTED = {"waves": (1, 2, 4), "trainer": (1,)}
AFTER_ABORT = 6      # Job "waves": the sync after SELF_ABORT (expected to commit).
WAVE_RAISES = 3      # Job "waves": worker 1's load of wave 2 raises.
SELF_ABORT = 5       # Job "waves": worker 0 aborts from inside wave 2.
TRAINER_ABORT = 2    # Job "trainer": trainer 1 aborts while the workers are inside wave 2.
SLOW_WAVE_SECONDS = 2.0
TRAINER_ABORT_AFTER = 1.0
BUDGET = 1000        # Between the largest wave (704 bytes) and whole staging (2096).
DEADLINE = 10.0


def _seed(version):
    return 500 + version


def _logical(version):
    import tiny_mla as tm
    return tm.random_logical(_seed(version), LAYERS, True)


def _trainer(job, gloo_port, rank, coordinator, urls):
    import torch.distributed as dist

    import tiny_mla as tm
    import vllm_calls
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from wsync.vllm_trainer import WsyncTrainerInitInfo

    names = sorted(tm.logical_shapes(LAYERS, True))[rank::TP]
    model = tm.trainer_module(_logical(0), names)
    client = vllm_calls.trainer_client(rank, urls)
    info = WsyncTrainerInitInfo(coordinator=coordinator, num_trainers=TP, num_rollouts=TP,
                                job_id="python-vllm-loader-stream", layout="hf",
                                hf_config=tm.HF_CONFIG, deadline_seconds=DEADLINE,
                                path_transports="*=ucx:sm,cma,self", rank=rank,
                                loader_staging_budget_bytes=BUDGET)
    engine = WeightTransferTrainerFactory.trainer_init(info, client=client,
                                                       source=ModuleSource(model))
    push = engine.sync.push

    def push_or_abort(version):
        if (job, version) == ("trainer", TRAINER_ABORT) and rank == 1:
            session = engine.sync.session
            threading.Timer(TRAINER_ABORT_AFTER,
                            lambda: session.abort("trainer 1 fails mid-sync")).start()
        return push(version)

    engine.sync.push = push_or_abort
    # The trainer ranks step together, as their training step's collectives make them.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank,
                            world_size=TP)
    rounds = vllm_calls.send_rounds(engine, VERSIONS[job],
                                    lambda v: tm.load_trainer(model, _logical(v)), dist.barrier)
    dist.destroy_process_group()
    if rank == 0:
        client.shutdown_servers()
    try:
        engine.shutdown()
    except Exception:  # noqa: BLE001 - rank 1's session was aborted.
        pass
    return {"rounds": rounds}


def _versions_of(model, rank, version, previous):
    """{name: "new" | "old" | "neither"}: each parameter and derived matrix against the oracles
    of `version` and `previous`."""
    import torch

    import tiny_mla as tm
    new, old = tm.expected(_logical(version), rank, TP), tm.expected(_logical(previous), rank, TP)
    have = tm.live(model)
    return {n: "new" if torch.equal(have[n], new[n]) else
            "old" if torch.equal(have[n], old[n]) else "neither" for n in new}


def _bracket_closed(model, kernel):
    """Every live tensor of `kernel` ({name: parameter} before the sync) back in place."""
    live = dict(model.named_parameters())
    return live.keys() == kernel.keys() and \
        all(live[n] is p and not p.is_meta for n, p in kernel.items())


def _rollout(job, rank, port):
    import torch

    import tiny_mla as tm
    import vllm_calls
    from vllm.model_executor.model_loader import reload

    model = tm.TinyMLA(rank, TP, _logical(1), LAYERS, True)
    kernel = dict(model.named_parameters())
    counts = {"initialize": 0, "finalize": 0}
    for call in ("initialize", "finalize"):
        original = getattr(reload, f"{call}_layerwise_reload")

        def counted(*args, _original=original, _call=call, **kwargs):
            counts[_call] += 1
            return _original(*args, **kwargs)
        setattr(reload, f"{call}_layerwise_reload", counted)
    vllm_config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=TP, rank=rank, world_size=TP,
                                              data_parallel_index=0),
        model_config=types.SimpleNamespace(hf_config=tm.HF_CONFIG, dtype=tm.DTYPE))
    events = []
    state = {}
    load_weights = model.load_weights
    layer1 = tm.prefix(1)

    def sabotaged_load(weights):
        """Loads as the model does, except in the versions that fail inside wave 2."""
        weights = list(weights)
        in_wave_2 = any(n.startswith(layer1) for n, _ in weights)
        version = state["version"]
        if in_wave_2 and (job, version) == ("waves", WAVE_RAISES) and rank == 1:
            raise RuntimeError("sabotaged load of wave 2")
        result = load_weights(weights)
        if in_wave_2 and (job, version) == ("waves", SELF_ABORT) and rank == 0:
            state["engine"].abort_weight_update()
        if in_wave_2 and (job, version) == ("trainer", TRAINER_ABORT):
            time.sleep(SLOW_WAVE_SECONDS)
        return result

    model.load_weights = sabotaged_load

    class CheckedWorker(vllm_calls.Worker):
        def update_weights(self, update_info):
            engine = self.weight_transfer_engine
            state.update(version=update_info["version"], engine=engine, counts=dict(counts))
            try:
                super().update_weights(update_info)
            except Exception as error:
                refused = vllm_calls.finish_refusal(engine)
                version = state["version"]
                previous = max(v for v in COMMITTED[job] if v < version)
                wave_error = getattr(error, "wave_error", None)
                events.append({"version": version, "error": f"{type(error).__name__}: {error}",
                               "wave_error": repr(wave_error) if wave_error else None,
                               "dirty": engine.weights_dirty, "finish_refused": refused,
                               "brackets": {k: counts[k] - state["counts"][k] for k in counts},
                               "closed": _bracket_closed(model, kernel),
                               "versions": _versions_of(model, rank, version, previous)})
                raise

        def finish_weight_update(self):
            super().finish_weight_update()
            engine = self.weight_transfer_engine
            version = engine.version
            want = tm.expected(_logical(version), rank, TP)
            have = tm.live(model)
            events.append({"version": version, "dirty": engine.weights_dirty,
                           "wrong": sorted(n for n, t in want.items()
                                           if not torch.equal(have[n], t)),
                           "checked": sum(t.numel() for t in want.values()),
                           "brackets": {k: counts[k] - state["counts"][k] for k in counts},
                           "stats": engine.stats(),
                           "report": {n: r for n, (_, r) in engine.landing_report().items()}})

    worker = CheckedWorker(vllm_calls.WeightTransferConfig(backend="wsync"), vllm_config,
                           torch.device("cpu"), model)
    vllm_calls.serve_until_shutdown(worker, port, 120)
    return {"events": events}


def _process(index, ports, job):
    import functools

    import vllm_calls
    *job_ports, gloo_port = ports
    return vllm_calls.job_process(index, job_ports, TP, SECRET, STANDIN,
                                  functools.partial(_trainer, job, gloo_port),
                                  functools.partial(_rollout, job))


class _Job(unittest.TestCase):
    job = None

    @classmethod
    def setUpClass(cls):
        cls.results = run_processes(_process, 2 * TP, (free_ports(2 + TP), cls.job), timeout=120)

    def _reports(self, role):
        return role_reports(self, self.results, TP, role)

    def _failed(self, rank, version):
        """Worker `rank`'s failure of `version`, checked dirty (finish refused) with the reload
        bracket closed: every live tensor back, every opening finalized."""
        events = [e for e in self._reports("rollout")[rank]["events"]
                  if "error" in e and e["version"] == version]
        self.assertEqual(len(events), 1, self._reports("rollout")[rank]["events"])
        event = events[0]
        self.assertTrue(event["dirty"], event)
        self.assertIn("do not serve", event["finish_refused"] or "")
        self.assertTrue(event["closed"], event)
        self.assertEqual(event["brackets"]["initialize"], event["brackets"]["finalize"], event)
        return event


class VllmLoaderStreamSyncTest(_Job):
    job = "waves"

    def test_streamed_versions_commit_fresh_in_a_pool_smaller_than_whole_staging(self):
        import tiny_mla as tm
        for rank, report in enumerate(self._reports("rollout")):
            done = [e for e in report["events"] if "wrong" in e]
            self.assertEqual([e["version"] for e in done if e["version"] != AFTER_ABORT],
                             list(COMMITTED[self.job]))
            for event in done:
                self.assertEqual(event["wrong"], [], f"rollout {rank}: {event}")
                self.assertGreater(event["checked"], 0)
                self.assertFalse(event["dirty"], event)
                self.assertEqual(event["brackets"], {"initialize": 1, "finalize": 1}, event)
                stats = event["stats"]
                self.assertEqual((stats["loader_stream"], stats["loader_waves"],
                                  stats["loader_waves_loaded"]), ("layer", 4, 4), stats)
                self.assertEqual(stats["loader_staging_bytes"], 704)
                self.assertEqual(stats["loader_whole_staging_bytes"], 2096)
                self.assertLessEqual(stats["loader_staging_bytes"], BUDGET)
                self.assertTrue(event["report"][tm.HEAD].endswith(
                    "; wave 4095 (outside the decoder layers)"), event["report"])
                self.assertTrue(event["report"][tm.layer_names(2)[1]].endswith(
                    "; wave 3 (model.layers.2)"), event["report"])

    def test_a_wave_that_raises_fails_the_sync_everywhere_and_leaves_mixed_layers_dirty(self):
        import tiny_mla as tm
        self._failed(0, WAVE_RAISES)
        event = self._failed(1, WAVE_RAISES)
        self.assertIn("sabotaged load of wave 2", event["wave_error"] or "", event)
        self.assertEqual(event["brackets"], {"initialize": 1, "finalize": 1}, event)
        versions = event["versions"]
        new = sorted(n for n, v in versions.items() if v == "new")
        layer0 = list(tm.layer_names(0)[1:3]) + tm.derived_names(1)
        direct = [n for i in range(LAYERS) for n in tm.layer_names(i) if n not in
                  tm.loader_names(LAYERS, True)]
        self.assertEqual(new, sorted(layer0 + direct), versions)  # Layer 0 only: two versions.
        self.assertNotIn("neither", versions.values())
        for rank, report in enumerate(self._reports("trainer")):
            errors = dict(report["rounds"])
            self.assertIsNotNone(errors[WAVE_RAISES], f"trainer {rank}")

    def test_an_abort_inside_a_wave_leaves_the_weights_dirty_and_the_bracket_closed(self):
        import tiny_mla as tm
        event = self._failed(0, SELF_ABORT)
        self.assertEqual(event["brackets"], {"initialize": 1, "finalize": 1}, event)
        loaded = [n for i in (0, 1) for n in tm.layer_names(i)[1:3]] + tm.derived_names(2)
        self.assertEqual(sorted(n for n in loaded if event["versions"][n] != "new"), [], event)
        later = [tm.layer_names(2)[1], tm.layer_names(2)[2], tm.HEAD]
        self.assertEqual([event["versions"][n] for n in later], ["old"] * 3, event)
        self._failed(1, SELF_ABORT)

    def test_the_sync_after_an_abort_inside_a_wave_commits(self):
        for rank, report in enumerate(self._reports("rollout")):
            done = [e for e in report["events"] if e["version"] == AFTER_ABORT and "wrong" in e]
            self.assertEqual(len(done), 1, f"rollout {rank}: {report['events']}")
            self.assertEqual(done[0]["wrong"], [], done[0])


class VllmLoaderStreamTrainerLossTest(_Job):
    job = "trainer"

    def test_a_trainer_failing_mid_sync_leaves_every_worker_dirty_with_the_bracket_closed(self):
        for rank, report in enumerate(self._reports("rollout")):
            done = [e for e in report["events"] if "wrong" in e]
            self.assertEqual([(e["version"], e["wrong"]) for e in done], [(1, [])], report)
            self._failed(rank, TRAINER_ABORT)  # Opened in wave 1 unless the abort came first.
        for rank, report in enumerate(self._reports("trainer")):
            errors = dict(report["rounds"])
            self.assertEqual([v for v in VERSIONS[self.job] if errors[v] is None],
                             list(COMMITTED[self.job]), f"trainer {rank}: {report['rounds']}")


class VllmLoaderStreamLayoutTest(unittest.TestCase):
    """In one process, no sync: the waves, the pool, the budget, and the wave loader itself (a
    wave's staging filled by hand stands in for what the sync writes before its callback)."""

    @classmethod
    def setUpClass(cls):
        if STANDIN not in sys.path:
            sys.path.insert(0, STANDIN)

    def _landing(self, rank=0, **kwargs):
        import tiny_mla as tm
        from wsync import layouts, vllm_loader
        model = tm.TinyMLA(rank, TP, _logical(1), LAYERS, True)
        config = layouts.ModelConfig.from_hf(tm.HF_CONFIG)
        return model, vllm_loader.vllm_landing(model, rank, TP, config, **kwargs)

    def test_waves_by_decoder_layer_and_one_pool_for_the_largest(self):
        import tiny_mla as tm
        from wsync import layouts
        _, landing = self._landing(staging_budget_bytes=BUDGET)
        self.assertEqual(landing.stream, "layer")
        self.assertEqual(landing.wave_labels, {1: "model.layers.0", 2: "model.layers.1",
                                               3: "model.layers.2",
                                               4095: "outside the decoder layers"})
        self.assertEqual(landing.layout.waves, {n: w for w, i in ((1, 0), (2, 1), (3, 2))
                                                for n in tm.layer_names(i)[1:3]} |
                         {tm.HEAD: 4095})
        self.assertEqual((landing.staging_bytes, landing.whole_staging_bytes), (704, 2096))
        pool = landing.pool
        self.assertEqual(list(pool), [landing.staging[tm.HEAD].device])
        base = next(iter(pool.values())).data_ptr()
        spans = {}
        for name, staging in landing.staging.items():
            self.assertEqual(layouts._storage(staging)[0], base, name)  # Views of the pool.
            begin = staging.data_ptr() - base
            spans.setdefault(landing.waves[name], []).append(
                (begin, begin + staging.numel() * staging.element_size()))
        for wave, ranges in spans.items():  # Within a wave no overlap; every wave from 0.
            ranges.sort()
            self.assertEqual(ranges[0][0], 0)
            self.assertTrue(all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), ranges)
        self.assertEqual(landing.layout.buffers()[0][-1][2], 704)  # One buffer: the pool.

    def test_auto_and_whole_keep_whole_staging_and_layer_refuses_below_one_layer(self):
        from wsync import Status, WsyncError
        for kwargs in ({}, {"staging_budget_bytes": 2096},
                       {"stream": "whole", "staging_budget_bytes": 2096}):
            _, landing = self._landing(**kwargs)
            self.assertEqual((landing.stream, landing.staging_bytes, landing.pool),
                             ("whole", 2096, {}), kwargs)
            self.assertEqual(landing.layout.waves, {})
        self._landing(stream="layer", staging_budget_bytes=704)
        with self.assertRaises(WsyncError) as caught:
            self._landing(stream="layer", staging_budget_bytes=703)
        self.assertEqual(caught.exception.code, Status.NO_MEMORY)
        for part in ("model.layers.0 (wave 1)", "704 bytes", "budget_bytes 703"):
            self.assertIn(part, str(caught.exception))
        with self.assertRaises(WsyncError) as caught:
            self._landing(stream="whole", staging_budget_bytes=2095)
        self.assertEqual(caught.exception.code, Status.NO_MEMORY)
        self.assertIn("2096", str(caught.exception))
        with self.assertRaisesRegex(WsyncError, "loader stream 'sideways'"):
            self._landing(stream="sideways")

    def test_parameters_of_layers_processed_at_finalize_get_staging_outside_the_pool(self):
        import torch

        import tiny_mla as tm
        from wsync import layouts, vllm_loader
        model = tm.TinyMLA(0, TP, _logical(1), LAYERS, True)
        attn = model.model.layers[1].self_attn.attn  # An MLAAttention: processed at finalize.
        attn.k_scale = torch.nn.Parameter(torch.ones(()), requires_grad=False)
        attn.quant_method = tm.KvScaleMethod()  # Else refused: vLLM would drop its reload.
        rules = [layouts.Rule(r"(.*\.attn\.k_scale)", "replicated", r"\1")]
        landing = vllm_loader.vllm_landing(model, 0, TP,
                                           layouts.ModelConfig.from_hf(tm.HF_CONFIG),
                                           rules=rules, stream="layer")
        scale = tm.prefix(1) + "self_attn.attn.k_scale"
        self.assertEqual((landing.held, landing.waves[scale]), ([scale], 2))
        pool = layouts._storage(next(iter(landing.pool.values())))[0]
        self.assertNotEqual(layouts._storage(landing.staging[scale])[0], pool)
        self.assertEqual(landing.staging_bytes, 704 + 4)
        self.assertNotIn(tm.prefix(1) + "self_attn.attn", landing.wave_layers[2])

    def test_register_declares_the_loader_waves_after_their_parameters(self):
        import tiny_mla as tm

        class Recorder:
            def __init__(self):
                self.calls = []

            def __getattr__(self, name):
                return lambda *args, **kwargs: self.calls.append((name,) + args[:2])

        _, landing = self._landing(stream="layer")
        session = Recorder()
        landing.layout.register(session)
        waves = {c[1]: c[2] for c in session.calls if c[0] == "set_parameter_wave"}
        self.assertEqual(waves, landing.layout.waves)
        self.assertEqual(sorted(waves), sorted(tm.loader_names(LAYERS, True)))
        for name, wave in waves.items():
            declared = [i for i, c in enumerate(session.calls)
                        if c[:2] == ("declare_parameter", name)]
            self.assertEqual(len(declared), 1, name)
            self.assertLess(declared[0], session.calls.index(("set_parameter_wave", name, wave)))

    def _fill_wave(self, landing, logical, wave):
        for name, staging in landing.staging.items():
            if landing.waves[name] != wave:
                continue
            for origin, extent in landing.boxes[name]:
                box = tuple(slice(o, o + e) for o, e in zip(origin, extent))
                staging[box] = logical[name][box]

    def test_waves_handed_one_by_one_make_every_layer_fresh_in_one_bracket(self):
        import torch

        import tiny_mla as tm
        from vllm.model_executor.model_loader import reload
        from wsync import vllm_loader
        opened = []
        original = reload.initialize_layerwise_reload
        reload.initialize_layerwise_reload = lambda m: (opened.append(m), original(m))
        try:
            for rank in range(TP):
                model, landing = self._landing(rank, stream="layer")
                logical = _logical(9)
                waves = vllm_loader.WaveLoader(landing, model, types.SimpleNamespace(
                    dtype=tm.DTYPE))
                for wave in (0, 1, 2, 3, 4095):
                    self._fill_wave(landing, logical, wave)
                    waves.load(9, wave)
                self.assertEqual(waves.loaded, [1, 2, 3, 4095])
                waves.close()
                want, have = tm.expected(logical, rank, TP), tm.live(model)
                stale = sorted(n for n, t in want.items() if not torch.equal(have[n], t))
                direct = [n for i in range(LAYERS) for n in tm.layer_names(i)
                          if n not in tm.loader_names(LAYERS, True)]
                self.assertEqual(stale, sorted(direct))  # wsync's job in a sync, not the loader's.
                self.assertFalse(any(p.is_meta for p in model.parameters()))
            self.assertEqual(len(opened), TP)  # One bracket per sync.
        finally:
            reload.initialize_layerwise_reload = original

    def test_a_layer_left_unprocessed_by_its_wave_fails_that_wave(self):
        import tiny_mla as tm
        from wsync import WsyncError, vllm_loader
        model, landing = self._landing(stream="layer")
        load = model.load_weights
        o_proj = tm.layer_names(1)[2]
        model.load_weights = lambda weights: load((n, t) for n, t in weights if n != o_proj)
        waves = vllm_loader.WaveLoader(landing, model, types.SimpleNamespace(dtype=tm.DTYPE))
        waves.load(1, 1)
        with self.assertRaisesRegex(WsyncError, r"wave 2 \(model.layers.1\).*"
                                                r"model.layers.1.self_attn.o_proj"):
            waves.load(1, 2)
        waves.close()
        self.assertFalse(any(p.is_meta for p in model.parameters()))
        self.assertFalse(waves.opened)


def _attention_reload(index, version):
    """In a process whose stand-in is `version`'s: k_scale of an MLAAttention reloaded through
    vLLM's layerwise reload (a new value 5), without and with a quant method on the layer; and
    wsync's landing of it. Returns what each gave."""
    os.environ["VLLM_STANDIN_VERSION"] = version
    sys.path.insert(0, STANDIN)
    import torch

    import tiny_mla as tm
    from vllm.model_executor.model_loader import reload
    from wsync import layouts, vllm_loader
    out = {}
    for quantized in (False, True):
        model = tm.TinyMLA(0, TP, _logical(1), LAYERS, True)
        attn = model.model.layers[1].self_attn.attn
        attn.k_scale = torch.nn.Parameter(torch.ones(()), requires_grad=False)
        if quantized:
            attn.quant_method = tm.KvScaleMethod()
        reload.record_metadata_for_reloading(model)
        name = tm.prefix(1) + "self_attn.attn.k_scale"
        reload.initialize_layerwise_reload(model)
        try:
            model.load_weights([(name, torch.tensor(5.0))])
            reload.finalize_layerwise_reload(model, types.SimpleNamespace(dtype=tm.DTYPE))
            reloaded = float(attn.k_scale)
        except ValueError as error:
            reloaded = str(error)
        try:
            landing = vllm_loader.vllm_landing(
                model, 0, TP, layouts.ModelConfig.from_hf(tm.HF_CONFIG), stream="whole",
                rules=[layouts.Rule(r"(.*\.attn\.k_scale)", "replicated", r"\1")])
            landed = landing.ways[name][0]
        except layouts.LayoutError as error:
            landed = str(error)
        out["quantized" if quantized else "plain"] = (reloaded, landed)
    return out


class AttentionWithoutQuantMethodTest(unittest.TestCase):
    """vLLM main's layerwise reload (reload/layerwise.py, stored file id 51768495098) reloads an
    attention layer's own parameters only through its quant method and drops them without one:
    a parameter landing there through the loader would stay stale, so wsync refuses it at
    connect, naming the parameter and the layer."""

    def test_refused_at_connect_where_vllm_would_drop_it(self):
        results = run_processes(_attention_reload, 1, ("0.33.1.dev7+gabc",), timeout=60)
        status, main = results[0]
        self.assertEqual(status, "ok", main)
        name = "model.layers.1.self_attn.attn.k_scale"
        reloaded, landed = main["plain"]
        self.assertEqual(reloaded, 1.0)  # The stand-in drops the load as upstream does.
        self.assertIn(f"{name} of model.layers.1.self_attn.attn (TinyMLAAttention)", landed)
        self.assertIn("attention layer without a quant method", landed)
        self.assertEqual(main["quantized"], (5.0, "loader"))  # Through its quant method: lands.
        results = run_processes(_attention_reload, 1, ("0.33.0",), timeout=60)
        status, release = results[0]
        self.assertEqual(status, "ok", release)
        self.assertIn("Layerwise loading of attention layers is not supported",
                      release["plain"][0])  # 0.33 raises instead, refused at connect alike.
        self.assertIn("without a quant method", release["plain"][1])


if __name__ == "__main__":
    unittest.main()
