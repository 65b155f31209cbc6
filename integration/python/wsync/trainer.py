"""Helpers for the two sides of a job: TrainerSync (push after each optimizer step) and
RolloutSync (a rollout process that joins each push, in place)."""

import re

from . import placement
from .layouts import Layout
from .progress import ProgressLine
from .session import Session


_HEAD = re.compile(
    r"process (?P<process>\d+) \((?P<role>\w+) rank (?P<rank>\d+)\): (?P<segments>\d+) segments, "
    r"(?P<chunks>\d+) chunks, (?P<rounds>\d+) rounds; sends (?P<sent_bytes>\d+) B, receives "
    r"(?P<received_bytes>\d+) B, copies (?P<local_copy_bytes>\d+) B locally; direct "
    r"(?P<direct_bytes>\d+) B, staged (?P<staged_bytes>\d+) B; arenas (?P<arena_bytes>\d+) B")
_PEER = re.compile(r"\s*(?P<direction>to|from) process (?P<peer>\d+) \((?P<path_class>[^)]*)\): "
                   r"(?P<rounds>\d+) rounds, (?P<bytes>\d+) B, arena (?P<arena_bytes>\d+) B")
_DIGEST = re.compile(r"plan digest (?P<digest>[0-9a-fA-F]+)")


def _parse_report(text):
    """The plugin's schedule report as a dict: the first line's totals (process, role, rank,
    segments, chunks, rounds, sent_bytes, received_bytes, local_copy_bytes, direct_bytes,
    staged_bytes, arena_bytes), 'peers' (direction, peer, path_class, rounds, bytes, arena_bytes),
    'digest' when given, and 'text' (the report as is)."""
    report = {"text": text, "peers": []}
    for line in text.splitlines():
        head, peer, digest = _HEAD.search(line), _PEER.match(line), _DIGEST.search(line)
        if head:
            for key, value in head.groupdict().items():
                report[key] = value if key == "role" else int(value)
        elif peer:
            row = peer.groupdict()
            report["peers"].append({k: (v if k in ("direction", "path_class") else int(v))
                                    for k, v in row.items()})
        elif digest:
            report["digest"] = digest.group("digest")
    return report


class _Side:
    role = None

    def __init__(self, model, layout, rank, num_trainers, num_rollouts, coordinator, secret,
                 job_id="wsync", host_coordinator=False, connect=True, ppn=None, colocated=None,
                 **session_kwargs):
        if ppn is not None or colocated is not None:
            if session_kwargs.get("node_id") is not None:
                raise ValueError("give node_id or a placement (ppn, colocated), not both")
            session_kwargs["node_id"] = placement.node_id(
                self.role, rank, 8 if ppn is None else ppn, bool(colocated))
        self.model = model
        self.layout = layout(model) if callable(layout) and not isinstance(layout, Layout) \
            else layout
        if not isinstance(self.layout, Layout):
            raise TypeError("layout must be a wsync.layouts.Layout or a function model -> Layout")
        self.session = Session(self.role, rank=rank, num_trainers=num_trainers,
                               num_rollouts=num_rollouts, job_id=job_id, coordinator=coordinator,
                               host_coordinator=host_coordinator, secret=secret,
                               **session_kwargs)
        try:
            self.layout.register(self.session)  # Every parameter, once.
            if connect:
                self.session.connect()
        except BaseException:
            self.session.finalize()
            raise

    def connect(self):
        self.session.connect()

    def schedule(self):
        """What this process sends / receives each sync, as a dict (see _parse_report)."""
        return _parse_report(self.session.schedule_report())

    def stats(self):
        return self.session.stats()

    def state(self):
        return self.session.state()

    def close(self):
        self.session.finalize()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class TrainerSync(_Side):
    """Registers every parameter of a trainer process's model once and pushes a version after each
    optimizer step.

    model: the torch module of this process (its parameters are the sources, read in place);
    layout: a wsync.layouts.Layout of it, or a function model -> Layout (e.g.
    ``lambda m: layouts.megatron_layout(m, tp_rank, tp, config)``); rank, world: this trainer's
    rank and the number of trainer processes; coordinator: 'host:port' (trainer rank 0 hosts it
    unless host_coordinator says otherwise); secret: the job secret; num_rollouts: rollout
    processes in the job. ppn, colocated: the node this process reports, placed as the named
    layouts place it (wsync.placement.node_id; for nodes simulated on one machine), instead of its
    host name. Other keywords go to wsync.Session (deadline_seconds, path_transports...).
    Connects unless connect=False.
    """
    role = "trainer"

    def __init__(self, model, layout, rank, world, coordinator, secret, num_rollouts=1,
                 host_coordinator=None, **kwargs):
        if host_coordinator is None:
            host_coordinator = rank == 0
        super().__init__(model, layout, rank, world, num_rollouts, coordinator, secret,
                         host_coordinator=host_coordinator, **kwargs)

    def push(self, version, progress=None):
        """Sends `version` of the weights (call after optimizer.step(), with no write to the
        parameters in flight); returns this process's stats of the sync. progress: show rounds and
        bytes on stderr while a sync takes more than a second (None: when stderr is a terminal and
        WSYNC_PROGRESS is not 0; wsync.progress)."""
        with ProgressLine(self.session, "push", show=progress):
            self.session.sync(version)
        return self.session.stats()


class RolloutSync(_Side):
    """A rollout process whose model's parameters are written in place by each sync.

    Either the engine calls pull(version) (the engine-RPC mode), or, with on_before/on_after given,
    a background thread joins every push of the trainer and calls them around it (the
    trainer-triggered mode)."""
    role = "rollout"

    def __init__(self, model, layout, rank, world, coordinator, secret, num_trainers=1,
                 on_before=None, on_after=None, **kwargs):
        self._on = (on_before, on_after)
        connect = kwargs.pop("connect", True)
        super().__init__(model, layout, rank, num_trainers, world, coordinator, secret,
                         connect=False, **kwargs)
        try:
            if on_before is not None or on_after is not None:
                self.session.set_update_callbacks(on_before, on_after)
            if connect:
                self.session.connect()
        except BaseException:
            self.session.finalize()
            raise

    def pull(self, version, progress=None):
        """Receives `version` in place (the engine-RPC mode); returns this process's stats of
        the sync. progress: as TrainerSync.push."""
        with ProgressLine(self.session, "pull", show=progress):
            self.session.sync(version)
        return self.session.stats()
