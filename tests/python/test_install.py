"""Installing the package as a deployment would: `pip install integration/python` (Debian's
setuptools, offline: --no-build-isolation --no-index) into a fresh venv (--system-site-packages,
for Debian's torch) gives a wsync package with libwsync.so inside, which loads with no
WSYNC_LIBRARY. Through that install, one trainer pushes version 1 of tiny_qwen (Megatron TP 1) to
one rollout (vLLM-named TP 1): every element of every rollout tensor equals the trainer's logical
tensor (tiny_qwen's oracle), and the rollout's weights differed before the push.

The library installed is the one ctest names in WSYNC_LIBRARY (setup.py's
$WSYNC_PREBUILT_LIBRARY; without it setup.py takes build/plugin/libwsync.so or builds it with
CMake); the package is installed from a copy of integration/python, so that setuptools' build
files stay out of the source tree. Neither the venv's processes nor pip get WSYNC_LIBRARY or
PYTHONPATH, and they run outside the source tree."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import free_ports  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PACKAGE = os.path.join(ROOT, "integration", "python")
SECRET = "python-install-secret-0123456789abcdef"

# Run by the venv's python: imports the installed wsync, tiny_qwen from tests/python.
SIDE = r'''
import json, os, sys
sys.path.append(sys.argv[3])
import torch
import tiny_qwen as tq
import wsync
from wsync import _lib, layouts
from wsync.trainer import RolloutSync, TrainerSync

role, port = sys.argv[1], int(sys.argv[2])
c = tq.CONFIG
config = layouts.ModelConfig(c["heads"], c["kv_heads"], c["head_dim"], c["vocab"])
common = dict(job_id="install", deadline_seconds=30, path_transports="*=ucx:sm,cma,self")
out = {"package": os.path.dirname(wsync.__file__)}
logical = tq.random_logical(41)
if role == "trainer":
    model = tq.MegatronTiny(0, 1, None)
    tq.load_local(model, tq.megatron_shard(logical, 0, 1))
    with TrainerSync(model, lambda m: layouts.megatron_layout(m, 0, 1, config), 0, 1,
                     f"127.0.0.1:{port}", sys.argv[4], num_rollouts=1, **common) as sync:
        sync.push(1)
else:
    model = tq.VllmTiny(0, 1, None)
    want = tq.vllm_shard(logical, 0, 1)
    params = dict(model.named_parameters())
    rows = min(want["model.embed_tokens.weight"].shape[0], c["vocab"])
    def wrong():
        return [n for n, t in want.items()
                if not torch.equal(params[n][:rows] if "embed" in n else params[n],
                                   t[:rows] if "embed" in n else t)]
    out["wrong_before"] = len(wrong())
    with RolloutSync(model, lambda m: layouts.vllm_layout(m, 0, 1, config), 0, 1,
                     f"127.0.0.1:{port}", sys.argv[4], num_trainers=1, **common) as sync:
        sync.pull(1)
    out["wrong"] = wrong()
    out["elements"] = sum(t.numel() for t in want.values())
out["library"] = _lib.library_path()
print(json.dumps(out))
'''


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("WSYNC_LIBRARY", "PYTHONPATH")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **extra)
    return env


class InstallTest(unittest.TestCase):
    def setUp(self):
        self.library = os.environ.get("WSYNC_LIBRARY") or os.path.join(
            ROOT, "build", "plugin", "libwsync.so")
        self.assertTrue(os.path.isfile(self.library), self.library)
        self.tmp = tempfile.mkdtemp(prefix="wsync-install-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def _run(self, *args, **kwargs):
        done = subprocess.run(args, cwd=self.tmp, capture_output=True, text=True, timeout=120,
                              **kwargs)
        self.assertEqual(done.returncode, 0, f"{args}: {done.stdout}\n{done.stderr}")
        return done.stdout

    def test_pip_install_into_a_venv_syncs_without_wsync_library(self):
        source = os.path.join(self.tmp, "src")
        shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "__pycache__", "libwsync.so"))
        venv = os.path.join(self.tmp, "venv")
        self._run("/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip",
                  venv)
        python = os.path.join(venv, "bin", "python")
        self._run(python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                  "--no-deps", source, env=_clean_env(WSYNC_PREBUILT_LIBRARY=self.library))
        script = os.path.join(self.tmp, "side.py")
        with open(script, "w") as f:
            f.write(SIDE)
        port, = free_ports(1)
        sides = [subprocess.Popen([python, script, role, str(port), HERE, SECRET], cwd=self.tmp,
                                  env=_clean_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for role in ("trainer", "rollout")]
        outs = []
        for side in sides:
            try:
                stdout, stderr = side.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                for other in sides:
                    other.kill()
                raise
            self.assertEqual(side.returncode, 0, stderr)
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
        site = os.path.realpath(venv)
        for out in outs:
            self.assertTrue(os.path.realpath(out["package"]).startswith(site), out)
            self.assertEqual(out["library"], os.path.join(out["package"], "libwsync.so"))
        rollout = outs[1]
        self.assertGreater(rollout["wrong_before"], 0)  # The push has something to change.
        self.assertEqual(rollout["wrong"], [])
        self.assertGreater(rollout["elements"], 0)


if __name__ == "__main__":
    unittest.main()
