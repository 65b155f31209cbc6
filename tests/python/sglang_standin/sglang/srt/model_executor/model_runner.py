"""python/sglang/srt/model_executor/model_runner.py (0.5.x): ModelRunner's weight-update calls
that wsync's hooks sit under. update_weights_from_tensor follows SGLang's body: unwrap each
tensor onto the worker's device, then "direct" / a --custom-weight-loader entry (called as
loader(model, named_tensors), its result dropped) / the model's load_weights; (True, "Success")
once it returns, whatever the loader did; nothing is caught. The group calls go to the weight
updater (model_executor/weight_updater.py @ fd623da, where the receiver hook lives)."""

import torch

from sglang.srt.model_executor.weight_updater import WeightUpdater
from sglang.srt.utils import dynamic_import


def _unwrap_tensor(tensor, tp_rank, device):
    return tensor.to(device)  # (A LocalSerializedTensor would first be opened for tp_rank.)


class ModelRunner:
    def __init__(self, model, tp_rank, tp_size, server_args, device="cpu"):
        self.model, self.tp_rank, self.tp_size = model, tp_rank, tp_size
        self.server_args, self.device = server_args, device
        self.weight_updater = WeightUpdater(
            tp_rank=tp_rank, tp_size=tp_size, device=device, get_model=lambda: self.model,
            weight_update_receivers=server_args.weight_update_receivers)

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        named_tensors = [(name, _unwrap_tensor(tensor, tp_rank=self.tp_rank,
                                               device=torch.device(self.device)))
                         for name, tensor in named_tensors]
        if load_format == "direct":
            params = dict(self.model.named_parameters())
            for name, tensor in named_tensors:
                params[name].data.copy_(tensor)
        elif load_format in self.server_args.custom_weight_loader:
            custom_loader = dynamic_import(load_format)
            custom_loader(self.model, named_tensors)
        elif load_format is None:
            self.model.load_weights(named_tensors)
        else:
            raise NotImplementedError(f"Unknown load_format={load_format}")
        return True, "Success"

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size,
                                  group_name, backend="nccl", receiver=None,
                                  receiver_init_payload=None):
        return self.weight_updater.init_weights_update_group(
            master_address, master_port, rank_offset, world_size, group_name, backend,
            receiver, receiver_init_payload)

    def destroy_weights_update_group(self, group_name):
        return self.weight_updater.destroy_weights_update_group(group_name)
