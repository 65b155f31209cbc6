"""wsync.Session call for call: the polled mode (sync_begin / sync_test) and the
trainer-triggered mode, where the rollout's Python callbacks run on the plugin's background
thread around each push; TrainerSync.schedule() as a dict; stats and state."""

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


if __name__ == "__main__":
    unittest.main()
