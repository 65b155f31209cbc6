"""Runs a function in N fresh processes (spawn: none inherits a loaded libwsync.so or torch
threads) and collects what each returns, with a deadline."""

import multiprocessing
import os
import queue
import random
import socket
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "integration", "python")


def setup_path():
    for path in (HERE, os.path.abspath(PACKAGE)):
        if path not in sys.path:
            sys.path.insert(0, path)


setup_path()


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1 that were free a moment ago, drawn below the kernel's
    ephemeral range (as harness::PickFreePort does), so that no bind to port 0 and no outgoing
    connection takes one before the process meant to listen on it does."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_start = 0
    lowest = 10000
    ports = []
    rng = random.SystemRandom()
    for _ in range(64 * n):
        if len(ports) == n or ephemeral_start <= lowest + 64:
            break
        candidate = rng.randrange(lowest, ephemeral_start)
        if candidate not in ports and _bindable(candidate):
            ports.append(candidate)
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] not in ports:
                ports.append(s.getsockname()[1])
    return ports


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _child(fn, index, args, results):
    setup_path()
    try:
        import torch
        torch.set_num_threads(1)
        results.put((index, "ok", fn(index, *args)))
    except BaseException as error:  # noqa: BLE001
        results.put((index, "error", "".join(traceback.format_exception(
            type(error), error, error.__traceback__))))


def run_processes(fn, count, args=(), timeout=100):
    """[(status, value)] per process index: ('ok', fn's return) or ('error', traceback);
    ('missing', ...) for a process that neither returned nor raised by the deadline."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, i, args, results), daemon=True)
             for i in range(count)]
    for p in procs:
        p.start()
    out = {}
    deadline = time.time() + timeout
    while len(out) < count and time.time() < deadline:
        try:
            index, status, value = results.get(timeout=0.5)
            out[index] = (status, value)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                time.sleep(0.5)
                if results.empty():
                    break
    for p in procs:
        p.join(max(0.0, min(10.0, deadline - time.time())))
        if p.is_alive():
            p.kill()
            p.join()
    return [out.get(i, ("missing", f"process {i} exit code {procs[i].exitcode}"))
            for i in range(count)]


def role_reports(test, results, trainers, role):
    """The 'ok' values of a trainers-then-rollouts process run (run_processes' result) for `role`
    ("trainer": the first `trainers` processes; else the rest); fails `test` naming the first
    process that did not return."""
    for index, (status, value) in enumerate(results):
        test.assertEqual(status, "ok", f"process {index}: {value}")
    values = [value for _, value in results]
    return values[:trainers] if role == "trainer" else values[trainers:]
