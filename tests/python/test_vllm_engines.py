"""wsync's vLLM engines on both sides, driven by vLLM's own call sequence (vLLM cannot be installed
here; `vllm_standin/` and `vllm_calls.py` reproduce its classes and calls, citing the upstream
paths: vllm/distributed/weight_transfer/{base,factory}.py per generation (the 0.33 releases and
main), m2n_trainer.py @ 1ca6ac9f, clients.py @ 81ea9e9d, vllm/v1/worker/gpu_worker.py: the
worker's RPCs one at a time, a failed update only clearing the update flag).

One job, 4 processes: 2 trainer ranks (Megatron TP2 of a small qwen2.5) each run
`WeightTransferTrainerFactory.trainer_init(WsyncTrainerInitInfo(rank=...), client=...,
source=ModuleSource(model))` and `send_weights()` per step, with no other wsync call; 2 vLLM
workers (TP2) built by `WeightTransferEngineFactory.create_engine` serve the RLHF routes the
trainer's client posts to (init, start, update, finish naming the version, which vLLM then reports
as the served weights' version). Versions 1, 2 and 4 commit: after each,
every element of every rollout tensor equals the worker's shard of the trainer's logical tensor
(test code's own oracle), padding rows untouched, parameters at their addresses. Version 3 is
aborted mid-sync by wsync's abort on worker 0 (while trainer rank 1 is late): both workers' weights
are marked dirty and their engines say so (finish refuses: "do not serve"), every trainer rank's
send_weights raises within the deadline, and version 4 then commits (worker 0's session replaced
in place, the rest of the job untouched). That first job runs vLLM main's stand-in (a no-op abort
on the base class, which no vLLM worker calls: the abort is wsync's engine's, called from a
second thread of worker 0's process, since vLLM's serialized RPCs cannot deliver one while
update_weights runs). A second job runs vLLM 0.33 as released ($VLLM_STANDIN_VERSION=0.33.0: no
abort method anywhere, a failed update_weights only ends vLLM's update) through versions 1-3,
version 2 interrupted by trainer rank 1 coming past the deadline: the same
outcome (dirty, finish refused, every send raising) with no abort called, then the next start
succeeds and version 3 commits."""

import os
import sys
import time
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_standin")
sys.path.insert(0, HERE)
from harness import free_ports, role_reports, run_processes  # noqa: E402

SECRET = "python-vllm-engines-secret-0123456789"
TP = 2
PAD = 7.0
# Two jobs. "abort": vLLM main's stand-in; version 3 is aborted on worker 0 (wsync's abort, from
# a thread of the worker process) while trainer rank 1 is LATE seconds late. "release": vLLM
# 0.33's stand-in (no abort method anywhere, serialized RPCs), version 2 interrupted: trainer
# rank 1 comes after the deadline, so every process fails it at the deadline, and nothing calls
# an abort.
SCENARIOS = {
    "abort": dict(versions=(1, 2, 3, 4), failed=3, late=1.5, deadline=10.0, abort=True,
                  vllm="0.33.1.dev42+g1a2b3c"),
    "release": dict(versions=(1, 2, 3), failed=2, late=4.5, deadline=3.0, abort=False,
                    vllm="0.33.0"),
}


def _hf_config():
    import tiny_qwen as tq
    c = tq.CONFIG
    return {"num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
            "hidden_size": c["hidden"], "head_dim": c["head_dim"], "vocab_size": c["vocab"]}


def _seed(version):
    return 100 + version


def _trainer(scenario, rank, coordinator, urls):
    import tiny_qwen as tq
    import vllm_calls
    from vllm.distributed.weight_transfer.base import ModuleSource
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from wsync.vllm_trainer import WsyncTrainerInitInfo

    model = tq.MegatronTiny(rank, TP, None)
    tq.load_local(model, tq.megatron_shard(tq.random_logical(0), rank, TP))
    client = vllm_calls.FanOutHTTPClient(urls) if rank == 0 else vllm_calls.NoCallsClient()
    if rank == 0:
        client.wait_ready()  # The servers are up (GET /health), as an RL script waits for vLLM.
    info = WsyncTrainerInitInfo(coordinator=coordinator, num_trainers=TP, num_rollouts=TP,
                                job_id="python-vllm-engines", layout="megatron",
                                hf_config=_hf_config(), tp_rank=rank, tp_size=TP,
                                deadline_seconds=scenario["deadline"], path_transports="*=ucx:sm,cma,self",
                                rank=rank)
    engine = WeightTransferTrainerFactory.trainer_init(info, client=client,
                                                       source=ModuleSource(model))
    report = {"type": type(engine).__name__, "sent_bytes": engine.schedule()["sent_bytes"],
              "rounds": []}
    for version in scenario["versions"]:
        # The "optimizer step": this rank's shard of the next logical weights, in place.
        tq.load_local(model, tq.megatron_shard(tq.random_logical(_seed(version)), rank, TP))
        if version == scenario["failed"] and rank == 1:
            time.sleep(scenario["late"])
        started = time.time()
        try:
            engine.send_weights()
            outcome = None
        except Exception as error:  # noqa: BLE001
            outcome = f"{type(error).__name__}: {error}"
        report["rounds"].append({"version": engine.version, "error": outcome,
                                 "seconds": time.time() - started,
                                 "committed": engine.committed})
    if rank == 0:
        report["calls"] = list(client.calls)
        client.shutdown_servers()
    engine.shutdown()
    return report


def _rollout(scenario, rank, port):
    import threading

    import torch
    from vllm.distributed.weight_transfer import base

    import tiny_qwen as tq
    import vllm_calls

    model = tq.VllmTiny(rank, TP, None)
    tq.load_local(model, tq.vllm_shard(tq.random_logical(1), rank, TP, pad_value=PAD))
    addresses = {n: p.data_ptr() for n, p in model.named_parameters()}
    vllm_config = types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=TP, rank=rank, world_size=TP,
                                              data_parallel_index=0),
        model_config=types.SimpleNamespace(hf_config=_hf_config()))
    events = []

    class CheckedWorker(vllm_calls.Worker):
        def update_weights(self, update_info):
            engine = self.weight_transfer_engine
            version = update_info["version"]
            if version == scenario["failed"] and rank == 0 and scenario["abort"]:
                def abort_mid_sync():  # wsync's abort of the active update, from another thread.
                    deadline = time.time() + scenario["deadline"]
                    while not engine.sync_in_flight and time.time() < deadline:
                        time.sleep(0.01)
                    time.sleep(0.3)
                    events.append({"abort_while_syncing": engine.sync_in_flight})
                    engine.abort_weight_update()
                threading.Thread(target=abort_mid_sync, daemon=True).start()
            try:
                super().update_weights(update_info)
            except Exception as error:
                refused = vllm_calls.finish_refusal(engine)
                events.append({"version": version, "error": f"{type(error).__name__}: {error}",
                               "dirty": engine.weights_dirty, "finish_refused": refused,
                               "active": self._weight_update_active})
                raise

        def finish_weight_update(self):
            super().finish_weight_update()
            engine = self.weight_transfer_engine
            want = tq.vllm_shard(tq.random_logical(_seed(engine.version)), rank, TP,
                                 pad_value=PAD)
            params = dict(model.named_parameters())
            events.append({"version": engine.version, "dirty": engine.weights_dirty,
                           "wrong": [n for n, t in want.items() if not torch.equal(params[n], t)],
                           "checked": sum(t.numel() for t in want.values()),
                           "in_place": all(p.data_ptr() == addresses[n]
                                           for n, p in model.named_parameters())})

    worker = CheckedWorker(vllm_calls.WeightTransferConfig(backend="wsync"), vllm_config,
                           torch.device("cpu"), model)
    engine, aborts = worker.weight_transfer_engine, []
    abort = engine.abort_weight_update

    def counted_abort():  # Who calls wsync's abort, if anyone.
        aborts.append(time.time())
        abort()
    engine.abort_weight_update = counted_abort
    server, stopped = vllm_calls.serve(worker, port)
    try:
        stopped.wait(90)
    finally:
        server.shutdown()
        worker.shutdown()
    return {"type": type(worker.weight_transfer_engine).__name__, "events": events,
            "served_versions": worker.served_versions, "abort_calls": len(aborts),
            "vllm_has_abort": hasattr(base.WeightTransferEngine, "abort_weight_update")}


def _process(index, ports, name):
    import functools

    import vllm_calls
    scenario = SCENARIOS[name]
    os.environ["VLLM_STANDIN_VERSION"] = scenario["vllm"]  # Before vLLM's import.
    return vllm_calls.job_process(index, ports, TP, SECRET, STANDIN,
                                  functools.partial(_trainer, scenario),
                                  functools.partial(_rollout, scenario))


class VllmEnginesTest(unittest.TestCase):
    """The "abort" job."""
    scenario = "abort"

    @classmethod
    def setUpClass(cls):
        s = SCENARIOS[cls.scenario]
        cls.versions, cls.failed, cls.deadline = s["versions"], s["failed"], s["deadline"]
        cls.results = run_processes(_process, 2 * TP, (free_ports(1 + TP), cls.scenario),
                                    timeout=120)

    def _reports(self, role):
        return role_reports(self, self.results, TP, role)

    def test_engines_are_the_registered_backends(self):
        for report in self._reports("trainer"):
            self.assertEqual(report["type"], "WsyncTrainerWeightTransferEngine")
            self.assertGreater(report["sent_bytes"], 0)  # Every rank sends its own shards.
        for report in self._reports("rollout"):
            self.assertEqual(report["type"], "WsyncWeightTransferEngine")

    def test_every_element_after_each_committed_sync(self):
        for rank, report in enumerate(self._reports("rollout")):
            done = [e for e in report["events"] if "wrong" in e]
            self.assertEqual([e["version"] for e in done], [v for v in self.versions if v != self.failed])
            for event in done:
                self.assertEqual(event["wrong"], [], f"rollout {rank}: {event}")
                self.assertGreater(event["checked"], 0)
                self.assertFalse(event["dirty"], event)
                self.assertTrue(event["in_place"], event)

    def test_finish_names_the_committed_version(self):
        """vLLM reports the version finish_weight_update names ("default" without one)."""
        for rank, report in enumerate(self._reports("rollout")):
            self.assertEqual(report["served_versions"],
                             [str(v) for v in self.versions if v != self.failed], f"rollout {rank}")

    def test_rank0_drives_the_workers_in_vllm_order(self):
        calls = self._reports("trainer")[0]["calls"]
        round_ = ["start_weight_update", "update_weights", "finish_weight_update"]
        aborted = ["start_weight_update", "update_weights"]  # No finish after a failure.
        expected = ["init_weight_transfer_engine"]
        for version in self.versions:
            expected += aborted if version == self.failed else round_
        self.assertEqual(calls, expected)

    def test_failed_round_marks_dirty_and_ends_every_send(self):
        for rank, report in enumerate(self._reports("rollout")):
            failed = [e for e in report["events"] if "error" in e]
            self.assertEqual(len(failed), 1, report["events"])
            event = failed[0]
            self.assertEqual(event["version"], self.failed)
            self.assertTrue(event["dirty"], event)  # Marked dirty...
            self.assertIn("do not serve", event["finish_refused"] or "")  # ...and the engine says so.
            self.assertFalse(event["active"])  # vLLM's worker ended the update.
        for rank, report in enumerate(self._reports("trainer")):
            rounds = {r["version"]: r for r in report["rounds"]}
            self.assertEqual(sorted(rounds), list(self.versions))
            self.assertIsNotNone(rounds[self.failed]["error"], f"trainer {rank}")
            self.assertLess(rounds[self.failed]["seconds"],
                            self.deadline + SCENARIOS[self.scenario]["late"] + 5, f"trainer {rank}")
            for version in self.versions:
                if version != self.failed:
                    self.assertIsNone(rounds[version]["error"], f"trainer {rank} v{version}")
            self.assertEqual(rounds[self.versions[-1]]["committed"], self.versions[-1])

    def test_the_abort(self):
        """wsync's abort on worker 0 while its sync runs, on vLLM main (whose base class has a
        no-op abort_weight_update: wsync's engine overrides it)."""
        self.assertIn({"abort_while_syncing": True}, self._reports("rollout")[0]["events"])
        self.assertTrue(all(r["vllm_has_abort"] for r in self._reports("rollout")))
        self.assertEqual([r["abort_calls"] for r in self._reports("rollout")], [1, 0])


class VllmReleaseWithoutAbortTest(VllmEnginesTest):
    """The "release" job: vLLM as released (no abort method; a failed update_weights only ends
    the update), version 2 interrupted (a trainer rank past the deadline): both workers dirty
    and refusing finish, every send raising, and the next start succeeds and version 3 commits,
    every element checked, with no abort called by anyone."""
    scenario = "release"

    def test_the_abort(self):
        for report in self._reports("rollout"):
            self.assertFalse(report["vllm_has_abort"])
            self.assertEqual(report["abort_calls"], 0)

if __name__ == "__main__":
    unittest.main()
