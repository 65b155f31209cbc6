"""The ModelRunner's weight updater: ``WeightUpdater.update_weights_from_tensor(named_tensors,
load_format)``, the call the scheduler reaches on each selected runner (okoge-kaz/sglang @
23aaf6597dbbe47f9ceb6090e10372c844fed960, managers/scheduler_components/weight_updater.py calls
``runner.weight_updater.update_weights_from_tensor``; at sgl-project/sglang @
b2d53a07e07c664d4318934b5dd699246be30677 the same body is ModelRunner.update_weights_from_tensor,
which the stand-in ModelRunner forwards here). The body: each tensor onto the runner's device, then
"direct" (copy into the named parameters) / an entry of ``--custom-weight-loader`` (called as
``loader(model, named_tensors)``, its result dropped) / the model's load_weights; (True,
"Success") once it returns. Nothing is caught here."""

import torch

from sglang.srt.utils import dynamic_import


def _unwrap_tensor(tensor, tp_rank, device):
    return tensor.to(device)  # (A LocalSerializedTensor would first be opened for tp_rank.)


class WeightUpdater:
    def __init__(self, model_runner):
        self.model_runner = model_runner

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        runner = self.model_runner
        named_tensors = [(name, _unwrap_tensor(tensor, tp_rank=runner.tp_rank,
                                               device=torch.device(runner.device)))
                         for name, tensor in named_tensors]
        if load_format == "direct":
            params = dict(runner.model.named_parameters())
            for name, tensor in named_tensors:
                params[name].data.copy_(tensor)
        elif load_format in runner.server_args.custom_weight_loader:
            custom_loader = dynamic_import(load_format)
            custom_loader(runner.model, named_tensors)
        elif load_format is None:
            runner.model.load_weights(named_tensors)
        else:
            raise NotImplementedError(f"Unknown load_format={load_format}")
        return True, "Success"
