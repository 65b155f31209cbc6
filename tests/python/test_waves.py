"""Streamed syncs through the C ABI (wsync.h: set_parameter_wave, set_wave_callback): a trainer
and a rollout process; the rollout lands "b" (wave 1) and "c" (wave 2) in one shared staging
tensor and its wave callback copies each out before the next wave lands, as an engine's loader
would. Versions commit with every element right; a callback that raises fails the sync on both
processes naming the wave (the rollout DIRTY, the exception kept); refusals of bad calls."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-waves-secret-0123456789abcdef"
COMMON = dict(deadline_seconds=20, path_transports="*=ucx:sm,cma,self", job_id="python-waves")
SHAPE = (6, 8)
NAMES = ("a", "b", "c")


def _values(version, index):
    import torch
    rows, cols = SHAPE
    return (torch.arange(rows * cols, dtype=torch.float32).reshape(SHAPE) * 0.5
            + 1000 * version + 100 * index)


def _session(role, port):
    from wsync import Session
    return Session(role, rank=0, num_trainers=1, num_rollouts=1,
                   coordinator=f"127.0.0.1:{port}", host_coordinator=role == "trainer",
                   secret=SECRET, **COMMON)


def _declare(session, name, buffer_id, offset):
    rows, cols = SHAPE
    session.declare_parameter(name, "fp32", SHAPE)
    session.declare_piece(name, buffer_id, (0, 0), SHAPE, offset, (cols, 1))


def _trainer(index, port, fail_version):
    import torch
    weights = torch.zeros((3,) + SHAPE)
    out = {}
    with _session("trainer", port) as session:
        session.register_buffer(0, weights.data_ptr(), weights.numel() * 4, keep=weights)
        for i, name in enumerate(NAMES):
            _declare(session, name, 0, i * SHAPE[0] * SHAPE[1])
        try:
            session.set_parameter_wave("a", 1)
        except Exception as error:  # noqa: BLE001
            out["trainer_wave"] = str(error)
        session.connect()
        for version in (1, 2, fail_version):
            for i in range(3):
                weights[i].copy_(_values(version, i))
            try:
                session.sync(version)
                out[version] = "ok"
            except Exception as error:  # noqa: BLE001
                out[version] = str(error)
    return out


def _rollout(index, port, fail_version):
    import torch
    from wsync import State
    live_a = torch.zeros(SHAPE)
    staging = torch.zeros(SHAPE)  # "b" and "c", one wave after the other.
    model = {"b": torch.zeros(SHAPE), "c": torch.zeros(SHAPE)}
    out = {"waves": [], "refused": {}}
    with _session("rollout", port) as session:
        session.register_buffer(0, live_a.data_ptr(), live_a.numel() * 4, keep=live_a)
        session.register_buffer(1, staging.data_ptr(), staging.numel() * 4, keep=staging)
        _declare(session, "a", 0, 0)
        _declare(session, "b", 1, 0)
        _declare(session, "c", 1, 0)
        for call, args in (("unknown", ("nope", 1)), ("range", ("b", 4096)),
                           ("negative", ("b", -1))):
            try:
                session.set_parameter_wave(*args)
            except Exception as error:  # noqa: BLE001
                out["refused"][call] = str(error)
        session.set_parameter_wave("b", 1)
        session.set_parameter_wave("c", 2)

        def after_wave(version, wave):
            out["waves"].append((version, wave))
            if version == fail_version and wave == 2:
                raise ValueError("the loader refused layer 2")
            if wave > 0:
                model[NAMES[wave]].copy_(staging)

        session.set_wave_callback(after_wave)
        session.connect()
        for version in (1, 2, fail_version):
            try:
                session.sync(version)
                out[version] = all(torch.equal(t, _values(version, i)) for i, t in
                                   enumerate((live_a, model["b"], model["c"])))
            except Exception as error:  # noqa: BLE001
                out[version] = str(error)
                out["wave_error"] = repr(getattr(error, "wave_error", None))
                out["state"] = session.state()[0] == State.DIRTY
    return out


class WavesTest(unittest.TestCase):
    def test_waves_land_in_turn_and_a_failing_callback_fails_both(self):
        port = free_ports(1)[0]
        results = run_processes(_job, 2, (port, 3))
        for status, value in results:
            self.assertEqual(status, "ok", value)
        trainer, rollout = results[0][1], results[1][1]
        self.assertEqual(trainer[1], "ok")
        self.assertEqual(trainer[2], "ok")
        self.assertIs(rollout[1], True)
        self.assertIs(rollout[2], True)
        # Waves in order, each version: 0, 1, 2; the failing one ends at its callback of wave 2.
        self.assertEqual(rollout["waves"], [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2),
                                            (3, 0), (3, 1), (3, 2)])
        self.assertIn("callback after wave 2 failed", rollout[3])
        self.assertIn("ValueError('the loader refused layer 2')", rollout["wave_error"])
        self.assertTrue(rollout["state"])
        self.assertIn("callback after wave 2 failed", trainer[3])
        self.assertIn("waves are the rollouts'", trainer["trainer_wave"])
        self.assertIn("'nope': not declared", rollout["refused"]["unknown"])
        self.assertIn("wave 4096 is outside [0, 4096)", rollout["refused"]["range"])
        self.assertIn("wave -1 is outside", rollout["refused"]["negative"])


def _job(index, port, fail_version):
    return (_trainer if index == 0 else _rollout)(index, port, fail_version)


if __name__ == "__main__":
    unittest.main()
