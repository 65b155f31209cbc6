"""Errors surface as wsync.WsyncError with the status code and the session's message: a layout
no rule maps, a layout the plugin refuses, a wrong secret, timeouts (connect and sync), a missing
secret, calls in the wrong state."""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-errors-secret-0123456789abcdef"
TRANSPORTS = "*=ucx:sm,cma,self"


def _job(role, port, **kwargs):
    import wsync
    args = dict(num_trainers=1, num_rollouts=1, job_id="python-errors",
                coordinator=f"127.0.0.1:{port}", host_coordinator=role == "trainer",
                secret=SECRET, deadline_seconds=4, path_transports=TRANSPORTS)
    args.update(kwargs)
    return wsync.Session(role, **args)


def _error(call):
    """(code name, message, call) of the WsyncError `call` raises; None when it returns."""
    import wsync
    try:
        call()
    except wsync.WsyncError as error:
        return (error.code.name, error.message, error.call, str(error))
    return None


def _declare_whole(session, tensor, name="w"):
    from wsync import layouts
    layouts.hf_layout({name: tensor}).register(session)


def _refused(index, port):
    import torch
    from wsync import layouts
    role = "trainer" if index == 0 else "rollout"
    tensor = torch.zeros(8, 8)
    with _job(role, port) as session:
        if role == "trainer":  # Holds rows 0..3 only: rows 4..7 have no source.
            layout = layouts.Layout()
            layout.add("w", (8, 8), (0, 0), tensor[:4])
            layout.register(session)
        else:
            _declare_whole(session, tensor)
        return _error(session.connect)


def _wrong_secret(index, port):
    import torch
    role = "trainer" if index == 0 else "rollout"
    secret = SECRET if role == "trainer" else "not-the-job-secret-0123456789abcdef"
    with _job(role, port, secret=secret) as session:
        _declare_whole(session, torch.zeros(4, 4))
        return _error(session.connect)


def _sync_timeout(index, port):
    import torch
    role = "trainer" if index == 0 else "rollout"
    with _job(role, port, deadline_seconds=3) as session:
        _declare_whole(session, torch.zeros(4, 4))
        session.connect()
        if role == "trainer":
            start = time.time()
            error = _error(lambda: session.sync(1))
            return error, time.time() - start, [int(s) for s in session.state()]
        time.sleep(6)  # Never joins version 1.
        return None


class ErrorTest(unittest.TestCase):
    def test_unmapped_parameter_is_a_layout_error(self):
        import torch
        import wsync
        from wsync import layouts
        with self.assertRaises(wsync.WsyncError) as caught:
            layouts.vllm_layout({"model.layers.0.mystery.weight": torch.zeros(4, 4)}, 0, 2, None)
        self.assertEqual(caught.exception.code, wsync.Status.INVALID_ARGUMENT)
        self.assertIn("model.layers.0.mystery.weight", caught.exception.message)
        # A user rule for a new module maps it.
        layout = layouts.vllm_layout({"model.layers.0.mystery.weight": torch.zeros(4, 4)}, 1, 2,
                                     None, rules=[layouts.Rule(r"(.*mystery.*)", "column", r"\1")])
        piece = layout.pieces[0]
        self.assertEqual((piece.param, piece.origin, piece.extent), (
            "model.layers.0.mystery.weight", (4, 0), (4, 4)))
        self.assertEqual(layout.params["model.layers.0.mystery.weight"].shape, (8, 4))

    def test_local_errors(self):
        import wsync
        port, = free_ports(1)
        os.environ.pop("WSYNC_PY_TEST_UNSET", None)
        error = _error(lambda: wsync.Session("rollout", coordinator=f"127.0.0.1:{port}",
                                             secret_env="WSYNC_PY_TEST_UNSET"))
        self.assertEqual(error[0], "AUTHENTICATION", error)
        self.assertIn("secret", error[1])
        self.assertEqual(_error(lambda: wsync.Session("referee"))[0], "INVALID_ARGUMENT")
        error = _error(lambda: wsync.Session("rollout", coordinator=f"127.0.0.1:{port}",
                                             secret=SECRET, silence_limit_seconds=-1))
        self.assertEqual(error[0], "INVALID_ARGUMENT", error)
        self.assertIn("silence_limit_seconds", error[1])
        error = _error(lambda: wsync.Session("rollout", coordinator=f"127.0.0.1:{port}",
                                             secret=SECRET, heartbeat_interval_seconds=2))
        self.assertEqual(error[0], "INVALID_ARGUMENT", error)  # Above half the 3 s default limit.
        self.assertIn("twice", error[1])
        wsync.Session("rollout", coordinator=f"127.0.0.1:{port}", secret=SECRET,
                      heartbeat_interval_seconds=0.1, silence_limit_seconds=1).finalize()
        # delta: "off", "auto" (for now off) and "on" are taken, other values refused.
        error = _error(lambda: wsync.Session("rollout", coordinator=f"127.0.0.1:{port}",
                                             secret=SECRET, delta="sometimes"))
        self.assertEqual(error[0], "INVALID_ARGUMENT", error)
        self.assertIn("delta", error[1])
        wsync.Session("rollout", coordinator=f"127.0.0.1:{port}", secret=SECRET,
                      delta="on").finalize()
        wsync.Session("rollout", coordinator=f"127.0.0.1:{port}", secret=SECRET,
                      delta="auto").finalize()
        session = wsync.Session("rollout", coordinator=f"127.0.0.1:{port}", secret=SECRET)
        with session:
            self.assertEqual(session.state()[0], wsync.State.REGISTERED)
            error = _error(lambda: session.sync(1))
            self.assertEqual(error[:1], ("INVALID_ARGUMENT",), error)
            self.assertIn("state", error[1].lower())
            self.assertEqual(error[2], "sync")
            self.assertIn("WSYNC_INVALID_ARGUMENT", error[3])
            error = _error(lambda: session.declare_parameter("w", "complex128", [4]))
            self.assertEqual(error[0], "INVALID_ARGUMENT", error)
        self.assertEqual(_error(lambda: session.sync(1))[0], "INVALID_ARGUMENT")

    def test_connect_timeout_names_the_missing(self):
        port, = free_ports(1)

        def alone():
            import torch
            with _job("trainer", port, deadline_seconds=2) as session:
                _declare_whole(session, torch.zeros(4, 4))
                return _error(session.connect)

        error = alone()
        self.assertIsNotNone(error)
        self.assertEqual(error[0], "TIMED_OUT", error)
        self.assertTrue(error[1], error)

    def test_layout_refused(self):
        port, = free_ports(1)
        results = run_processes(_refused, 2, (port,), timeout=60)
        for status, error in results:
            self.assertEqual(status, "ok", error)
            self.assertIsNotNone(error)
            self.assertEqual(error[0], "LAYOUT_REFUSED", error)
            self.assertIn("'w'", error[1])

    def test_wrong_secret(self):
        port, = free_ports(1)
        results = run_processes(_wrong_secret, 2, (port,), timeout=60)
        (t_status, trainer), (r_status, rollout) = results
        self.assertEqual((t_status, r_status), ("ok", "ok"), results)
        self.assertIsNotNone(rollout)
        self.assertEqual(rollout[0], "AUTHENTICATION", rollout)
        self.assertTrue(rollout[1])
        self.assertIsNotNone(trainer)  # Its peer never joins: the trainer's connect fails too.
        self.assertIn(trainer[0], ("TIMED_OUT", "AUTHENTICATION", "PEER_LOST"), trainer)

    def test_sync_timeout(self):
        port, = free_ports(1)
        results = run_processes(_sync_timeout, 2, (port,), timeout=60)
        self.assertEqual([s for s, _ in results], ["ok", "ok"], results)
        error, seconds, state = results[0][1]
        self.assertIsNotNone(error)
        self.assertEqual(error[0], "TIMED_OUT", error)
        self.assertTrue(error[1], error)
        self.assertLess(seconds, 15)
        self.assertEqual(state, [3, -1])  # A trainer returns to IDLE; nothing committed.


if __name__ == "__main__":
    unittest.main()
