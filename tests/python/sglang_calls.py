"""SGLang's call sequence above ModelRunner, for wsync's SGLang tests (SGLang cannot be installed
here; the package under sglang_standin/ holds the modules wsync's hooks import). Two interface
generations, picked by $SGLANG_STANDIN_GENERATION (see sglang_standin/README.md):

- a TP worker process at launch (managers/scheduler.py, model_executor/model_runner.py):
  set_global_server_args_for_scheduler, initialize_model_parallel, initialize_dp_attention, the
  target ModelRunner and, with ``--speculative-algorithm``, a draft worker with its own runner;
  the scheduler's ``SchedulerWeightUpdaterManager`` over both (:func:`launch_worker`).
- TpModelWorker (managers/tp_worker.py): ``iter_runners()`` gives ("", its runner);
  ``update_weights_from_tensor(recv_req)`` (the release generation's path) deserializes
  ``serialized_named_tensors[tp_rank]`` and calls its runner. The draft worker's
  ``iter_runners()`` gives ("draft", its runner); in the release generation the scheduler sends
  it the whole update, which it loads into the target runner and then its own (the EAGLE
  worker's routing; its file was not read at the pinned commit, the scheduler's choice was).
- The scheduler handles one request at a time (its event loop), so every weight-update call of a
  TP rank is serialized: :class:`Scheduler` holds a lock around each. A handler that raises ends
  the scheduler process (its top-level handler logs "Scheduler hit an exception"): after that
  every call raises :class:`SchedulerExited`.
- Engine (entrypoints/engine.py): ``update_weights_from_tensor(named_tensors, load_format,
  flush_cache, weight_version, ...)`` serializes the named tensors once per TP rank into
  UpdateWeightsFromTensorReqInput; the session generation adds ``begin_weight_update(selector,
  weight_version)`` / ``end_weight_update()`` (its /begin_weight_update and /end_weight_update).
  :class:`Engine` sends each request to the schedulers of this process and returns (success,
  message), the first failure's when one fails.
"""

import threading

from sglang.srt.distributed import parallel_state
from sglang.srt.layers import dp_attention
from sglang.srt.managers.io_struct import (BeginWeightUpdateReqInput, EndWeightUpdateReqInput,
                                           UpdateWeightsFromTensorReqInput)
from sglang.srt.managers.scheduler_components import weight_updater
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import set_global_server_args_for_scheduler
from sglang.srt.utils import MultiprocessingSerializer


class SchedulerExited(RuntimeError):
    """The scheduler process ended on a handler's exception (``cause`` holds it)."""

    def __init__(self, cause):
        super().__init__(f"scheduler exited: {type(cause).__name__}: {cause}")
        self.cause = cause


class TpModelWorker:
    def __init__(self, model_runner):
        self.model_runner, self.tp_rank = model_runner, model_runner.tp_rank

    def iter_runners(self):
        return [("", self.model_runner)]

    def update_weights_from_tensor(self, recv_req):
        return self.model_runner.update_weights_from_tensor(
            named_tensors=MultiprocessingSerializer.deserialize(
                recv_req.serialized_named_tensors[self.tp_rank]),
            load_format=recv_req.load_format)

    def init_weights_update_group(self, recv_req):
        return False, "the stand-in has no torch process groups"


class DraftWorker:
    def __init__(self, target_worker, draft_runner):
        self.target_worker, self.model_runner = target_worker, draft_runner
        self.tp_rank = target_worker.tp_rank

    def iter_runners(self):
        return [("draft", self.model_runner)]

    def update_weights_from_tensor(self, recv_req):
        success, message = self.target_worker.update_weights_from_tensor(recv_req)
        if not success:
            return success, message
        return self.model_runner.update_weights_from_tensor(
            named_tensors=MultiprocessingSerializer.deserialize(
                recv_req.serialized_named_tensors[self.tp_rank]),
            load_format=recv_req.load_format)


class Scheduler:
    """The weight-update handlers of one TP rank's scheduler, one call at a time."""

    def __init__(self, tp_worker, draft_worker, server_args):
        self.tp_worker, self.draft_worker = tp_worker, draft_worker
        self.cache_flushes = 0
        self.weight_version = server_args.weight_version  # Reported by /get_weight_version.
        self.applied_weight_version, self.pending_weight_version = 0, None  # session generation
        self.weight_updater = weight_updater.SchedulerWeightUpdaterManager(
            tp_worker=tp_worker, draft_worker=draft_worker, flush_cache=self.flush_cache,
            scheduler=self)
        self.exited = None
        self._lock = threading.Lock()

    def flush_cache(self, empty_cache=False):
        self.cache_flushes += 1
        return True

    def handle(self, method, request):
        with self._lock:
            if self.exited is not None:
                raise SchedulerExited(self.exited)
            try:
                output = getattr(self.weight_updater, method)(request)
            except Exception as error:  # noqa: BLE001
                self.exited = error
                raise SchedulerExited(error) from error
            if method == "update_weights_from_tensor" and output.success and \
                    request.weight_version is not None:
                self.weight_version = request.weight_version  # (The tokenizer manager's.)
            return output


class Engine:
    """The engine calls of this process's TP ranks (each test process holds one)."""

    def __init__(self, schedulers, tp_size):
        self.schedulers, self.tp_size = list(schedulers), tp_size
        if weight_updater.GENERATION == "session":
            self.begin_weight_update = self._begin
            self.end_weight_update = self._end

    def _all(self, method, request):
        results = [s.handle(method, request) for s in self.schedulers]
        failed = [r for r in results if not r.success]
        first = failed[0] if failed else results[0]
        return first.success, first.message

    def _begin(self, selector="all", weight_version=None):
        return self._all("begin_weight_update", BeginWeightUpdateReqInput(
            selector=selector, weight_version=weight_version))

    def _end(self):
        return self._all("end_weight_update", EndWeightUpdateReqInput())

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True,
                                   weight_version=None, **generation_fields):
        return self._all("update_weights_from_tensor", UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[MultiprocessingSerializer.serialize(named_tensors)
                                      for _ in range(self.tp_size)],
            load_format=load_format, flush_cache=flush_cache, weight_version=weight_version,
            **generation_fields))


def launch_worker(model, tp_rank, server_args, draft_model=None):
    """A TP worker's scheduler as SGLang sets one up (global args, groups, runners)."""
    set_global_server_args_for_scheduler(server_args)
    parallel_state.initialize_model_parallel(tp_rank, server_args.tp_size)
    dp_attention.initialize_dp_attention(server_args, tp_rank)
    worker = TpModelWorker(ModelRunner(model, tp_rank, server_args.tp_size, server_args))
    draft = None
    if server_args.speculative_algorithm is not None:
        draft = DraftWorker(worker, ModelRunner(draft_model, tp_rank, server_args.tp_size,
                                                server_args, is_draft_worker=True))
    return Scheduler(worker, draft, server_args)
