"""python/sglang/srt/managers/scheduler_components/weight_updater.py: the scheduler's
``SchedulerWeightUpdaterManager``, in the generation ``$SGLANG_STANDIN_GENERATION`` names:

- ``session`` (default): okoge-kaz/sglang @ 23aaf6597dbbe47f9ceb6090e10372c844fed960 (the
  sglang-miles line, also a 0.5.14.dev docker build; not in sgl-project/sglang @ b2d53a07).
  ``begin_weight_update`` asserts no session is open, takes an integer ``weight_version`` that
  must exceed the applied one (pending until end), records the selector and calls
  ``begin_weight_update()`` on each selected runner. ``update_weights_from_tensor`` asserts an
  open session (an AssertionError, which ends the scheduler), checks the request's version
  against the pending one, then fans the same named tensors out to every runner the request's
  ``selector`` picks ("all": target first, then the draft when there is one), stopping at the
  first failure; an exception is caught and returned as (False, traceback) and marks the session
  failed. ``end_weight_update`` asserts an open session; a failed session returns its failure
  and stays open (the next begin then asserts); otherwise each runner of the recorded selector
  gets ``end_weight_update(run_post_load=not loaded)``, the session closes and the pending
  version becomes the applied one.
- ``release``: sgl-project/sglang @ b2d53a07e07c664d4318934b5dd699246be30677. No session
  methods; update_weights_from_tensor goes to the target worker when ``disable_draft_model``,
  else to the draft worker when there is one (which updates target and draft) or the target;
  nothing is caught (a raise ends the scheduler).

Both flush the cache after a successful update and end with a TP barrier (here a no-op: each TP
rank is its own process in the tests)."""

import dataclasses
import os
import traceback
from typing import Any, Callable, Optional

from sglang.srt.managers.io_struct import (BeginWeightUpdateReqOutput, EndWeightUpdateReqOutput,
                                           InitWeightsUpdateGroupReqOutput,
                                           UpdateWeightsFromTensorReqOutput)
from sglang.srt.utils import MultiprocessingSerializer

GENERATION = os.environ.get("SGLANG_STANDIN_GENERATION", "session")


def _parse_runner_selector(selector):
    if selector == "all":
        return {"target", "draft"}
    if selector in ("target", "draft"):
        return {selector}
    raise ValueError(f"invalid selector {selector!r}; expected 'target', 'draft', or 'all'")


@dataclasses.dataclass
class _ManagerBase:
    tp_worker: Any
    draft_worker: Any
    flush_cache: Callable[..., bool]
    scheduler: Optional[Any] = None

    def flush_cache_after_weight_update(self, recv_req):
        if recv_req.flush_cache:
            assert self.flush_cache(empty_cache=recv_req.torch_empty_cache), \
                "Cache flush failed after updating weights"

    def init_weights_update_group(self, recv_req):
        return InitWeightsUpdateGroupReqOutput(*self.tp_worker.init_weights_update_group(recv_req))


@dataclasses.dataclass
class _ReleaseManager(_ManagerBase):
    def update_weights_from_tensor(self, recv_req):
        if recv_req.disable_draft_model:
            worker = self.tp_worker
        else:
            worker = self.draft_worker or self.tp_worker
        success, message = worker.update_weights_from_tensor(recv_req)
        if success:
            self.flush_cache_after_weight_update(recv_req)
        return UpdateWeightsFromTensorReqOutput(success, message)


@dataclasses.dataclass
class _SessionManager(_ManagerBase):
    _weight_update_in_progress: bool = False
    _weight_update_loaded: bool = False
    _weight_update_failed: bool = False
    _weight_update_failure_message: str = ""
    _weight_update_selector: str = "all"

    def _set_pending_weight_version(self, raw):
        if self.scheduler is None or raw is None:
            return True, "Success"
        try:
            wanted = int(raw)
        except (TypeError, ValueError):
            return False, f"weight_version must be an integer, got {raw!r}"
        if wanted <= self.scheduler.applied_weight_version:
            return False, (f"weight_version must advance monotonically: applied="
                           f"{self.scheduler.applied_weight_version}, requested={wanted}")
        self.scheduler.pending_weight_version = wanted
        return True, "Success"

    def _validate_bucket_weight_version(self, raw):
        if self.scheduler is None or self.scheduler.pending_weight_version is None:
            return True, "Success"
        try:
            got = int(raw)
        except (TypeError, ValueError):
            return False, f"a versioned session needs an integer weight_version, got {raw!r}"
        if got != self.scheduler.pending_weight_version:
            return False, (f"weight_version mismatch: pending="
                           f"{self.scheduler.pending_weight_version}, bucket={got}")
        return True, "Success"

    def _fail_weight_update(self, message):
        self._weight_update_failed, self._weight_update_failure_message = True, message
        if self.scheduler is not None:
            self.scheduler.pending_weight_version = None

    def iter_weight_update_workers(self, selector="all"):
        roles = _parse_runner_selector(selector)
        workers = [("target", self.tp_worker)] if "target" in roles else []
        if "draft" in roles and self.draft_worker is not None:
            workers.append(("draft", self.draft_worker))
        return workers

    def get_model_runners(self, selector="all"):
        runners = []
        for _, worker in self.iter_weight_update_workers(selector):
            runners += worker.iter_runners()
        return runners

    def begin_weight_update(self, recv_req):
        assert not self._weight_update_in_progress, \
            "begin_weight_update called while a weight-update session is already open"
        self._weight_update_failed, self._weight_update_failure_message = False, ""
        success, message = self._set_pending_weight_version(recv_req.weight_version)
        if not success:
            self._fail_weight_update(message)
            return BeginWeightUpdateReqOutput(False, message)
        self._weight_update_selector = recv_req.selector
        try:
            for _, runner in self.get_model_runners(recv_req.selector):
                runner.begin_weight_update()
        except Exception:  # noqa: BLE001
            message = traceback.format_exc()
            self._fail_weight_update(message)
            return BeginWeightUpdateReqOutput(False, message)
        self._weight_update_in_progress, self._weight_update_loaded = True, False
        return BeginWeightUpdateReqOutput(True, "Success")

    def update_weights_from_tensor(self, recv_req):
        assert self._weight_update_in_progress, \
            "update_weights_from_tensor requires an open begin_weight_update session"
        success, message = self._validate_bucket_weight_version(recv_req.weight_version)
        if not success:
            self._fail_weight_update(message)
            return UpdateWeightsFromTensorReqOutput(False, message)
        try:
            named_tensors = MultiprocessingSerializer.deserialize(
                recv_req.serialized_named_tensors[self.tp_worker.tp_rank])
            success, message = True, "Success"
            for _, runner in self.get_model_runners(recv_req.selector):
                success, message = runner.weight_updater.update_weights_from_tensor(
                    named_tensors=named_tensors, load_format=recv_req.load_format)
                if not success:
                    break
            if success:
                self.flush_cache_after_weight_update(recv_req)
        except Exception:  # noqa: BLE001
            success, message = False, traceback.format_exc()
        if success:
            self._weight_update_loaded = True
        else:
            self._fail_weight_update(message)
        return UpdateWeightsFromTensorReqOutput(success, message)

    def end_weight_update(self, recv_req):
        assert self._weight_update_in_progress, \
            "end_weight_update called without begin_weight_update"
        if self._weight_update_failed:  # The session stays open.
            return EndWeightUpdateReqOutput(False, self._weight_update_failure_message)
        run_post_load = not self._weight_update_loaded
        try:
            for _, runner in self.get_model_runners(self._weight_update_selector):
                runner.end_weight_update(run_post_load=run_post_load)
            success, message = True, "Success"
        except Exception:  # noqa: BLE001
            success, message = False, traceback.format_exc()
        self._weight_update_in_progress = False
        if not success:
            self._fail_weight_update(message)
            return EndWeightUpdateReqOutput(False, message)
        scheduler = self.scheduler
        if scheduler is not None and scheduler.pending_weight_version is not None:
            scheduler.applied_weight_version = scheduler.pending_weight_version
            scheduler.pending_weight_version = None
        return EndWeightUpdateReqOutput(True, message)


SchedulerWeightUpdaterManager = _SessionManager if GENERATION == "session" else _ReleaseManager
