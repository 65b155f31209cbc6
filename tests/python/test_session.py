"""wsync.Session call for call: the polled mode (sync_begin / sync_test) and the
trainer-triggered mode, where the rollout's Python callbacks run on the plugin's background
thread around each push; TrainerSync.schedule() as a dict; stats and state."""

import io
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-session-secret-0123456789abcdef"
COMMON = dict(deadline_seconds=20, path_transports="*=ucx:sm,cma,self", job_id="python-session")


def _polled(index, port):
    import torch
    import wsync
    from wsync import layouts
    from wsync.trainer import RolloutSync, TrainerSync
    w = torch.zeros(16, 8)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(w, requires_grad=False)
    if index == 0:
        sync = TrainerSync(model, layouts.hf_layout(model), 0, 1, f"127.0.0.1:{port}", SECRET,
                           num_rollouts=1, verify=True, **COMMON)
    else:
        sync = RolloutSync(model, layouts.hf_layout(model), 0, 1, f"127.0.0.1:{port}", SECRET,
                           num_trainers=1, verify=True, **COMMON)
    out = {"schedule": sync.schedule()}
    with sync:
        for version in (1, 2):
            if index == 0:
                model.w.data.fill_(version)
            sync.session.sync_begin(version)
            give_up = time.time() + 30
            while not sync.session.sync_test():
                if time.time() > give_up:
                    raise RuntimeError("sync_test never finished")
                time.sleep(0.001)
        out["state"] = sync.state()
        out["stats"] = sync.stats()
        out["progress"] = sync.session.progress()
        out["value"] = model.w[3, 4].item()
        out["state_name"] = sync.state()[0].name
        del out["state"]
    out["after_close"] = sync.session.finalized
    return out


def _triggered(index, port):
    import torch
    from wsync import layouts
    from wsync.trainer import RolloutSync, TrainerSync
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(4, 8), requires_grad=False)
    if index == 0:
        with TrainerSync(model, layouts.hf_layout(model), 0, 1, f"127.0.0.1:{port}", SECRET,
                         num_rollouts=1, **COMMON) as sync:
            for version in (1, 2, 3):
                model.w.data.fill_(10 * version)
                sync.push(version)
        return None
    seen = []

    def before(version):
        seen.append(("before", version))

    def after(version, status):
        seen.append(("after", version, status.name, model.w[0, 0].item()))

    with RolloutSync(model, layouts.hf_layout(model), 0, 1, f"127.0.0.1:{port}", SECRET,
                     num_trainers=1, on_before=before, on_after=after, **COMMON) as sync:
        give_up = time.time() + 30
        while len([s for s in seen if s[0] == "after"]) < 3 and time.time() < give_up:
            time.sleep(0.01)
        state = sync.state()
    return {"seen": seen, "state": (state[0].name, state[1])}


def _rebound(index, port):
    """Version 1 lands in memory the rollout then moves (a fresh copy, as after an engine's
    sleep and wake-up): rebind_buffer and Layout.repoint, then version 2 must land in the new
    memory, and nothing of wsync's may still hold the old one."""
    import gc
    import mmap
    import weakref

    import torch
    from wsync import layouts
    from wsync.trainer import RolloutSync, TrainerSync
    memory = mmap.mmap(-1, 16 * 8 * 4)  # The old memory; released when no tensor holds it.
    old_memory = weakref.ref(memory)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.frombuffer(memory, dtype=torch.float32).view(16, 8),
                                 requires_grad=False)
    del memory
    side = TrainerSync if index == 0 else RolloutSync
    peers = {"num_rollouts": 1} if index == 0 else {"num_trainers": 1}
    sync = side(model, layouts.hf_layout(model), 0, 1, f"127.0.0.1:{port}", SECRET, **peers,
                **COMMON)
    out = {}
    with sync:
        for version in (1, 2):
            if index == 0:
                model.w.data.fill_(version)
            if index == 1 and version == 2:
                moved = model.w.data.clone()
                model.w.data = moved
                sync.session.rebind_buffer(0, moved.data_ptr(), keep=moved)
                sync.layout.repoint(0, moved)
                del moved
                gc.collect()
                out["old_memory_released"] = old_memory() is None
            sync.session.sync_begin(version)
            give_up = time.time() + 30
            while not sync.session.sync_test():
                if time.time() > give_up:
                    raise RuntimeError("sync_test never finished")
                time.sleep(0.001)
        out["values"] = sorted(set(model.w.flatten().tolist()))
    return out


class SessionTest(unittest.TestCase):
    def test_listening_ports(self):
        # In this process: init only (no job), so nothing but the exporter listens.
        import urllib.request
        import wsync
        with wsync.Session("trainer", job_id="python-ports", coordinator_port=1, secret=SECRET,
                           metrics_address="127.0.0.1:0", staging_budget_bytes=4096) as session:
            metrics_port, coordinator_port = session.listening_ports()
            self.assertGreater(metrics_port, 0)
            self.assertEqual(coordinator_port, 0)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
                self.assertIn("wsync_", r.read().decode())
        with self.assertRaises(wsync.WsyncError) as refused:
            wsync.Session("trainer", job_id="python-ports", coordinator_port=1, secret=SECRET,
                          staging_budget_bytes=-1)
        self.assertIn("staging_budget_bytes", str(refused.exception))

    def test_the_secret_reaches_init_without_a_file_and_the_variable_is_removed(self):
        # secret=: no file is written (one under /tmp outlived a SIGKILL): init works with file
        # creation made to fail. secret_env: the variable is gone from the environment after init.
        import builtins
        import tempfile
        import unittest.mock
        import wsync
        from wsync import _lib
        _lib.load()  # Loaded (and its table read) before files are refused.

        def refuse(*args, **kwargs):
            raise AssertionError("a file was written for the secret")
        with unittest.mock.patch.object(tempfile, "mkdtemp", refuse), \
                unittest.mock.patch.object(os, "open", refuse), \
                unittest.mock.patch.object(builtins, "open", refuse):
            wsync.Session("trainer", job_id="python-secret", coordinator_port=1,
                          secret=SECRET).finalize()
        os.environ["WSYNC_PY_TEST_SECRET"] = SECRET
        wsync.Session("trainer", job_id="python-secret", coordinator_port=1,
                      secret_env="WSYNC_PY_TEST_SECRET").finalize()
        self.assertNotIn("WSYNC_PY_TEST_SECRET", os.environ)
        with self.assertRaises(wsync.WsyncError) as wildcard:
            wsync.Session("trainer", job_id="python-secret", coordinator_port=1, secret=SECRET,
                          metrics_address="0.0.0.0:0")
        self.assertIn("wildcard", str(wildcard.exception))

    def test_the_delta_budget_reaches_init(self):
        import wsync
        # wsync_config_t.delta_budget_bytes: a negative budget is refused by name, one is taken.
        with self.assertRaises(wsync.WsyncError) as budget:
            wsync.Session("trainer", job_id="python-delta", coordinator_port=1, secret=SECRET,
                          delta="on", delta_budget_bytes=-1)
        self.assertIn("delta_budget_bytes", str(budget.exception))
        wsync.Session("trainer", job_id="python-delta", coordinator_port=1, secret=SECRET,
                      delta="on", delta_budget_bytes=1 << 20).finalize()

    def test_the_keywords_are_the_librarys_settings(self):
        # Issue 43: the keywords come from the loaded library's table (setting_count,
        # setting_info), whose rows name wsync_config_t's fields at the offsets this binding's
        # Config has; config_set parses each value as the setting's variable would be parsed.
        import ctypes
        import wsync
        from wsync import _lib
        rows = wsync.settings()
        self.assertIn("deadline_seconds", [row["name"] for row in rows])
        for row in rows:
            with self.subTest(setting=row["name"]):
                self.assertEqual(getattr(_lib.Config, row["name"]).offset, row["offset"])
                self.assertIn(row["type"], ("bool", "port", "bytes", "seconds", "choice", "text",
                                            "secret"))
                if row["variable"]:
                    self.assertEqual(row["variable"], "WSYNC_" + row["name"].upper())
        by_name = {row["name"]: row for row in rows}
        self.assertEqual(by_name["verify"]["choices"], ("off", "hash", "keyed"))
        self.assertEqual(float(by_name["deadline_seconds"]["default"]), 60)
        with self.assertRaises(TypeError) as unknown:
            wsync.Session("trainer", job_id="python-kw", coordinator_port=1, secret=SECRET,
                          deadline_secs=5)
        self.assertIn("deadline_secs", str(unknown.exception))
        self.assertIn("deadline_seconds", str(unknown.exception))
        with self.assertRaises(wsync.WsyncError) as refused:
            wsync.Session("trainer", job_id="python-kw", coordinator_port=1, secret=SECRET,
                          verify="sometimes")
        self.assertEqual(refused.exception.code, wsync.Status.INVALID_ARGUMENT)
        self.assertIn("verify", str(refused.exception))
        # A keyword left out is unset: the variable applies (here one that does not parse, which
        # init refuses naming it); given, the keyword wins over the variable.
        os.environ["WSYNC_REPLICA_POLICY"] = "no_such_policy"
        try:
            self.assertEqual(_lib.setting_value("replica_policy"), "no_such_policy")
            with self.assertRaises(wsync.WsyncError) as from_variable:
                wsync.Session("trainer", job_id="python-kw", coordinator_port=1, secret=SECRET)
            self.assertIn("no_such_policy", str(from_variable.exception))
            wsync.Session("trainer", job_id="python-kw", coordinator_port=1, secret=SECRET,
                          replica_policy="first_holder").finalize()
        finally:
            del os.environ["WSYNC_REPLICA_POLICY"]

    def test_entries_past_the_loaded_table_are_refused(self):
        # The table's ELF symbol size is its length: the whole v1 table of this build. A library
        # whose table ends before an appended entry (played by shrinking the recorded size) is
        # refused by name instead of jumping past its table.
        import ctypes
        import wsync
        from wsync import _lib
        api = _lib.load()
        self.assertGreaterEqual(api._size, ctypes.sizeof(_lib.PluginV1))  # ASan: a redzone more.
        with wsync.Session("trainer", job_id="python-table", coordinator_port=1,
                           secret=SECRET) as session:
            session.progress()
            recorded = api._size
            try:
                for entry in ("progress", "rebind_buffer", "declare_fp8_parameter"):
                    api._size = getattr(_lib.PluginV1, entry).offset
                    with self.assertRaises(wsync.WsyncError) as refused:
                        _lib.require(entry)
                    self.assertEqual(refused.exception.code, wsync.Status.UNSUPPORTED)
                    self.assertIn(f"predates {entry}", str(refused.exception))
                api._size = _lib.PluginV1.progress.offset
                with self.assertRaises(wsync.WsyncError) as refused:
                    session.progress()
                self.assertIn("predates progress", str(refused.exception))
            finally:
                api._size = recorded
            session.progress()

    def test_polled(self):
        port, = free_ports(1)
        results = run_processes(_polled, 2, (port,), timeout=90)
        self.assertEqual([s for s, _ in results], ["ok", "ok"], results)
        trainer, rollout = results[0][1], results[1][1]
        self.assertEqual(trainer["schedule"]["role"], "trainer")
        self.assertEqual(trainer["schedule"]["sent_bytes"], 16 * 8 * 4)
        self.assertEqual(rollout["schedule"]["received_bytes"], 16 * 8 * 4)
        self.assertEqual(trainer["schedule"]["peers"][0]["direction"], "to")
        self.assertEqual(rollout["value"], 2.0)
        self.assertEqual(rollout["stats"]["version"], 2)
        # verify=True passes through to the plugin: the rollout checked the chunk's hash.
        self.assertEqual(rollout["stats"]["verified_chunks"], 1)
        self.assertEqual(trainer["stats"]["verified_chunks"], 0)
        self.assertEqual(rollout["state_name"], "IDLE")
        self.assertTrue(rollout["after_close"])
        # After version 2 committed: idle, committed at 2, all of its rounds and bytes done.
        for side in (trainer, rollout):
            progress = side["progress"]
            self.assertEqual(progress["phase"], "idle")
            self.assertEqual(progress["version"], 2)
            self.assertEqual(progress["committed_version"], 2)
            self.assertEqual(progress["bytes_total"], 16 * 8 * 4)
            self.assertEqual(progress["bytes_done"], progress["bytes_total"])
            self.assertEqual(progress["rounds_done"], progress["rounds_total"])
            self.assertEqual(progress["rounds_total"], side["stats"]["rounds"])

    def test_rebind_lets_go_of_the_old_memory(self):
        port, = free_ports(1)
        results = run_processes(_rebound, 2, (port,), timeout=90)
        self.assertEqual([s for s, _ in results], ["ok", "ok"], results)
        rollout = results[1][1]
        self.assertTrue(rollout["old_memory_released"])
        self.assertEqual(rollout["values"], [2.0])  # Version 2 landed in the new memory.

    def test_trainer_triggered_callbacks(self):
        port, = free_ports(1)
        results = run_processes(_triggered, 2, (port,), timeout=90)
        self.assertEqual([s for s, _ in results], ["ok", "ok"], results)
        rollout = results[1][1]
        self.assertEqual(rollout["seen"], [
            ("before", 1), ("after", 1, "OK", 10.0),
            ("before", 2), ("after", 2, "OK", 20.0),
            ("before", 3), ("after", 3, "OK", 30.0)])
        self.assertEqual(rollout["state"], ("IDLE", 3))


class _FakeSession:
    """Session.progress() of a sync in its transferring phase, a round further each call."""

    def __init__(self):
        self.calls = 0

    def progress(self):
        self.calls += 1
        return {"version": 3, "phase": "transferring", "rounds_done": min(self.calls, 4),
                "rounds_total": 4, "bytes_done": 1 << 20, "bytes_total": 4 << 20,
                "committed_version": 2}


class _Terminal(io.StringIO):
    def isatty(self):
        return True


class ProgressLineTest(unittest.TestCase):
    def test_shown_for_a_long_sync(self):
        from wsync.progress import ProgressLine
        stream = _Terminal()
        with ProgressLine(_FakeSession(), "push", show=True, stream=stream, after=0.05,
                          interval=0.01):
            time.sleep(0.3)
        text = stream.getvalue()
        self.assertIn("push version 3: transferring, round 1/4, 1.0/4.0 MiB", text)
        self.assertIn("round 4/4", text)
        self.assertTrue(text.endswith("\n"), text)

    def test_not_shown_for_a_short_sync(self):
        from wsync.progress import ProgressLine
        stream = _Terminal()
        session = _FakeSession()
        with ProgressLine(session, "pull", show=True, stream=stream, after=5):
            time.sleep(0.05)
        self.assertEqual(stream.getvalue(), "")
        self.assertEqual(session.calls, 0)

    def test_off_without_a_terminal_or_when_asked(self):
        from wsync.progress import ProgressLine, wanted
        self.assertFalse(wanted(None, io.StringIO()))
        self.assertTrue(wanted(None, _Terminal()))
        self.assertFalse(wanted(False, _Terminal()))
        os.environ["WSYNC_PROGRESS"] = "0"
        try:
            self.assertFalse(wanted(None, _Terminal()))
            self.assertTrue(wanted(True, io.StringIO()))
        finally:
            del os.environ["WSYNC_PROGRESS"]
        stream = io.StringIO()
        with ProgressLine(_FakeSession(), "push", stream=stream, after=0.01, interval=0.01):
            time.sleep(0.1)
        self.assertEqual(stream.getvalue(), "")


if __name__ == "__main__":
    unittest.main()
