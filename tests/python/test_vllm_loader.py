"""Two ways to land a parameter on a vLLM worker (wsync.vllm_loader), driven by vLLM's own calls.

vLLM cannot be installed here; `vllm_standin/` reproduces, besides the weight-transfer classes
(see test_vllm_engines), the layerwise reload bracket of
vllm/model_executor/model_loader/reload/layerwise.py @ 01424e4b (initialize / finalize, the
per-layer processing, attention layers last) as vLLM's IPC engine uses it around
`model.load_weights` (vllm/distributed/weight_transfer/ipc_engine.py @ 406784bd:
start_weight_update / receive_weights / finish_weight_update), and `tiny_mla.py` a model loaded
as vllm/model_executor/model_loader/utils.py loads one (quant methods, then attention layers,
post-process): two direct parameters (a norm, a row-parallel projection with its bias) and two
through the loader (MLA's kv_b_proj, from which the attention layer derives W_UK_T / W_UV, and a
"quantized" o_proj stored rounded and transposed).

One job: 2 trainer ranks (layout "hf", each holding whole tensors of its half of the model)
through WsyncTrainerWeightTransferEngine, 2 vLLM workers (TP2) through vLLM's worker calls and
HTTP routes. Versions 1, 2, 4 commit: after each, on every worker, every element of every
parameter and derived matrix equals the oracle computed from the trainer's logical tensors
(direct: the rank's slice; loader: the model's post-processing of it, derived matrices
recomputed), and the staging boxes equal the logical boxes. Version 3 is aborted mid-sync on
worker 0, its staging filled with version 3 beforehand (as if received): the loader parameters
and derived matrices stay at version 2 (not applied), weights dirty, finish refused. Version 5: worker 1 skips the loader step (test sabotage): the oracle
reports exactly its loader parameters and derived matrices stale, proving the check sees it.
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

SECRET = "python-vllm-loader-secret-0123456789"
TP = 2
VERSIONS = (1, 2, 3, 4, 5)
ABORTED = 3
SKIPPED = 5          # Worker 1 skips the loader step of this version.
MOVED = 4            # Before it, the workers sleep and wake up: every weight reallocated.
LATE_SECONDS = 1.5
DEADLINE = 10.0


def _seed(version):
    return 300 + version


def _trainer(rank, coordinator, urls):
    import tiny_mla as tm
    import vllm_calls
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from wsync.vllm_trainer import WsyncTrainerInitInfo

    names = sorted(tm.logical_shapes())[rank::TP]
    model = tm.trainer_module(tm.random_logical(0), names)
    client = vllm_calls.trainer_client(rank, urls)
    info = WsyncTrainerInitInfo(coordinator=coordinator, num_trainers=TP, num_rollouts=TP,
                                job_id="python-vllm-loader", layout="hf",
                                hf_config=tm.HF_CONFIG, deadline_seconds=DEADLINE,
                                path_transports="*=ucx:sm,cma,self", rank=rank)
    engine = WeightTransferTrainerFactory.trainer_init(info, client=client,
                                                       source=ModuleSource(model))
    push = engine.sync.push

    def late_push(version):  # Rank 1 joins the aborted version late: worker 0 aborts meanwhile.
        if version == ABORTED and rank == 1:
            time.sleep(LATE_SECONDS)
        return push(version)

    engine.sync.push = late_push
    rounds = vllm_calls.send_rounds(
        engine, VERSIONS, lambda v: tm.load_trainer(model, tm.random_logical(_seed(v))))
    if rank == 0:
        client.shutdown_servers()
    engine.shutdown()
    return {"rounds": rounds}


def _compare(model, engine, version, rank):
    """Names whose elements differ from the oracle of `version`, and the elements checked."""
    import torch

    import tiny_mla as tm
    logical = tm.random_logical(_seed(version))
    want, have = tm.expected(logical, rank, TP), tm.live(model)
    wrong = sorted(n for n, t in want.items() if not torch.equal(have[n], t))
    for name, staging in engine.landing.staging.items():  # What wsync wrote for the loader.
        for origin, extent in engine.landing.boxes[name]:
            box = tuple(slice(o, o + e) for o, e in zip(origin, extent))
            if not torch.equal(staging[box], logical[name][box]):
                wrong.append(f"staging {name}")
    return wrong, sum(t.numel() for t in want.values())


def _fill_staging(landing, logical):
    for name, staging in landing.staging.items():
        for origin, extent in landing.boxes[name]:
            box = tuple(slice(o, o + e) for o, e in zip(origin, extent))
            staging[box] = logical[name][box]


def _rollout(rank, port):
    import torch

    import tiny_mla as tm
    import vllm_calls

    model = tm.TinyMLA(rank, TP, tm.random_logical(1))
    addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
    vllm_config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=TP, rank=rank, world_size=TP,
                                              data_parallel_index=0),
        model_config=types.SimpleNamespace(hf_config=tm.HF_CONFIG, dtype=tm.DTYPE))
    events = []
    released, snapshots = {}, {}  # Storages a sleep gave up, and what they held then.

    class CheckedWorker(vllm_calls.Worker):
        def update_weights(self, update_info):
            engine = self.weight_transfer_engine
            version = update_info["version"]
            if version == MOVED:  # As vLLM's sleep and wake_up may: new storage for every weight.
                for name, param in model.named_parameters():
                    released[name] = param.data
                    snapshots[name] = param.data.clone()
                    param.data = param.data.clone()
                    addresses[name] = param.data_ptr()
            if version == ABORTED and rank == 0:
                def abort_mid_sync():
                    deadline = time.time() + DEADLINE
                    while not engine.sync_in_flight and time.time() < deadline:
                        time.sleep(0.01)
                    time.sleep(0.3)
                    events.append({"abort_while_syncing": engine.sync_in_flight})
                    engine.abort_weight_update()
                threading.Thread(target=abort_mid_sync, daemon=True).start()
            if version == ABORTED:  # As if the aborted sync had written the staging already.
                _fill_staging(engine.landing, tm.random_logical(_seed(version)))
            apply = engine.landing.apply
            if version == SKIPPED and rank == 1:
                engine.landing.apply = lambda *args: None
            try:
                super().update_weights(update_info)
            except Exception as error:
                refused = vllm_calls.finish_refusal(engine)
                wrong, _ = _compare(model, engine, ABORTED - 1, rank)
                events.append({"version": version, "error": f"{type(error).__name__}: {error}",
                               "dirty": engine.weights_dirty, "finish_refused": refused,
                               "wrong_vs_previous": wrong})
                raise
            finally:
                engine.landing.apply = apply

        def finish_weight_update(self):
            super().finish_weight_update()
            engine = self.weight_transfer_engine
            wrong, checked = _compare(model, engine, engine.version, rank)
            events.append({"version": engine.version, "dirty": engine.weights_dirty,
                           "wrong": wrong, "checked": checked, "stats": engine.stats(),
                           "ways": {n: w for n, (w, _) in engine.landing_report().items()},
                           "in_place": all(p.data_ptr() == addresses[n]
                                           for n, p in model.named_parameters()),
                           "released_untouched": all(torch.equal(released[n], snapshots[n])
                                                     for n in released),
                           "released": len(released)})

    worker = CheckedWorker(vllm_calls.WeightTransferConfig(backend="wsync"), vllm_config,
                           torch.device("cpu"), model)
    vllm_calls.serve_until_shutdown(worker, port, 90)
    return {"events": events}


def _process(index, ports):
    import vllm_calls
    return vllm_calls.job_process(index, ports, TP, SECRET, STANDIN, _trainer, _rollout)


def _local_bytes(names, rank):
    import tiny_mla as tm
    want = tm.expected(tm.random_logical(0), rank, TP)
    return sum(want[n].numel() * want[n].element_size() for n in names)


class VllmLoaderSyncTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.results = run_processes(_process, 2 * TP, (free_ports(1 + TP),), timeout=150)

    def _reports(self, role):
        return role_reports(self, self.results, TP, role)

    def test_both_ways_fresh_after_every_committed_sync(self):
        import tiny_mla as tm
        for rank, report in enumerate(self._reports("rollout")):
            done = [e for e in report["events"] if "wrong" in e]
            self.assertEqual([e["version"] for e in done], [1, 2, 4, 5])
            for event in done:
                if event["version"] == SKIPPED and rank == 1:
                    continue
                self.assertEqual(event["wrong"], [], f"rollout {rank}: {event}")
                self.assertFalse(event["dirty"], event)
                self.assertTrue(event["in_place"], event)
                self.assertEqual(event["ways"], {tm.NORM: "direct", tm.KV_B: "loader",
                                                 tm.O_PROJ: "loader", tm.DOWN: "direct",
                                                 tm.DOWN_BIAS: "direct"})

    def test_stats_say_the_bytes_each_way(self):
        import tiny_mla as tm
        for rank, report in enumerate(self._reports("rollout")):
            stats = [e["stats"] for e in report["events"] if "stats" in e][0]
            self.assertEqual(stats["direct_bytes"], _local_bytes(tm.DIRECT, rank))
            self.assertEqual(stats["loader_bytes"], _local_bytes(tm.LOADER, rank))
            whole = sum(4 * tm.logical_shapes()[n][0] * tm.logical_shapes()[n][1]
                        for n in tm.LOADER)  # Staging holds the checkpoint shape, fp32.
            self.assertEqual(stats["loader_staging_bytes"], whole)
            self.assertEqual((stats["direct_parameters"], stats["loader_parameters"]), (3, 2))

    def test_abort_mid_sync_leaves_loader_parameters_unapplied_and_dirty(self):
        import tiny_mla as tm
        derived = [tm.P + "self_attn.attn.W_UK_T", tm.P + "self_attn.attn.W_UV"]
        for rank, report in enumerate(self._reports("rollout")):
            failed = [e for e in report["events"] if "error" in e]
            self.assertEqual([e["version"] for e in failed], [ABORTED], report["events"])
            event = failed[0]
            self.assertTrue(event["dirty"], event)
            self.assertIn("do not serve", event["finish_refused"] or "")
            # The staging holds the aborted version (filled before the sync), yet the loader
            # parameters and derived matrices are still version ABORTED - 1's: never handed over.
            self.assertEqual(sorted(n for n in event["wrong_vs_previous"]
                                    if n.startswith("staging")),
                             sorted(f"staging {n}" for n in tm.LOADER), event)
            unapplied = [n for n in event["wrong_vs_previous"] if not n.startswith("staging")]
            self.assertFalse(set(unapplied) & set(tm.LOADER + tuple(derived)), event)
        self.assertIn({"abort_while_syncing": True}, self._reports("rollout")[0]["events"])
        for rank, report in enumerate(self._reports("trainer")):
            errors = {v: e for v, e in report["rounds"]}
            self.assertIsNotNone(errors[ABORTED], f"trainer {rank}")
            self.assertEqual([v for v, e in report["rounds"] if e is None], [1, 2, 4, 5])

    def test_a_sleep_and_wake_up_that_moved_every_weight_syncs_into_the_new_storage(self):
        for rank, report in enumerate(self._reports("rollout")):
            after = [e for e in report["events"] if e.get("version") == MOVED and "wrong" in e][0]
            self.assertEqual(after["wrong"], [], f"rollout {rank}: {after}")
            self.assertFalse(after["dirty"], after)
            self.assertTrue(after["in_place"], after)  # The new storages, written in place.
            self.assertGreater(after["released"], 0)
            self.assertTrue(after["released_untouched"], after)  # The old ones never written.

    def test_skipping_the_loader_step_is_seen_stale(self):
        import tiny_mla as tm
        events = self._reports("rollout")[1]["events"]
        skipped = [e for e in events if e.get("version") == SKIPPED and "wrong" in e][0]
        self.assertEqual(sorted(skipped["wrong"]), sorted(
            list(tm.LOADER) + [tm.P + "self_attn.attn.W_UK_T", tm.P + "self_attn.attn.W_UV"]))


class VllmLoaderLayoutTest(unittest.TestCase):
    """In one process, no sync: the classification, its rules, the staging bound, and the loader
    step itself (staging filled by hand stands in for what a sync writes)."""

    @classmethod
    def setUpClass(cls):
        if STANDIN not in sys.path:
            sys.path.insert(0, STANDIN)

    def _landing(self, rank=0, shuffled_down=False, **kwargs):
        import tiny_mla as tm
        from wsync import layouts, vllm_loader
        model = tm.TinyMLA(rank, TP, tm.random_logical(1), shuffled_down=shuffled_down)
        config = layouts.ModelConfig.from_hf(tm.HF_CONFIG)
        return model, vllm_loader.vllm_landing(model, rank, TP, config, **kwargs)

    def test_default_ways_and_reasons(self):
        import tiny_mla as tm
        _, landing = self._landing()
        self.assertEqual({n: w for n, (w, _) in landing.ways.items()},
                         {tm.NORM: "direct", tm.KV_B: "loader", tm.O_PROJ: "loader",
                          tm.DOWN: "direct", tm.DOWN_BIAS: "direct"})
        self.assertIn("post-processed by model.layers.0.self_attn.attn", landing.ways[tm.KV_B][1])
        self.assertIn("GridQuantLinearMethod", landing.ways[tm.O_PROJ][1])
        self.assertEqual(list(landing.staging), [tm.KV_B, tm.O_PROJ])  # Layer order.
        self.assertEqual(tuple(landing.staging[tm.O_PROJ].shape), tm.logical_shapes()[tm.O_PROJ])

    def test_the_reload_processes_a_layer_once_every_element_arrived(self):
        """vLLM's layerwise reload counts the elements each load writes (the stand-in as
        upstream): a fused parameter loaded shard by shard is processed after its last shard,
        with every shard's values, not after the first."""
        import torch
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
        from vllm.model_executor.model_loader import reload
        processed = []

        class Method(QuantizeMethodBase):
            def process_weights_after_loading(self, layer):
                processed.append(layer.weight.detach().clone())

        class Fused(torch.nn.Module):  # Two shards of 2 rows, as qkv_proj's q / k.
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.zeros(4, 3), requires_grad=False)
                self.weight.weight_loader = self.weight_loader
                self.quant_method = Method()

            def weight_loader(self, param, loaded_weight, shard):
                param.data[2 * shard:2 * shard + 2].copy_(loaded_weight)

        layer = Fused()
        reload.record_metadata_for_reloading(layer)
        reload.initialize_layerwise_reload(layer)
        layer.weight.weight_loader(layer.weight, torch.ones(2, 3), 0)
        self.assertEqual(processed, [])  # Half the elements: not yet.
        layer.weight.weight_loader(layer.weight, torch.full((2, 3), 2.0), 1)
        self.assertEqual(len(processed), 1)
        self.assertTrue(torch.equal(processed[0], torch.tensor([[1.0] * 3] * 2 + [[2.0] * 3] * 2)))
        reload.finalize_layerwise_reload(layer, types.SimpleNamespace(dtype=torch.float32))
        self.assertTrue(torch.equal(layer.weight, processed[0]))  # Copied into the live tensor.

    def test_landing_rules_override_and_a_split_layer_is_refused(self):
        import tiny_mla as tm
        from wsync import layouts
        _, landing = self._landing(landing_rules=[[r".*kv_b_proj\.weight", "direct"],
                                                  [r".*down_proj\.weight", "loader"]])
        ways = {n: w for n, (w, _) in landing.ways.items()}
        self.assertEqual((ways[tm.KV_B], ways[tm.DOWN], ways[tm.DOWN_BIAS]),
                         ("direct", "loader", "loader"))  # The bias follows its layer.
        self.assertIn("its layer lands through the loader", landing.ways[tm.DOWN_BIAS][1])
        with self.assertRaisesRegex(layouts.LayoutError, "reloads a layer as a whole"):
            self._landing(landing_rules=[[r".*down_proj\.weight", "loader"],
                                         [r".*down_proj\.bias", "direct"]])
        with self.assertRaisesRegex(ValueError, "way must be one of"):
            self._landing(landing_rules=[[r".*", "sideways"]])

    def test_a_same_shape_repacked_parameter_goes_through_the_loader(self):
        """down_proj's unquantized method reorders its weight in place after loading: shape,
        stride and dtype as recorded, other bytes. Its method gives no runtime reload mapping,
        so vLLM reprocesses the layer on a reload and wsync lands it through the loader; the
        loader step leaves every parameter as a fresh load would, where a direct write of the
        checkpoint slice would leave down_proj in the wrong order."""
        import torch

        import tiny_mla as tm
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
        for rank in range(TP):
            model, landing = self._landing(rank, shuffled_down=True)
            layer = model.model.layers[0].mlp.down_proj
            meta, live = LAYERWISE_INFO[layer].restore_metadata[0]["weight"], layer.weight
            self.assertEqual((meta.shape, meta.stride(), meta.dtype),
                             (live.shape, live.stride(), live.dtype))
            ways = {n: w for n, (w, _) in landing.ways.items()}
            self.assertEqual((ways[tm.DOWN], ways[tm.DOWN_BIAS], ways[tm.NORM]),
                             ("loader", "loader", "direct"))
            self.assertIn("UnquantizedShuffledLinearMethod gives no runtime reload mapping",
                          landing.ways[tm.DOWN][1])
            logical = tm.random_logical(78)
            want = tm.expected(logical, rank, TP, shuffled_down=True)
            self.assertFalse(torch.equal(want[tm.DOWN],
                                         tm.expected(logical, rank, TP)[tm.DOWN]))
            _fill_staging(landing, logical)
            landing.apply(model, types.SimpleNamespace(dtype=tm.DTYPE))
            have = tm.live(model)
            self.assertEqual(sorted(n for n, t in want.items() if not torch.equal(have[n], t)),
                             [tm.NORM])  # Direct: wsync's own job, not the loader's.

    def test_a_changed_stride_goes_through_the_loader(self):
        """A parameter with the recorded shape and dtype but another stride (column-major):
        vLLM's layerwise reload does not bind it as it is, nor does wsync."""
        import torch

        import tiny_mla as tm
        from wsync import vllm_loader
        model, _ = self._landing()
        layer = model.model.layers[0].mlp.down_proj
        layer.weight = torch.nn.Parameter(layer.weight.data.t().contiguous().t(),
                                          requires_grad=False)
        ways = vllm_loader.classify(model)
        self.assertEqual((ways[tm.DOWN][0], ways[tm.DOWN_BIAS][0], ways[tm.NORM][0]),
                         ("loader", "loader", "direct"))
        self.assertIn("checkpoint (8, 5) stride (5, 1) torch.float32, live (8, 5) stride (1, 8)",
                      ways[tm.DOWN][1])

    def test_staging_over_the_budget_is_refused(self):
        from wsync import Status, WsyncError
        _, landing = self._landing()
        self._landing(staging_budget_bytes=landing.staging_bytes)
        with self.assertRaises(WsyncError) as caught:
            self._landing(staging_budget_bytes=landing.staging_bytes - 1, stream="whole")
        self.assertEqual(caught.exception.code, Status.NO_MEMORY)
        self.assertIn(str(landing.staging_bytes), str(caught.exception))

    def test_a_dense_vllm_model_is_all_direct(self):
        import tiny_qwen as tq
        from wsync import layouts, vllm_loader
        c = tq.CONFIG
        config = layouts.ModelConfig(c["heads"], c["kv_heads"], c["head_dim"], c["vocab"])
        landing = vllm_loader.vllm_landing(tq.VllmTiny(0, TP, None), 0, TP, config)
        self.assertEqual(landing.loader_parameters, [])
        self.assertEqual((landing.staging_bytes, landing.loader_bytes), (0, 0))
        landing.apply(None, None)  # Nothing to hand over: no model call at all.

    def test_loader_step_makes_post_processed_weights_fresh_and_skipping_it_is_stale(self):
        import torch

        import tiny_mla as tm
        for rank in range(TP):
            model, landing = self._landing(rank)
            logical = tm.random_logical(77)
            _fill_staging(landing, logical)  # As a sync writes the boxes.
            want = tm.expected(logical, rank, TP)
            stale = sorted(n for n, t in want.items() if not torch.equal(tm.live(model)[n], t))
            self.assertEqual(stale, sorted([tm.NORM, tm.DOWN, tm.DOWN_BIAS] + list(tm.LOADER) +
                                           [tm.P + "self_attn.attn.W_UK_T",
                                            tm.P + "self_attn.attn.W_UV"]))
            kernel = {n: p.data_ptr() for n, p in model.named_parameters()}
            landing.apply(model, types.SimpleNamespace(dtype=tm.DTYPE))
            have = tm.live(model)
            self.assertEqual(sorted(n for n, t in want.items() if not torch.equal(have[n], t)),
                             sorted([tm.NORM, tm.DOWN, tm.DOWN_BIAS]))  # wsync's own job.
            self.assertEqual({n: p.data_ptr() for n, p in model.named_parameters()}, kernel)


    def test_a_failing_load_closes_the_bracket(self):
        import tiny_mla as tm
        model, landing = self._landing()
        kernel = {n: p for n, p in model.named_parameters()}

        def failing_load(weights):
            next(iter(weights))
            raise RuntimeError("load_weights failed")

        model.load_weights = failing_load
        with self.assertRaisesRegex(RuntimeError, "load_weights failed"):
            landing.apply(model, types.SimpleNamespace(dtype=tm.DTYPE))
        after = dict(model.named_parameters())  # The live tensors are back, none on meta.
        self.assertEqual(set(after), set(kernel))
        self.assertTrue(all(after[n] is p and not p.is_meta for n, p in kernel.items()))


    def test_moved_direct_storage_is_detected(self):
        import torch

        import tiny_mla as tm
        model, landing = self._landing()
        self.assertEqual(landing.moved_parameters(model), [])
        layer = model.model.layers[0]
        layer.self_attn.kv_b_proj.weight.data = layer.self_attn.kv_b_proj.weight.data.clone()
        self.assertEqual(landing.moved_parameters(model), [])  # Loader: lands wherever it is.
        layer.mlp.down_proj.weight = torch.nn.Parameter(layer.mlp.down_proj.weight.clone(),
                                                        requires_grad=False)
        self.assertEqual(landing.moved_parameters(model), [tm.DOWN])

    def test_rebind_moves_whole_storages_and_refuses_the_rest(self):
        import torch
        from wsync import layouts

        import tiny_mla as tm

        class Recorder:
            def __init__(self):
                self.calls = []

            def rebind_buffer(self, buffer_id, address, keep=None):
                self.calls.append((buffer_id, address))

        model, landing = self._landing()
        down = model.model.layers[0].mlp.down_proj.weight
        buffer_id = landing.direct_buffers[tm.DOWN]
        # Moved at an offset in a bigger storage: not the storage the session registered.
        bigger = torch.empty(down.numel() + 8, dtype=down.dtype)
        down.data = bigger[8:].view(down.shape)
        session = Recorder()
        self.assertEqual(landing.rebind_moved(model, session), [tm.DOWN])
        self.assertEqual(session.calls, [])
        # Moved whole: the buffer follows, and the landing knows the new place.
        registered = landing.layout.buffers()[0][buffer_id][1]
        down.data = down.data.clone()
        self.assertEqual(landing.rebind_moved(model, session), [])
        self.assertEqual(session.calls, [(buffer_id, down.data_ptr())])
        self.assertEqual(landing.moved_parameters(model), [])
        # The layout's views follow too (it no longer holds the old memory), numbered as before.
        rows, _ = landing.layout.buffers()
        self.assertEqual(rows[buffer_id][1], down.data_ptr())
        self.assertNotIn(registered, [row[1] for row in rows])
        moved_views = [p.view for p in landing.layout.pieces
                       if layouts._storage(p.view)[0] == down.data_ptr()]
        self.assertTrue(moved_views)
        for view in moved_views:
            view.fill_(3.0)  # Writes through the views reach the live parameter.
        self.assertTrue(bool((down == 3.0).all()))


if __name__ == "__main__":
    unittest.main()
