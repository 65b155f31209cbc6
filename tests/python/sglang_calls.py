"""SGLang's call sequence above ModelRunner, for wsync's SGLang tests (SGLang cannot be installed
here; the package under sglang_standin/ holds the modules wsync's hooks import). Read from
sgl-project/sglang 0.5.x:

- a TP worker process at launch (managers/scheduler.py, model_executor/model_runner.py):
  set_global_server_args_for_scheduler, initialize_model_parallel, initialize_dp_attention, then
  ModelRunner; :func:`launch_worker` does the same with the stand-ins.
- Engine.update_weights_from_tensor (entrypoints/engine.py): one serialized copy of the named
  tensors per TP rank into UpdateWeightsFromTensorReqInput; the scheduler of each TP rank then
  runs SchedulerUpdateWeightsMixin.update_weights_from_tensor
  (managers/scheduler_update_weights_mixin.py) -> TpModelWorker.update_weights_from_tensor
  (managers/tp_worker.py: deserialize serialized_named_tensors[tp_rank]) ->
  ModelRunner.update_weights_from_tensor. Neither catches an exception: a raise ends the
  scheduler process (its top-level handler logs "Scheduler hit an exception" and signals the
  server), which :func:`scheduler_process_step` reports as ("scheduler exited", error).
- init_weights_update_group / update_weights_from_distributed / destroy_weights_update_group
  with the receiver hook (@ fd623da): TpModelWorker forwards to the weight updater; a receiver
  round that raises is reported by the scheduler as success False with the error's text, and
  no weight version is recorded.
"""

from sglang.srt.distributed import parallel_state
from sglang.srt.layers import dp_attention
from sglang.srt.managers.io_struct import (DestroyWeightsUpdateGroupReqOutput,
                                           InitWeightsUpdateGroupReqOutput,
                                           UpdateWeightsFromDistributedReqOutput,
                                           UpdateWeightsFromTensorReqInput,
                                           UpdateWeightsFromTensorReqOutput)
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import set_global_server_args_for_scheduler
from sglang.srt.utils import MultiprocessingSerializer


class TpModelWorker:
    def __init__(self, model_runner):
        self.model_runner, self.tp_rank = model_runner, model_runner.tp_rank

    def update_weights_from_tensor(self, recv_req):
        return self.model_runner.update_weights_from_tensor(
            named_tensors=MultiprocessingSerializer.deserialize(
                recv_req.serialized_named_tensors[self.tp_rank]),
            load_format=recv_req.load_format)

    def init_weights_update_group(self, recv_req):
        return self.model_runner.init_weights_update_group(
            recv_req.master_address, recv_req.master_port, recv_req.rank_offset,
            recv_req.world_size, recv_req.group_name, recv_req.backend, recv_req.receiver,
            recv_req.receiver_init_payload)

    def update_weights_from_distributed(self, recv_req):
        self.model_runner.weight_updater.receive_weights_from_distributed(
            names=recv_req.names, dtypes=recv_req.dtypes, shapes=recv_req.shapes,
            group_name=recv_req.group_name, load_format=recv_req.load_format,
            receiver_payload=recv_req.receiver_payload)
        return True, "Succeeded to update parameter online."

    def destroy_weights_update_group(self, recv_req):
        return self.model_runner.destroy_weights_update_group(recv_req.group_name)


class Scheduler:
    """The weight-update handlers of one TP rank's scheduler."""

    def __init__(self, tp_worker):
        self.tp_worker = tp_worker
        self.weight_version = None
        self.cache_flushes = 0

    def flush_cache(self):
        self.cache_flushes += 1
        return True

    def update_weights_from_tensor(self, recv_req):
        success, message = self.tp_worker.update_weights_from_tensor(recv_req)
        if success:
            if recv_req.flush_cache:
                assert self.flush_cache(), "Cache flush failed after updating weights"
            if recv_req.weight_version is not None:  # (The tokenizer manager records it.)
                self.weight_version = recv_req.weight_version
        return UpdateWeightsFromTensorReqOutput(success, message)

    def init_weights_update_group(self, recv_req):
        return InitWeightsUpdateGroupReqOutput(*self.tp_worker.init_weights_update_group(recv_req))

    def update_weights_from_distributed(self, recv_req):
        try:
            success, message = self.tp_worker.update_weights_from_distributed(recv_req)
        except Exception as error:  # noqa: BLE001  (receiver rounds: reported, not fatal)
            success, message = False, str(error)
        if success:
            if recv_req.flush_cache:
                self.flush_cache()
            if recv_req.weight_version is not None:
                self.weight_version = recv_req.weight_version
        return UpdateWeightsFromDistributedReqOutput(success, message)

    def destroy_weights_update_group(self, recv_req):
        return DestroyWeightsUpdateGroupReqOutput(
            *self.tp_worker.destroy_weights_update_group(recv_req))


def launch_worker(model, tp_rank, server_args):
    """A TP worker's scheduler as SGLang sets one up (global args, groups, ModelRunner)."""
    set_global_server_args_for_scheduler(server_args)
    parallel_state.initialize_model_parallel(tp_rank, server_args.tp_size)
    dp_attention.initialize_dp_attention(server_args, tp_rank)
    runner = ModelRunner(model, tp_rank, server_args.tp_size, server_args)
    return Scheduler(TpModelWorker(runner))


def engine_tensor_request(tp_size, named_tensors, load_format=None, flush_cache=True,
                          weight_version=None):
    """Engine.update_weights_from_tensor's request: the tensors serialized once per TP rank."""
    return UpdateWeightsFromTensorReqInput(
        serialized_named_tensors=[MultiprocessingSerializer.serialize(named_tensors)
                                  for _ in range(tp_size)],
        load_format=load_format, flush_cache=flush_cache, weight_version=weight_version)


def scheduler_process_step(handler, request):
    """One request on a scheduler process: ("ok", output), or ("scheduler exited", the error)
    when the handler raised (SGLang's scheduler process would end here)."""
    try:
        return "ok", handler(request)
    except Exception as error:  # noqa: BLE001
        return "scheduler exited", error
