"""wsync's registration with vLLM's factories and its version pin, against `vllm_standin/` (vLLM's
base.py / factory.py / config classes and calls per interface generation, `$VLLM_STANDIN_VERSION`:
the 0.33 releases, main, and 0.29; plugins/__init__.py; see vllm_standin/README.md):
registration never raises (vLLM calls it uncaught in every process: a vLLM outside the range
with the package installed starts, its other backends too), and a vLLM outside
wsync.vllm.SUPPORTED_VLLM is refused where "wsync" is selected (engine creation, trainer_init),
naming the version found and the range; a supported one (0.32.x, 0.33.x, main's 0.33.1.devN)
gets "wsync" in both factories, and the engines and info classes are vLLM's subclasses; the
worker's RPCs run one at a time; a failed update on a vLLM without an abort leaves the weights
dirty and the next start succeeds; without vLLM the info classes are plain dataclasses. No
process is spawned."""

import dataclasses
import importlib
import os
import sys
import types
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_standin")
PYPROJECT = os.path.join(HERE, "..", "..", "integration", "python", "pyproject.toml")
sys.path.insert(0, HERE)
import harness  # noqa: E402,F401 - puts the wsync package on sys.path.


def _fresh(with_vllm):
    """Imports wsync.vllm and wsync.vllm_trainer anew, with or without the vLLM stand-in."""
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm.") or name.startswith("wsync.vllm"):
            del sys.modules[name]
    while STANDIN in sys.path:
        sys.path.remove(STANDIN)
    if with_vllm:
        sys.path.insert(0, STANDIN)
    import wsync
    for name in ("vllm", "vllm_trainer"):
        if hasattr(wsync, name):
            delattr(wsync, name)
    return importlib.import_module("wsync.vllm"), importlib.import_module("wsync.vllm_trainer")


class VllmRegistrationTest(unittest.TestCase):
    def tearDown(self):
        _fresh(False)

    def test_register_never_raises_and_wsync_is_refused_when_selected(self):
        from wsync import Status, WsyncError
        for version in ("0.27.1", "0.29.0", "0.31.2", "0.34.0", "0.26.0rc1", "1.0.0", "unknown"):
            wv, wt = _fresh(True)
            import vllm
            from vllm.distributed.weight_transfer import base, factory
            vllm.__version__ = version
            with self.assertLogs("wsync.vllm", "WARNING") as logs:
                self.assertTrue(wv.register())  # Returns: vLLM's start-up goes on.
            self.assertIn(f"found vLLM {version}", "\n".join(logs.output))
            self.assertIn("wsync", factory.WeightTransferEngineFactory._registry)
            # Refused where "wsync" is selected, naming the version found and the range.
            with self.assertRaises(WsyncError) as caught:
                factory.WeightTransferEngineFactory.create_engine(
                    types.SimpleNamespace(backend="wsync"), _vllm_config(), "cpu", None)
            self.assertEqual(caught.exception.code, Status.UNSUPPORTED)
            self.assertIn(f"found vLLM {version}", str(caught.exception))
            self.assertIn(wv.SUPPORTED_VLLM, str(caught.exception))
            with self.assertRaises(WsyncError) as caught:
                factory.WeightTransferTrainerFactory.trainer_init(
                    wt.WsyncTrainerInitInfo("127.0.0.1:1", 1, 1, rank=0), client=None,
                    source=base.ModuleSource(torch.nn.Linear(2, 2)))
            self.assertEqual(caught.exception.call, "trainer_init")
            self.assertIn(f"found vLLM {version}", str(caught.exception))
            self.assertIn(wv.SUPPORTED_VLLM, str(caught.exception))

    def test_vllm_033_starts_with_wsync_installed(self):
        """vLLM 0.33's start-up as `vllm serve` runs it where the package is installed: the
        general plugins (the package's entry point, from its dist-info) are called in the
        process without catching, then the worker builds the configured engine: a non-wsync
        backend (and none) starts, and so does "wsync" (0.33 is supported). The same start-up
        on a vLLM outside the range (0.34.0): register() returns, a non-wsync backend starts,
        "wsync" is refused naming both versions."""
        for version in ("0.33.0", "0.34.0"):
            with self.subTest(version=version):
                self._start_vllm(version)

    def _start_vllm(self, version):
        import tempfile
        from wsync import WsyncError
        import vllm_calls
        wv, _ = _fresh(True)
        import vllm
        import vllm.plugins
        from vllm.distributed.weight_transfer import base, factory
        vllm.__version__ = version
        supported = wv.vllm_version_supported(version)
        self.assertEqual(supported, version == "0.33.0")

        class StandInNcclEngine(base.WeightTransferEngine):  # A built-in backend's place.
            init_info_cls = update_info_cls = dict

            def init_transfer_engine(self, init_info): pass
            def start_weight_update(self): pass
            def finish_weight_update(self): pass
            def receive_weights(self, update_info): pass
            def shutdown(self): pass

        factory.WeightTransferEngineFactory.register_engine("nccl", StandInNcclEngine)
        with tempfile.TemporaryDirectory() as site:
            info = os.path.join(site, "wsync-0.1.0.dist-info")
            os.mkdir(info)
            with open(os.path.join(info, "METADATA"), "w") as f:
                f.write("Metadata-Version: 2.1\nName: wsync\nVersion: 0.1.0\n")
            import tomllib
            with open(PYPROJECT, "rb") as f:  # The package's own entry point.
                entry = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
            self.assertEqual(entry, {"wsync": "wsync.vllm:register"})
            with open(os.path.join(info, "entry_points.txt"), "w") as f:
                f.write("[vllm.general_plugins]\nwsync = " + entry["wsync"] + "\n")
            sys.path.insert(0, site)
            expect_logs = self.assertNoLogs if supported else self.assertLogs
            try:
                with expect_logs("wsync.vllm", "WARNING"):  # A warning only where refused.
                    vllm.plugins.load_general_plugins()  # Returns: vLLM goes on.
            finally:
                sys.path.remove(site)
        self.assertIn("wsync", factory.WeightTransferEngineFactory._registry)
        worker = vllm_calls.Worker(vllm_calls.WeightTransferConfig(backend="nccl"),
                                   _vllm_config(), "cpu", None)
        self.assertIsInstance(worker.weight_transfer_engine, StandInNcclEngine)
        self.assertIsNone(vllm_calls.Worker(None, _vllm_config(), "cpu", None)
                          .weight_transfer_engine)
        if supported:
            worker = vllm_calls.Worker(vllm_calls.WeightTransferConfig(backend="wsync"),
                                       _vllm_config(), "cpu", None)
            self.assertIsInstance(worker.weight_transfer_engine, wv.WsyncWeightTransferEngine)
        else:
            with self.assertRaisesRegex(WsyncError, r"supports vLLM >=0\.32\.0,<0\.34\.0; "
                                                    r"found vLLM 0\.34\.0"):
                vllm_calls.Worker(vllm_calls.WeightTransferConfig(backend="wsync"),
                                  _vllm_config(), "cpu", None)

    def test_register_without_weight_transfer_returns_false(self):
        wv, _ = _fresh(True)
        import vllm
        vllm.__version__ = "0.33.0"
        sys.modules["vllm.distributed.weight_transfer.factory"] = None  # An ImportError.
        try:
            self.assertFalse(wv.register())
        finally:
            del sys.modules["vllm.distributed.weight_transfer.factory"]

    def test_supported_versions_register_both_engines(self):
        for version in ("0.32.0", "0.32.3", "0.33.0", "0.33.1rc2+cu130", "0.33.1.dev42+g1a2b3c"):
            wv, wt = _fresh(True)
            import vllm
            from vllm.distributed.weight_transfer import base, factory
            vllm.__version__ = version
            self.assertTrue(wv.HAVE_VLLM)
            self.assertTrue(wv.register())
            self.assertTrue(wv.register())  # Twice (the plugin loads once per process): no error.
            engine = factory.WeightTransferEngineFactory.create_engine(
                types.SimpleNamespace(backend="wsync"), _vllm_config(), "cpu", None)
            self.assertIsInstance(engine, wv.WsyncWeightTransferEngine)
            self.assertIsInstance(engine, base.WeightTransferEngine)
            self.assertFalse(engine.supports_draft_weight_update)
            trainer_cls = factory.WeightTransferTrainerFactory._registry["wsync"]()
            self.assertIs(trainer_cls, wt.WsyncTrainerWeightTransferEngine)
            self.assertTrue(issubclass(trainer_cls, base.TrainerWeightTransferEngine))
            self.assertTrue(issubclass(wt.WsyncTrainerInitInfo, base.TrainerInitInfo))
            self.assertEqual(wt.WsyncTrainerInitInfo.backend, "wsync")
            self.assertTrue(issubclass(wv.WsyncInitInfo, base.WeightTransferInitInfo))
            self.assertTrue(issubclass(wv.WsyncUpdateInfo, base.WeightTransferUpdateInfo))

    def test_info_classes_round_trip_vllm_parsing(self):
        wv, wt = _fresh(True)
        info = wt.WsyncTrainerInitInfo("h:1", 2, 4, job_id="j", deadline_seconds=5, rank=1)
        self.assertFalse(info.is_sender)
        self.assertTrue(wt.WsyncTrainerInitInfo("h:1", 2, 4, rank=0).is_sender)
        with self.assertRaises(TypeError):
            wt.WsyncTrainerInitInfo("h:1", 2, 4)  # rank is keyword-only and required.
        engine = wv.WsyncWeightTransferEngine(None, _vllm_config(), "cpu", None)
        worker_info = engine.parse_init_info(info.worker_init_info())  # What rank 0 sends.
        self.assertEqual((worker_info.coordinator, worker_info.num_trainers,
                          worker_info.num_rollouts, worker_info.job_id,
                          worker_info.deadline_seconds), ("h:1", 2, 4, "j", 5))
        sent = info.worker_init_info()
        # No trust in the request: the workers' secret and rules are their launch configuration.
        self.assertFalse(set(sent) & set(wv.LAUNCH_ONLY_FIELDS), sent)
        self.assertEqual(engine.parse_update_info({"version": 3}).version, 3)
        with self.assertRaisesRegex(ValueError, "Invalid init_info for WsyncWeightTransferEngine"):
            engine.parse_init_info({"coordinator": "h:1", "bogus": 1})
        with self.assertRaisesRegex(ValueError, "Invalid update_info"):
            engine.parse_update_info({})

    def test_trainer_init_refuses_what_it_cannot_read_in_place(self):
        import torch
        from wsync import WsyncError
        wv, wt = _fresh(True)
        wv.register()
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        info = wt.WsyncTrainerInitInfo("127.0.0.1:1", 1, 1, rank=0)
        for source, message in ((None, "needs a WeightSource"),
                                (iter([("w", torch.zeros(1))]), "in place")):
            with self.assertRaisesRegex(WsyncError, message):
                WeightTransferTrainerFactory.trainer_init(info, client=None, source=source)
        info = dataclasses.replace(info, layout="deepspeed")
        with self.assertRaisesRegex(WsyncError, 'layout must be "hf" or "megatron"'):
            WeightTransferTrainerFactory.trainer_init(
                info, client=None, source=ModuleSource(torch.nn.Linear(2, 2)))

    def test_finish_passes_the_weight_version_where_the_client_takes_it(self):
        _, wt = _fresh(True)
        calls = []

        class NewerClient:  # finish_weight_update(weight_version=None), as later clients.py.
            def finish_weight_update(self, weight_version=None):
                calls.append(("newer", weight_version))

        class ClientAt81ea9e9d:  # The four-method protocol without a version.
            def finish_weight_update(self):
                calls.append(("old", None))

        wt._finish(NewerClient(), 7)
        with self.assertLogs("wsync.vllm", "WARNING"):
            wt._finish(ClientAt81ea9e9d(), 8)
        self.assertEqual(calls, [("newer", "7"), ("old", None)])

    def test_failed_update_on_vllm_without_abort_then_a_committing_one(self):
        """vLLM 0.33 (no abort method) and main (a no-op abort on the base class that no worker
        calls): a failed update_weights only clears the worker's update flag, the worker's RPCs
        one after another as collective_rpc runs them, over wsync's engine with a session
        stand-in whose first sync fails: dirty, finish refused, no abort, the next start
        succeeds and the next sync commits, its version served."""
        for version in ("0.33.0", "0.33.1.dev42"):
            with self.subTest(version=version):
                self._failed_then_committed(version)

    def _failed_then_committed(self, version):
        import vllm_calls
        from wsync import State, Status, WsyncError
        wv, _ = _fresh_at(version)
        wv.register()
        from vllm.distributed.weight_transfer import base
        self.assertEqual(hasattr(base.WeightTransferEngine, "abort_weight_update"),
                         ".dev" in version)
        worker = vllm_calls.Worker(vllm_calls.WeightTransferConfig(backend="wsync"),
                                   _vllm_config(), "cpu", torch.nn.Linear(2, 2))
        engine = worker.weight_transfer_engine
        syncs = []

        class Session:  # wsync's Session as the engine uses it: the first sync fails.
            committed = -1

            def sync(self, version):
                syncs.append(version)
                if len(syncs) == 1:
                    raise WsyncError(Status.TIMED_OUT, "a trainer rank came late", "sync")
                self.committed = version

            def state(self):
                return (State.DIRTY if len(syncs) == 1 else State.IDLE), self.committed

        class Landing:  # Every parameter direct, in place.
            streamed = False

            def moved_parameters(self, model):
                return []

            def apply(self, model, model_config):
                pass

        engine.session, engine.landing, engine._rank = Session(), Landing(), 0
        aborts = []
        engine.abort_weight_update = lambda: aborts.append(1)
        worker.start_weight_update()
        with self.assertRaisesRegex(WsyncError, "came late"):
            worker.update_weights({"version": 1})
        self.assertFalse(worker._weight_update_active)  # vLLM ended the update...
        self.assertTrue(engine.weights_dirty)          # ...wsync keeps the weights dirty,
        with self.assertRaisesRegex(WsyncError, "do not serve"):
            engine.finish_weight_update()              # refuses to serve them,
        self.assertEqual(aborts, [])                   # and nobody aborted.
        worker.start_weight_update()                   # The next start succeeds...
        worker.update_weights({"version": 2})
        vllm_calls.finish_route(worker, "2")           # ...and its update commits.
        self.assertEqual((syncs, engine.version, engine.weights_dirty), ([1, 2], 2, False))
        self.assertEqual(worker.served_weight_version, "2")
        self.assertFalse(worker._weight_update_active)

    def test_each_generation_has_upstream_s_interface(self):
        """The stand-in per generation, as base.py and config/weight_transfer.py read: 0.29 keeps
        the abstract trainer_send_weights; 0.33 has neither it nor an abort; main has a no-op
        abort and a weight_format; the client's finish takes a weight_version from 0.33 on;
        WeightTransferConfig refuses an unknown field (pydantic's extra="forbid"); wsync's
        engine is a concrete subclass in the supported generations."""
        import inspect
        import vllm_calls
        for version, generation in (("0.29.0", "0.29"), ("0.33.0", "0.33"),
                                    ("0.33.1.dev42+g1a2b3c", "main")):
            with self.subTest(version=version):
                wv, _ = _fresh_at(version)
                import vllm
                from vllm.distributed.weight_transfer import base
                self.assertEqual(vllm.STANDIN_GENERATION, generation)
                engine_cls = base.WeightTransferEngine
                self.assertEqual(hasattr(engine_cls, "trainer_send_weights"), generation == "0.29")
                self.assertEqual(hasattr(engine_cls, "abort_weight_update"), generation == "main")
                self.assertEqual(hasattr(engine_cls, "rank_local_checkpoint_names"),
                                 generation == "main")
                finish = inspect.signature(base.VLLMWeightSyncClient.finish_weight_update)
                self.assertEqual("weight_version" in finish.parameters, generation != "0.29")
                config = vllm_calls.WeightTransferConfig(backend="wsync")
                self.assertEqual(config.backend, "wsync")
                self.assertEqual(getattr(config, "weight_format", None),
                                 "checkpoint" if generation == "main" else None)
                with self.assertRaisesRegex(ValueError, "packed\n  Extra inputs are not "
                                                        "permitted"):
                    vllm_calls.WeightTransferConfig(backend="wsync", packed=True)
                if generation == "main":
                    with self.assertRaisesRegex(ValueError, "weight_format"):
                        vllm_calls.WeightTransferConfig(weight_format="kernel")
                    engine = wv.WsyncWeightTransferEngine(config, _vllm_config(), "cpu", None)
                    self.assertIsNone(engine.rank_local_checkpoint_names())
                elif generation == "0.33":
                    wv.WsyncWeightTransferEngine(config, _vllm_config(), "cpu", None)

    def test_the_worker_runs_one_rpc_at_a_time(self):
        """vLLM's collective_rpc: an RPC issued while update_weights runs (here finish, the
        only way vLLM could reach the engine meanwhile) waits until update_weights returned."""
        import threading
        import vllm_calls
        wv, _ = _fresh_at("0.33.1.dev42")
        wv.register()
        from vllm.distributed.weight_transfer import base
        order, entered, release = [], threading.Event(), threading.Event()

        class SlowEngine(base.WeightTransferEngine):
            init_info_cls = update_info_cls = dict

            def init_transfer_engine(self, init_info): pass
            def start_weight_update(self): pass
            def shutdown(self): pass

            def receive_weights(self, update_info):
                order.append("update begins")
                entered.set()
                release.wait(10)
                order.append("update ends")

            def finish_weight_update(self):
                order.append("finish")

        from vllm.distributed.weight_transfer import factory
        factory.WeightTransferEngineFactory.register_engine("slow", SlowEngine)
        worker = vllm_calls.Worker(vllm_calls.WeightTransferConfig(backend="slow"),
                                   _vllm_config(), "cpu", None)
        worker.start_weight_update()
        updater = threading.Thread(target=worker.update_weights, args=({},))
        updater.start()
        self.assertTrue(entered.wait(10))
        finisher = threading.Thread(target=worker.finish_weight_update)
        finisher.start()
        finisher.join(0.3)
        self.assertTrue(finisher.is_alive())  # Queued behind update_weights...
        release.set()
        updater.join(10)
        finisher.join(10)
        self.assertEqual(order, ["update begins", "update ends", "finish"])  # ...then run.
        del factory.WeightTransferEngineFactory._registry["slow"]

    def test_without_vllm(self):
        wv, wt = _fresh(False)
        self.assertFalse(wv.HAVE_VLLM)
        self.assertFalse(wv.register())
        self.assertTrue(dataclasses.is_dataclass(wv.WsyncInitInfo))
        info = wt.WsyncTrainerInitInfo("h:1", 1, 1, rank=0)
        self.assertTrue(info.is_sender)
        self.assertEqual(info.backend, "wsync")


def _fresh_at(version):
    """_fresh(True) with the stand-in of `version` (its generation is chosen at import)."""
    os.environ["VLLM_STANDIN_VERSION"] = version
    try:
        return _fresh(True)
    finally:
        del os.environ["VLLM_STANDIN_VERSION"]


class EngineRequestTrustTest(unittest.TestCase):
    """Issue 42: an engine request (the RLHF init route, forwarded to the workers) cannot choose
    the secret source, the coordinator or rule regexes: the engine's launch configuration
    (its environment) does; a request naming them is refused, naming the field."""

    def setUp(self):
        self._environ = dict(os.environ)
        os.environ["WSYNC_COORDINATOR_PORT"] = "1"  # The host: the setting's default.
        os.environ.pop("WSYNC_COORDINATOR_HOST", None)
        os.environ.pop("WSYNC_RULES", None)
        os.environ.pop("WSYNC_SECRET_FILE", None)

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self._environ)
        _fresh(False)

    def _worker(self):
        import vllm_calls
        wv, _ = _fresh(True)
        wv.register()
        model = torch.nn.Module()
        model.lm_head = torch.nn.Linear(4, 8, bias=False)
        return wv, vllm_calls.Worker(vllm_calls.WeightTransferConfig(backend="wsync"),
                                     _vllm_config(), "cpu", model)

    def test_a_request_naming_a_secret_source_or_rules_is_refused_over_http(self):
        import vllm_calls
        from harness import free_ports
        wv, worker = self._worker()
        port, = free_ports(1)
        server, _ = vllm_calls.serve(worker, port)
        try:
            client = vllm_calls.FanOutHTTPClient([f"http://127.0.0.1:{port}"], timeout=10)
            job = {"coordinator": "127.0.0.1:1", "num_trainers": 1, "num_rollouts": 1}
            for field, value in (("secret_file", "/proc/self/environ"),
                                 ("secret_env", "HOME"), ("secret", "x" * 32),
                                 ("extra_rules", [["(a+)+$", "replicated", "x"]]),
                                 ("landing_rules", [[".*", "loader"]]), ("skip", [".*"])):
                with self.subTest(field=field):
                    with self.assertRaisesRegex(RuntimeError, rf"HTTP 500: .*WsyncError: .*"
                                                rf"init_info field\(s\) refused: '{field}'"):
                        client.init_weight_transfer_engine(dict(job, **{field: value}))
                    self.assertIsNone(worker.weight_transfer_engine.session)
                    self.assertIsNone(worker.weight_transfer_engine.landing)
        finally:
            server.shutdown()

    def test_a_request_cannot_redirect_the_coordinator(self):
        from wsync import WsyncError
        wv, worker = self._worker()
        with self.assertRaisesRegex(WsyncError, r"init_info field 'coordinator' "
                                    r"\('evil:9'\) is not the engine's launch configuration "
                                    r"\(WSYNC_COORDINATOR_HOST/_PORT: '127\.0\.0\.1:1'\)"):
            worker.init_weight_transfer_engine(
                {"coordinator": "evil:9", "num_trainers": 1, "num_rollouts": 1})
        del os.environ["WSYNC_COORDINATOR_PORT"]  # Without one at launch, no request supplies it.
        with self.assertRaisesRegex(WsyncError, "set WSYNC_COORDINATOR_PORT"):
            worker.init_weight_transfer_engine(
                {"coordinator": "127.0.0.1:1", "num_trainers": 1, "num_rollouts": 1})
        os.environ["WSYNC_COORDINATOR"] = "127.0.0.1:1"  # The variable of before issue 43.
        with self.assertRaisesRegex(WsyncError, "WSYNC_COORDINATOR='127.0.0.1:1' is no longer "
                                    "read"):
            worker.init_weight_transfer_engine(
                {"coordinator": "127.0.0.1:1", "num_trainers": 1, "num_rollouts": 1})
        self.assertIsNone(worker.weight_transfer_engine.session)

    def test_rules_and_secret_come_from_the_launch_configuration(self):
        from wsync import WsyncError
        wv, worker = self._worker()
        launch = wv.LaunchConfig.from_environment()
        self.assertEqual((launch.coordinator, launch.secret_file, launch.secret_env),
                         ("127.0.0.1:1", None, "WSYNC_SECRET"))
        os.environ["WSYNC_SECRET_FILE"] = "/run/wsync/secret"
        os.environ["WSYNC_RULES"] = '{"skip": ["lm_head\\\\..*"]}'
        launch = wv.LaunchConfig.from_environment()
        self.assertEqual((launch.secret_file, launch.secret_env, launch.skip),
                         ("/run/wsync/secret", None, [r"lm_head\..*"]))
        # The engine's rules reach the landing: a landing rule of an unknown way is refused
        # there, before any connection.
        os.environ["WSYNC_RULES"] = '{"landing_rules": [[".*", "sideways"]]}'
        with self.assertRaisesRegex(ValueError, "way must be one of"):
            worker.init_weight_transfer_engine(
                {"coordinator": None, "num_trainers": 1, "num_rollouts": 1})
        for bad in ("[1]", "{not json", '{"rules": []}'):
            os.environ["WSYNC_RULES"] = bad
            with self.assertRaisesRegex(WsyncError, "WSYNC_RULES"):
                wv.LaunchConfig.from_environment()


def _vllm_config():
    return types.SimpleNamespace(parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
                                 model_config=None)


if __name__ == "__main__":
    unittest.main()
