#!/usr/bin/python3
"""One process of the broadcast contestants of `wsync-bench compare`.

The weight-sync pattern most RL frameworks use today, written for this benchmark with
torch.distributed over gloo (TCP; on one machine over loopback):

  param   trainer rank 0 gathers each full parameter from the trainer ranks that hold its
          pieces, then broadcasts it to every rollout process; each rollout copies the slices it
          keeps into its own buffers (OpenRLHF, vLLM's RLHF example).
  bucket  the same, but rank 0 packs whole parameters into buckets of --bucket_bytes and
          broadcasts one bucket at a time (checkpoint-engine's broadcast mode, verl).

Processes: ranks 0..T-1 are the trainers, T..T+R-1 the rollouts, as in the layout spec that
`wsync-bench compare` writes (--spec, JSON: parameters, and per process its buffers and the pieces
of parameters they hold, offsets and strides in elements). Every trainer writes the logical values
of version v into its pieces before sync v; every rollout checks every element of its pieces
after it, so a wrong, stale or misplaced element fails the process (exit status 1) instead of
producing a figure.

Standard output, one line each: "SYNC version=V rank=K seconds=S" for every sync (the time from
the barrier that starts it until this process has finished its part), and for rollouts
"VERIFIED version=V rank=K elements=N" after the check. Exit status: 0, 1 on a failed check or
error, 2 for bad arguments.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

# Element type per element size: the bytes are held and compared as integers (bf16 bit patterns),
# and moved as a type of the same size that gloo carries (it has no int16).
_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_WIRE = {torch.uint8: torch.uint8, torch.int16: torch.float16, torch.int32: torch.int32,
         torch.int64: torch.int64}


def wire(tensor):
    """The same bytes as a type gloo moves (bitwise; no arithmetic is done on them)."""
    return tensor.view(_WIRE[tensor.dtype])
_AXIS_MULTIPLIERS = (1, 7919, 3761, 2221)  # Last axis first.
_CHUNK_ELEMENTS = 1 << 23


def logical_values(param, origin, extent, lo, hi, version, dtype):
    """The logical values of rows [lo, hi) of axis 0 of a box of parameter `param` at `version`.

    A value mixes every axis index with a different multiplier, the parameter index and the
    version, so a transposed, shifted, swapped or stale element differs from its expected value.
    """
    rank = len(extent)
    values = torch.full([hi - lo] + list(extent[1:]), (param * 131 + version * 8191) % 32768,
                        dtype=torch.int32)
    for axis in range(rank):
        start = origin[axis] + (lo if axis == 0 else 0)
        count = (hi - lo) if axis == 0 else extent[axis]
        index = torch.arange(start, start + count, dtype=torch.int64)
        term = ((index * _AXIS_MULTIPLIERS[rank - 1 - axis]) % 32768).to(torch.int32)
        shape = [1] * rank
        shape[axis] = count
        values += term.view(shape)
    return (values & 0x7FFF).to(dtype)


def row_chunks(extent):
    """Row ranges of axis 0 of at most about _CHUNK_ELEMENTS elements each."""
    row = 1
    for e in extent[1:]:
        row *= e
    step = max(1, _CHUNK_ELEMENTS // max(1, row))
    return [(lo, min(lo + step, extent[0])) for lo in range(0, extent[0], step)]


class Process:
    """This rank's buffers and pieces, as the spec states them."""

    def __init__(self, spec, rank):
        self.spec = spec
        self.trainers = len(spec["trainers"])
        self.rollouts = len(spec["rollouts"])
        self.rank = rank
        self.trainer = rank < self.trainers
        side = spec["trainers"][rank] if self.trainer else spec["rollouts"][rank - self.trainers]
        self.dtype = _DTYPES[spec["element_bytes"]]
        self.buffers = {}
        for b in side["buffers"]:
            if b["bytes"] % spec["element_bytes"] != 0:
                raise ValueError("buffer %d is not a whole number of elements" % b["id"])
            self.buffers[b["id"]] = torch.zeros(b["bytes"] // spec["element_bytes"],
                                                dtype=self.dtype)
        self.pieces_of = {}  # param -> [piece]
        for piece in side["pieces"]:
            self.pieces_of.setdefault(piece["param"], []).append(piece)

    def view(self, piece):
        return self.buffers[piece["buffer"]].as_strided(piece["extent"], piece["strides"],
                                                        piece["offset"])

    def fill(self, version):
        for param, pieces in self.pieces_of.items():
            for piece in pieces:
                target = self.view(piece)
                for lo, hi in row_chunks(piece["extent"]):
                    target[lo:hi].copy_(logical_values(param, piece["origin"], piece["extent"],
                                                       lo, hi, version, self.dtype))

    def check(self, version):
        """Number of elements checked; raises on the first wrong element."""
        checked = 0
        for param, pieces in self.pieces_of.items():
            for piece in pieces:
                held = self.view(piece)
                for lo, hi in row_chunks(piece["extent"]):
                    expected = logical_values(param, piece["origin"], piece["extent"], lo, hi,
                                              version, self.dtype)
                    if not torch.equal(held[lo:hi], expected):
                        wrong = (held[lo:hi] != expected).nonzero()[0].tolist()
                        wrong[0] += lo
                        raise RuntimeError(
                            "rollout rank %d: %s%s holds a wrong value at box index %s of version "
                            "%d" % (self.rank - self.trainers, self.spec["params"][param]["name"],
                                    box_text(piece), wrong, version))
                    checked += expected.numel()
        return checked


def box_text(piece):
    return "[" + ", ".join("%d:%d" % (o, o + e)
                           for o, e in zip(piece["origin"], piece["extent"])) + ")"


def box_slices(piece):
    return tuple(slice(o, o + e) for o, e in zip(piece["origin"], piece["extent"]))


def gather_sources(spec):
    """Per parameter, the (trainer rank, piece) pairs rank 0 assembles it from: every distinct box
    once, from the lowest trainer rank holding it (replicas are not sent twice)."""
    sources = {}
    for rank, side in enumerate(spec["trainers"]):
        for piece in side["pieces"]:
            chosen = sources.setdefault(piece["param"], [])
            key = (tuple(piece["origin"]), tuple(piece["extent"]))
            if all((tuple(p["origin"]), tuple(p["extent"])) != key for _, p in chosen):
                chosen.append((rank, piece))
    return sources


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def gather_into(me, sources, param, full):
    """Rank 0: fills `full` (the whole parameter) from its own pieces and the other trainers'.
    Other trainers: send their chosen pieces of `param` to rank 0, in the same order."""
    for rank, piece in sources.get(param, []):
        if me.rank == 0:
            if rank == 0:
                full[box_slices(piece)].copy_(me.view(piece))
            else:
                incoming = torch.empty(piece["extent"], dtype=me.dtype)
                dist.recv(wire(incoming), src=rank)
                full[box_slices(piece)].copy_(incoming)
        elif rank == me.rank:
            dist.send(wire(me.view(piece).contiguous()), dst=0)


def keep_slices(me, param, full):
    """Rollout: copies the pieces of `param` it holds out of the whole parameter."""
    for piece in me.pieces_of.get(param, []):
        me.view(piece).copy_(full[box_slices(piece)])


def buckets_of(spec, bucket_bytes):
    """Whole parameters in order, packed into buckets of at most bucket_bytes (a larger parameter
    is a bucket of its own)."""
    buckets, current, used = [], [], 0
    for param, info in enumerate(spec["params"]):
        size = numel(info["shape"]) * spec["element_bytes"]
        if current and used + size > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append(param)
        used += size
    if current:
        buckets.append(current)
    return buckets


def sync_per_parameter(me, sources, group):
    spec = me.spec
    for param, info in enumerate(spec["params"]):
        in_group = me.rank == 0 or not me.trainer
        if me.trainer:
            full = torch.empty(info["shape"], dtype=me.dtype) if me.rank == 0 else None
            gather_into(me, sources, param, full)
        else:
            full = torch.empty(info["shape"], dtype=me.dtype)
        if in_group:
            dist.broadcast(wire(full), src=0, group=group)
        if not me.trainer:
            keep_slices(me, param, full)


def sync_bucketed(me, sources, group, buckets, bucket):
    spec = me.spec
    for params in buckets:
        offset = 0
        views = []
        for param in params:
            shape = spec["params"][param]["shape"]
            # Trainers other than rank 0 only send their pieces; they hold no bucket.
            full = None if bucket is None else bucket[offset:offset + numel(shape)].view(shape)
            views.append((param, full))
            offset += numel(shape)
        if me.trainer:
            for param, full in views:
                gather_into(me, sources, param, full)
        if me.rank == 0 or not me.trainer:
            dist.broadcast(wire(bucket[:offset]), src=0, group=group)
        if not me.trainer:
            for param, full in views:
                keep_slices(me, param, full)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--mode", choices=["param", "bucket"], required=True)
    parser.add_argument("--master_port", type=int, required=True)
    parser.add_argument("--master_addr", default="127.0.0.1")
    parser.add_argument("--bucket_bytes", type=int, default=1 << 30)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--timeout_s", type=float, default=300)
    parser.add_argument("--flip_after_sync", type=int, default=-1, metavar="ROLLOUT_RANK",
                        help="test hook: that rollout rank changes one element it holds after "
                        "every sync, before its check (which must then fail)")
    args = parser.parse_args()

    with open(args.spec) as f:
        spec = json.load(f)
    if spec["element_bytes"] not in _DTYPES:
        print("unsupported element size %d" % spec["element_bytes"], file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    me = Process(spec, args.rank)
    world = me.trainers + me.rollouts
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method="tcp://%s:%d" % (args.master_addr, args.master_port),
        rank=args.rank, world_size=world,
        timeout=__import__("datetime").timedelta(seconds=args.timeout_s))
    group = dist.new_group([0] + list(range(me.trainers, world)))
    sources = gather_sources(spec)
    buckets = buckets_of(spec, args.bucket_bytes)
    bucket = None
    if args.mode == "bucket" and (me.rank == 0 or not me.trainer):
        largest = max(sum(numel(spec["params"][p]["shape"]) for p in b) for b in buckets)
        bucket = torch.zeros(largest, dtype=me.dtype)
    if args.rank == 0:
        print("BUCKETS count=%d largest_bytes=%d" %
              (len(buckets), 0 if bucket is None else bucket.numel() * spec["element_bytes"]),
              flush=True)

    for version in range(1, args.warmup + args.syncs + 1):
        if me.trainer:
            me.fill(version)
        dist.barrier()
        start = time.perf_counter()
        if args.mode == "param":
            sync_per_parameter(me, sources, group)
        else:
            sync_bucketed(me, sources, group, buckets, bucket)
        seconds = time.perf_counter() - start
        if version > args.warmup:
            print("SYNC version=%d rank=%d seconds=%.6f" % (version, args.rank, seconds),
                  flush=True)
        if not me.trainer:
            if args.rank - me.trainers == args.flip_after_sync:
                first = next(iter(me.buffers.values()))
                first[0] = first[0] ^ 1
            checked = me.check(version)
            print("VERIFIED version=%d rank=%d elements=%d" % (version, args.rank, checked),
                  flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:  # Reported as the process's failure; the harness reads stderr.
        print("broadcast_sync: %s" % error, file=sys.stderr)
        sys.exit(1)
