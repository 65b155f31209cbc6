"""wsync's registration with vLLM's factories and its version pin, against `vllm_standin/` (vLLM's
base.py / factory.py classes and calls as released in v0.28.0 / v0.29.0, after
vllm-project/vllm#50902; see vllm_standin/README.md): a vLLM outside >=0.28.0,<0.30.0 is refused
at registration with a message naming the version found and the range; a supported one gets
"wsync" in both factories, and the engines and info classes are vLLM's subclasses; without vLLM
the info classes are plain dataclasses. No process is spawned."""

import dataclasses
import importlib
import os
import sys
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_standin")
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

    def test_unsupported_versions_are_refused_naming_version_and_range(self):
        from wsync import Status, WsyncError
        wv, _ = _fresh(True)
        import vllm
        from vllm.distributed.weight_transfer import factory
        for version in ("0.27.1", "0.30.0", "0.26.0rc1", "1.0.0", "unknown"):
            vllm.__version__ = version
            with self.assertRaises(WsyncError) as caught:
                wv.register()
            self.assertEqual(caught.exception.code, Status.UNSUPPORTED)
            self.assertIn(f"found vLLM {version}", str(caught.exception))
            self.assertIn(">=0.28.0,<0.30.0", str(caught.exception))
            self.assertNotIn("wsync", factory.WeightTransferEngineFactory._registry)
            self.assertNotIn("wsync", factory.WeightTransferTrainerFactory._registry)
        # An engine registered by hand is refused as well when it is built.
        vllm.__version__ = "1.0.0"
        factory.WeightTransferEngineFactory.register_engine("wsync", wv.WsyncWeightTransferEngine)
        try:
            with self.assertRaises(WsyncError) as caught:
                factory.WeightTransferEngineFactory.create_engine(
                    types.SimpleNamespace(backend="wsync"), _vllm_config(), "cpu", None)
            self.assertIn("found vLLM 1.0.0", str(caught.exception))
        finally:
            factory.WeightTransferEngineFactory._registry.pop("wsync", None)

    def test_supported_versions_register_both_engines(self):
        for version in ("0.28.0", "0.28.2", "0.29.0", "0.29.1rc2+cu130"):
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
        self.assertIsNone(sent["secret_file"])  # The workers read their own secret...
        self.assertEqual(sent["secret_env"], "WSYNC_SECRET")  # ...from this variable.
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

    def test_without_vllm(self):
        wv, wt = _fresh(False)
        self.assertFalse(wv.HAVE_VLLM)
        self.assertFalse(wv.register())
        self.assertTrue(dataclasses.is_dataclass(wv.WsyncInitInfo))
        info = wt.WsyncTrainerInitInfo("h:1", 1, 1, rank=0)
        self.assertTrue(info.is_sender)
        self.assertEqual(info.backend, "wsync")


def _vllm_config():
    return types.SimpleNamespace(parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
                                 model_config=None)


if __name__ == "__main__":
    unittest.main()
