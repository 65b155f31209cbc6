"""The oracle: the C++ named layouts (planner/named_layouts, dumped as JSON by
named_layout_dump) and the Python rules (wsync.layouts over the families' module trees) describe
the same sharding, written independently. For every family and a grid of vLLM (tp, ep, dp),
both must list the same parameters (name, dtype, shape) and, per process, the same pieces (box,
offset, strides) in the same grouping into buffers, vLLM's uneven expert split included. Where
the C++ layout refuses a configuration the engine runs (more EP ranks than experts), the Python
layout must still cover every element (test_families_layouts) and this test names the gap.

WSYNC_NAMED_LAYOUT_DUMP is the tool's path (ctest sets it); without it the tests are skipped."""

import collections
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402,F401  (sets sys.path)
import torch  # noqa: E402

import families as fam  # noqa: E402
from test_families_layouts import rollout_layouts  # noqa: E402
from wsync.session import dtype_name  # noqa: E402

DUMP = os.environ.get("WSYNC_NAMED_LAYOUT_DUMP", "")


def cpp_layout(model, spec):
    """(params [(name, dtype, shape)], {process: pieces}) or the refusal's message."""
    run = subprocess.run([DUMP, model, spec], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        return run.stderr.strip()
    data = json.loads(run.stdout)
    params = [(p["name"], p["dtype"], tuple(p["shape"])) for p in data["params"]]
    by_process = collections.defaultdict(list)
    for p in data["pieces"]:
        by_process[p["process"]].append((params[p["param"]][0], p["buffer"], tuple(p["origin"]),
                                         tuple(p["extent"]), p["offset"], tuple(p["strides"])))
    return params, [by_process[i] for i in range(data["processes"])]


def python_layout(sides):
    params = {}
    processes = []
    for layout in sides:
        params.update({n: (n, dtype_name(p.dtype), tuple(p.shape))
                       for n, p in layout.params.items()})
        _, ids = layout.buffers()
        processes.append([(p.param, ids[p.view.storage().data_ptr()], tuple(p.origin),
                           tuple(p.extent), p.offset, tuple(p.strides)) for p in layout.pieces])
    return list(params.values()), processes


def canonical(pieces):
    """Pieces without buffer ids, and the grouping of pieces into buffers."""
    flat = sorted((n, o, e, off, s) for n, _, o, e, off, s in pieces)
    groups = collections.defaultdict(set)
    for n, b, o, _, _, _ in pieces:
        groups[b].add((n, o))
    return flat, sorted(sorted(g) for g in groups.values())


def grid(f):
    out = []
    for tp in (1, 2, 4):
        for dp in (1, 2):
            out.append((tp, dp, 1))
            if f["experts"] and tp * dp > 1:
                out.extend({(tp, dp, tp), (tp, dp, tp * dp)} - {(tp, dp, 1)})
    return out


@unittest.skipUnless(DUMP, "WSYNC_NAMED_LAYOUT_DUMP (the named_layout_dump tool) is not set")
class NamedLayoutOracleTest(unittest.TestCase):
    def check_family(self, name):
        f = fam.FAMILIES[name]
        logical = fam.random_logical(f, 21, torch.bfloat16)
        compared, refused = 0, []
        for tp, dp, ep in grid(f):
            spec = f"vllm(tp={tp},ep={ep},dp={dp})"
            with self.subTest(family=name, layout=spec):
                cpp = cpp_layout(fam.CPP_MODELS[name], spec)
                if isinstance(cpp, str):
                    refused.append((spec, cpp))
                    continue
                sides = rollout_layouts_ep(f, logical, tp, dp, ep)
                py_params, py_processes = python_layout(sides)
                cpp_params, cpp_processes = cpp
                self.assertEqual(sorted(py_params), sorted(cpp_params))
                self.assertEqual(len(py_processes), len(cpp_processes))
                for rank, (a, b) in enumerate(zip(py_processes, cpp_processes)):
                    self.assertEqual(canonical(a), canonical(b), f"process {rank}")
                compared += 1
        return compared, refused

    def test_dense_families(self):
        for name in ("llama3", "qwen2.5", "qwen3"):
            compared, refused = self.check_family(name)
            self.assertEqual(refused, [])
            self.assertEqual(compared, 6)

    def test_moe_families(self):
        for name in ("qwen3-moe", "qwen2-moe", "deepseek-v3", "kimi-k2"):
            compared, refused = self.check_family(name)
            self.assertGreaterEqual(compared, 12, name)
            # The C++ layouts refuse only an ep above the expert count (vLLM leaves the last
            # EP ranks without experts: test_families_layouts covers it); an ep that does not
            # divide the experts is compared like any other.
            for spec, reason in refused:
                self.assertIn(f"exceeds the {fam.FAMILIES[name]['experts']} experts", reason,
                              (name, spec))


class FsdpFlatOracleTest(unittest.TestCase):
    """The C++ fsdp(n) flattens each parameter, pads it to a multiple of n and gives rank r the
    r-th range; wsync.layouts.fsdp_flat_layout of the same ranges must cover the same elements
    on every rank (its boxes may cut rows differently)."""

    @unittest.skipUnless(DUMP, "WSYNC_NAMED_LAYOUT_DUMP is not set")
    def test_fsdp_flat_ranges(self):
        from test_megatron_families import _covered
        from wsync import layouts
        for name in ("qwen3", "deepseek-v3"):
            f = fam.FAMILIES[name]
            logical = fam.random_logical(f, 22, torch.bfloat16)
            for n in (1, 2, 3):
                with self.subTest(family=name, n=n):
                    params, processes = cpp_layout(fam.CPP_MODELS[name], f"fsdp({n})")
                    shapes = {p: shape for p, _, shape in params}
                    self.assertEqual(shapes, {p: tuple(t.shape) for p, t in logical.items()})
                    for rank in range(n):
                        mine = []
                        for p, t in logical.items():
                            chunk = -(-t.numel() // n)
                            begin = min(rank * chunk, t.numel())
                            flat = t.reshape(-1)[begin:begin + chunk].clone()
                            if flat.numel():
                                mine += layouts.fsdp_flat_layout(flat, [(p, t.shape)],
                                                                 begin).pieces
                        a = _covered([(p.param, p.origin, p.extent) for p in mine], shapes)
                        b = _covered([(p, o, e) for p, _, o, e, _, _ in processes[rank]],
                                     shapes)
                        self.assertEqual(sorted(a), sorted(b), f"rank {rank}")
                        for p in a:
                            self.assertTrue(torch.equal(a[p], b[p]), f"rank {rank}: {p}")


def rollout_layouts_ep(f, logical, tp, dp, ep):
    """rollout_layouts for C++'s three EP modes: ep = 1, ep = tp (per replica: EP rank = TP
    rank, every replica holds all experts) and ep = tp * dp (wide: EP rank = process rank)."""
    if ep in (1, tp * dp):
        return rollout_layouts(f, logical, tp, dp, ep, "vllm")
    from wsync import layouts
    sides = []
    for rank in range(tp * dp):
        tensors = fam.rollout_tensors(logical, f, tp, rank % tp, ep, rank % tp, "vllm")
        sides.append(layouts.vllm_layout(fam.module_tree(tensors), rank % tp, tp,
                                         fam.config_of(f), ep_rank=rank % tp, ep_size=ep))
    return sides


if __name__ == "__main__":
    unittest.main()
