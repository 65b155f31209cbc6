"""wsync.route_to_logging: the library's trace (the C ABI's set_log) in Python logging. A
1-trainer, 1-rollout job syncs twice; each process routes wsync's lines into a logger of its own
with a handler that keeps the records: the first sync's connect, plan, round and commit lines
arrive on the loggers wsync.<category> at INFO; after stop_routing the second sync adds none. An
unknown category is refused by name."""

import logging
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import free_ports, run_processes  # noqa: E402

SECRET = "python-log-secret-0123456789abcdef0123"
COMMON = dict(deadline_seconds=20, path_transports="*=ucx:sm,cma,self", job_id="python-log",
              staging_budget_bytes=4096)


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.name, record.levelname, record.getMessage()))


def _job(index, port):
    import torch
    import wsync
    from wsync import layouts
    from wsync.trainer import RolloutSync, TrainerSync
    os.environ.pop("WSYNC_LOG", None)
    os.environ.pop("WSYNC_LOG_LEVEL", None)
    logger = logging.getLogger("engine.wsync")
    logger.setLevel(logging.INFO)
    keep = _Keep()
    logger.addHandler(keep)
    wsync.route_to_logging(logger)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(16, 64), requires_grad=False)
    side = TrainerSync if index == 0 else RolloutSync
    peers = {"num_rollouts": 1} if index == 0 else {"num_trainers": 1}
    with side(model, layouts.hf_layout(model), 0, 1, f"127.0.0.1:{port}", SECRET, **peers,
              **COMMON) as sync:
        if index == 0:
            model.w.data.fill_(1)
        sync.session.sync(1)
        first = list(keep.records)
        wsync.stop_routing()
        sync.session.sync(2)
    out = {"first": first, "after_stop": len(keep.records) - len(first)}
    try:
        wsync.route_to_logging(logger, categories="round,nonsense")
    except wsync.WsyncError as error:
        out["refused"] = (error.code.name, error.message)
    return out


class LogTest(unittest.TestCase):
    def test_lines_arrive_in_python_logging(self):
        port = free_ports(1)[0]
        results = run_processes(_job, 2, (port,))
        for index, (status, value) in enumerate(results):
            self.assertEqual(status, "ok", f"process {index}: {value}")
            records = value["first"]
            names = {name for name, _, _ in records}
            for category in ("connect", "plan", "round", "sync"):
                self.assertIn(f"engine.wsync.{category}", names, records)
            self.assertTrue(all(level in ("INFO", "WARNING", "ERROR") for _, level, _ in records))
            messages = [message for _, _, message in records]
            self.assertTrue(any("joined job python-log" in m for m in messages), messages)
            # 16 x 64 fp32 = 4 KiB per row block: at least one round at a 4096-byte budget.
            self.assertTrue(any("sync 1 round 1/" in m for m in messages), messages)
            self.assertTrue(any("sync 1 committed" in m for m in messages), messages)
            self.assertEqual(value["after_stop"], 0)
            self.assertEqual(value["refused"][0], "INVALID_ARGUMENT")
            self.assertIn("'nonsense'", value["refused"][1])


if __name__ == "__main__":
    unittest.main()
