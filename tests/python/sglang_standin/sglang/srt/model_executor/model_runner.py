"""python/sglang/srt/model_executor/model_runner.py: the parts of ModelRunner on the weight-update
path. ``weight_updater`` (model_executor/weight_updater.py) holds update_weights_from_tensor;
``begin_weight_update()`` / ``end_weight_update(run_post_load)`` are what the session generation's
scheduler calls on each selected runner (okoge-kaz/sglang @
23aaf6597dbbe47f9ceb6090e10372c844fed960: restore packed weights to a loadable state / quant
finalize, model.post_load_weights when run_post_load); the stand-in records the calls in
``session_calls``. ``is_draft_worker`` marks a speculative-decoding draft model's runner."""

from sglang.srt.model_executor.weight_updater import WeightUpdater


class ModelRunner:
    def __init__(self, model, tp_rank, tp_size, server_args, device="cpu", is_draft_worker=False):
        self.model, self.tp_rank, self.tp_size = model, tp_rank, tp_size
        self.server_args, self.device = server_args, device
        self.is_draft_worker = is_draft_worker
        self.weight_updater = WeightUpdater(self)
        self.session_calls = []

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        return self.weight_updater.update_weights_from_tensor(named_tensors, load_format)

    def begin_weight_update(self):
        self.session_calls.append("begin")

    def end_weight_update(self, run_post_load=False):
        self.session_calls.append(("end", run_post_load))
        if run_post_load and hasattr(self.model, "post_load_weights"):
            self.model.post_load_weights()
