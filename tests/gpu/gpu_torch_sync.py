"""A torch trainer and a rollout process synced through the wsync package, every element checked:
the GPU bundle's Python end-to-end check (tests/gpu/bundle_run.sh), runnable from the repository
too (the library from $WSYNC_LIBRARY).

    python3 gpu_torch_sync.py --device cuda|cpu [--versions N]

Process 0 is a Megatron trainer (tp=1, hosts the coordinator) and process 1 a vLLM rollout (tp=1,
fused qkv_proj and gate_up_proj, vocabulary padded), both holding a qwen2.5-structured model
(tests/python/tiny_qwen.py) in bf16: with --device cuda on GPU 0 (the rollout on GPU 1 when there
are two), its parameters registered as CUDA memory (one GPU: CUDA IPC between the two processes);
with --device cpu a small model in host memory over UCX. For each version the trainer writes new
logical weights into its parameters in place and pushes; the rollout pulls, then compares every
element of every parameter with its own shard of the same logical weights (tiny_qwen's oracle,
which does not use wsync.layouts), padding rows included (they must keep their fill value).
Prints one line per process and version; exit status 0 only when every check held.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# In the bundle the helpers sit next to this file; in the repository they are in tests/python.
for path in (HERE, os.path.join(HERE, "..", "python")):
    if os.path.exists(os.path.join(path, "harness.py")) and path not in sys.path:
        sys.path.insert(0, path)
from harness import free_ports, run_processes  # noqa: E402

SECRET = "gpu-torch-sync-secret-0123456789abcdef"
PAD_VALUE = 7.0
# About 57 M parameters (115 MB in bf16) on a GPU; tiny_qwen's own small config on the CPU.
LARGE = dict(hidden=1024, heads=16, kv_heads=4, head_dim=64, intermediate=2816, layers=4,
             vocab=12000, rope_theta=10000.0, eps=1e-6)


def _process(index, port, device_kind, versions):
    import torch

    import tiny_qwen as tq
    from wsync import MemoryKind, layouts
    from wsync.trainer import RolloutSync, TrainerSync

    trainer = index == 0
    c = LARGE if device_kind == "cuda" else tq.CONFIG
    if device_kind == "cuda":
        device = torch.device("cuda", 0 if trainer or torch.cuda.device_count() < 2 else 1)
    else:
        device = torch.device("cpu")
    dtype = torch.bfloat16
    config = layouts.ModelConfig(c["heads"], c["kv_heads"], c["head_dim"], c["vocab"])
    common = dict(coordinator=f"127.0.0.1:{port}", secret=SECRET, job_id="gpu-torch-sync",
                  deadline_seconds=60)
    if trainer:
        model = tq.MegatronTiny(0, 1, None, c).to(device, dtype)
        shard = lambda version: tq.megatron_shard(tq.random_logical(version, c), 0, 1, c)
        layout = layouts.megatron_layout(model, 0, 1, config)
    else:
        model = tq.VllmTiny(0, 1, None, c).to(device, dtype)
        shard = lambda version: tq.vllm_shard(tq.random_logical(version, c), 0, 1, c,
                                              pad_value=PAD_VALUE)
        layout = layouts.vllm_layout(model, 0, 1, config)
    params = dict(model.named_parameters())
    tq.load_local(model, shard(1000))  # Weights no version has.
    kinds = sorted({MemoryKind(row[3]).name for row in layout.buffers()[0]})
    addresses = {n: p.data_ptr() for n, p in params.items()}
    report = {"role": "trainer" if trainer else "rollout", "device": str(device), "kinds": kinds,
              "elements": sum(p.numel() for p in params.values()), "steps": []}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    if trainer:
        sync = TrainerSync(model, layout, 0, 1, num_rollouts=1, **common)
    else:
        sync = RolloutSync(model, layout, 0, 1, num_trainers=1, **common)
    report["schedule"] = sync.schedule()["text"].splitlines()[:3]
    with sync:
        for version in range(1, versions + 1):
            expected = {n: t.to(device, dtype) for n, t in shard(version).items()}
            step = {"version": version}
            if trainer:
                tq.load_local(model, expected)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # No write in flight while wsync reads.
                began = time.time()
                step["stats"] = sync.push(version)
            else:
                step["differed"] = any(not torch.equal(params[n], expected[n]) for n in expected)
                began = time.time()
                step["stats"] = sync.pull(version)
                step["state"] = [sync.state()[0].name, sync.state()[1]]
                with torch.no_grad():
                    step["mismatched"] = sorted(n for n in expected
                                                if not torch.equal(params[n], expected[n]))
                step["checked"] = sum(expected[n].numel() for n in expected)
                step["in_place"] = all(p.data_ptr() == addresses[n] for n, p in params.items())
            step["seconds"] = time.time() - began
            report["steps"].append(step)
    return report


def _problems(results, versions, device_kind):
    """Every check that did not hold, as text (empty: all held)."""
    problems = []
    for index, (status, report) in enumerate(results):
        if status != "ok":
            problems.append(f"process {index}: {status}: {report}")
            continue
        who = report["role"]
        want_kind = "CUDA" if device_kind == "cuda" else "HOST"
        if report["kinds"] != [want_kind]:
            problems.append(f"{who}: buffers registered as {report['kinds']}, not {want_kind}")
        if len(report["steps"]) != versions:
            problems.append(f"{who}: {len(report['steps'])} of {versions} versions")
        for step in report["steps"]:
            v, stats = step["version"], step["stats"]
            if stats["version"] != v:
                problems.append(f"{who} version {v}: stats of version {stats['version']}")
            if who == "trainer":
                if stats["sent_bytes"] <= 0:
                    problems.append(f"{who} version {v}: sent nothing")
                continue
            if stats["received_bytes"] <= 0:
                problems.append(f"{who} version {v}: received nothing")
            if not step["differed"]:
                problems.append(f"{who} version {v}: held the weights before the pull")
            if step["mismatched"]:
                problems.append(f"{who} version {v}: {len(step['mismatched'])} parameters differ, "
                                f"e.g. {step['mismatched'][:3]}")
            if step["checked"] != report["elements"]:
                problems.append(f"{who} version {v}: checked {step['checked']} of "
                                f"{report['elements']} elements")
            if step["state"] != ["IDLE", v]:
                problems.append(f"{who} version {v}: state {step['state']}")
            if not step["in_place"]:
                problems.append(f"{who} version {v}: a parameter moved")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    (port,) = free_ports(1)
    began = time.time()
    results = run_processes(_process, 2, (port, args.device, args.versions), timeout=args.timeout)
    for status, report in results:
        if status != "ok":
            continue
        schedule = (report["schedule"] or [""])[0]
        print(f"{report['role']}: {report['device']} {report.get('gpu', '')} buffers "
              f"{report['kinds']}, {report['elements']} elements; {schedule}")
        for step in report["steps"]:
            stats = step["stats"]
            moved = stats["sent_bytes"] if report["role"] == "trainer" else stats["received_bytes"]
            line = (f"{report['role']}: version {step['version']} {step['seconds']:.3f} s, "
                    f"{moved} B ({moved / max(step['seconds'], 1e-9) / 1e9:.2f} GB/s)")
            if report["role"] == "rollout":
                line += (f", {step['checked']} elements checked, "
                         f"{len(step['mismatched'])} parameters differ, state {step['state']}")
            print(line)
    problems = _problems(results, args.versions, args.device)
    for problem in problems:
        print("FAILED:", problem)
    print(f"sync {args.device}: {'PASS' if not problems else 'FAIL'} "
          f"({args.versions} versions, {time.time() - began:.1f} s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
