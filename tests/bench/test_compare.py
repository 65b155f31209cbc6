"""`wsync-bench compare` in its quick mode, and the broadcast contestant's own checks.

Run by ctest with Debian's /usr/bin/python3 (python3-torch); WSYNC_BENCH names the built
`wsync-bench` binary (wsync and wsync_test_worker must be built in the same tree, as `make build`
does: wsync-bench finds them there).
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from harness import free_ports  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "integration", "bench")
CONTESTANTS = ["wsync-shm", "wsync-tcp", "per-param", "bucketed"]
LIMITS = ["perftest-shm", "perftest-tcp", "memcpy"]


def free_port():
    port, = free_ports(1)
    return port


# A 4x6 parameter split by rows over two trainers and by columns over two rollouts (strided
# pieces, as tensor parallelism cuts a row-parallel weight), and a 5-element one that only
# rollout 0 keeps, at an offset of a second buffer.
TOY_SPEC = {
    "model": "toy", "element_bytes": 2,
    "params": [{"name": "a", "shape": [4, 6]}, {"name": "b", "shape": [5]}],
    "trainers": [
        {"buffers": [{"id": 0, "bytes": 40}],
         "pieces": [{"param": 0, "buffer": 0, "origin": [0, 0], "extent": [2, 6], "offset": 0,
                     "strides": [6, 1]},
                    {"param": 1, "buffer": 0, "origin": [0], "extent": [5], "offset": 12,
                     "strides": [1]}]},
        {"buffers": [{"id": 0, "bytes": 34}],
         "pieces": [{"param": 0, "buffer": 0, "origin": [2, 0], "extent": [2, 6], "offset": 0,
                     "strides": [6, 1]},
                    {"param": 1, "buffer": 0, "origin": [0], "extent": [5], "offset": 12,
                     "strides": [1]}]}],
    "rollouts": [
        {"buffers": [{"id": 7, "bytes": 24}, {"id": 8, "bytes": 16}],
         "pieces": [{"param": 0, "buffer": 7, "origin": [0, 0], "extent": [4, 3], "offset": 0,
                     "strides": [3, 1]},
                    {"param": 1, "buffer": 8, "origin": [0], "extent": [5], "offset": 3,
                     "strides": [1]}]},
        {"buffers": [{"id": 7, "bytes": 24}],
         "pieces": [{"param": 0, "buffer": 7, "origin": [0, 3], "extent": [4, 3], "offset": 0,
                     "strides": [3, 1]}]}],
}


class BroadcastSyncTest(unittest.TestCase):
    """broadcast_sync.py itself: buckets split as stated, and a wrong element fails a rollout."""

    def run_job(self, extra):
        with tempfile.TemporaryDirectory() as tmp:
            spec = os.path.join(tmp, "spec.json")
            with open(spec, "w") as f:
                json.dump(TOY_SPEC, f)
            port = free_port()
            env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            procs = [subprocess.Popen(
                [sys.executable, os.path.join(SCRIPTS, "broadcast_sync.py"), "--spec", spec,
                 "--rank", str(rank), "--master_port", str(port), "--warmup", "1", "--syncs",
                 "2", "--timeout_s", "60"] + extra,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for rank in range(4)]
            results = []
            for p in procs:
                out, err = p.communicate(timeout=120)
                results.append((p.returncode, out, err))
            return results

    def test_buckets_move_every_element(self):
        # 30-byte buckets: parameter a (48 bytes) is a bucket of its own, then b (10 bytes).
        results = self.run_job(["--mode", "bucket", "--bucket_bytes", "30"])
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, err)
            self.assertEqual(out.count("SYNC "), 2, out)
            if rank >= 2:
                self.assertEqual(out.count("VERIFIED "), 3, out)
        self.assertIn("BUCKETS count=2 largest_bytes=48", results[0][1])
        self.assertIn("elements=17", results[2][1])  # 12 of a and 5 of b.
        self.assertIn("elements=12", results[3][1])

    def test_a_wrong_element_fails_the_rollout(self):
        results = self.run_job(["--mode", "param", "--flip_after_sync", "1"])
        code, out, err = results[3]
        self.assertEqual(code, 1)
        self.assertIn("rollout rank 1: a[0:4, 3:6) holds a wrong value at box index [0, 0]", err)
        self.assertNotIn("VERIFIED", out)


@unittest.skipUnless(os.environ.get("WSYNC_BENCH"),
                     "WSYNC_BENCH (the wsync-bench binary) is not set")
class CompareQuickTest(unittest.TestCase):
    """The whole benchmark on a tiny model: every contestant runs, is verified and is timed."""

    def test_quick_mode(self):
        plot = importlib.util.find_spec("matplotlib") is not None
        if not plot:
            print("python3-matplotlib is not installed: compare.png is not checked",
                  file=sys.stderr)
        with tempfile.TemporaryDirectory() as out:
            command = [os.environ["WSYNC_BENCH"], "compare", "--model", "qwen2.5-tiny",
                       "--from", "fsdp(2)", "--to", "vllm(tp=1,dp=2)", "--repeats", "1",
                       "--compare_syncs", "1", "--out", out,
                       "--compare_plot=%s" % ("true" if plot else "false")]
            run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=150)
            self.assertEqual(run.returncode, 0, run.stdout)
            self.assertIn("gloo", run.stdout)
            with open(os.path.join(out, "compare.json")) as f:
                report = json.load(f)
            if plot:
                with open(os.path.join(out, "compare.png"), "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertIn("wsync-bench compare", report["command"])
        self.assertEqual(len(report["scenarios"]), 1)
        scenario = report["scenarios"][0]
        self.assertEqual((scenario["from"], scenario["to"]), ("fsdp(2)", "vllm(tp=1,dp=2)"))
        self.assertEqual((scenario["trainers"], scenario["rollouts"]), (2, 2))
        self.assertGreater(scenario["rollout_bytes"], 0)
        results = {r["id"]: r for r in scenario["results"]}
        self.assertEqual(sorted(results), sorted(CONTESTANTS + LIMITS))
        for name in CONTESTANTS:
            r = results[name]
            self.assertFalse(r["limit"], name)
            self.assertTrue(r["verified"], name)
            self.assertEqual(len(r["seconds"]), 1, name)
            self.assertGreater(r["seconds_median"], 0, name)
            self.assertGreater(r["gbps_per_rollout"], 0, name)
            self.assertGreater(r["fraction_of_link"], 0, name)
            self.assertEqual(sorted(r["speedup"]), sorted(CONTESTANTS), name)
            self.assertTrue(all(x > 0 for x in r["speedup"].values()), name)
            self.assertEqual(sorted(r["peak_rss_bytes"]),
                             ["rollout 0", "rollout 1", "trainer 0", "trainer 1"], name)
            self.assertTrue(all(b > 0 for b in r["peak_rss_bytes"].values()), name)
        for name in LIMITS:
            self.assertTrue(results[name]["limit"], name)
            self.assertGreater(results[name]["gbps_per_rollout"], 0, name)
        self.assertTrue(results["memcpy"]["verified"])


if __name__ == "__main__":
    unittest.main()
