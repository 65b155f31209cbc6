"""Runs a function in N fresh processes (spawn: none inherits a loaded libwsync.so or torch
threads) and collects what each returns, with a deadline."""

import multiprocessing
import os
import queue
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
    sockets, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


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
