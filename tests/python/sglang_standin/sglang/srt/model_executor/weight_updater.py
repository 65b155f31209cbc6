"""python/sglang/srt/model_executor/weight_updater.py @ fd623da: the external-receiver branches of
init_weights_update_group (allowlist, one receiver per group name, the factory's exception
returned as (False, "Failed to initialize external weight-update receiver: ...")),
receive_weights_from_distributed (a receiver group takes no names / dtypes / shapes and no
load_format; receive(receiver_payload) is called and its exception propagates to the scheduler)
and destroy_weights_update_group. The torch process-group branches are left out."""

import torch

from sglang.srt.weight_sync.external_receiver import (WeightUpdateReceiverContext,
                                                       build_weight_update_receiver)


class WeightUpdater:
    def __init__(self, tp_rank, tp_size, device, get_model, weight_update_receivers=None):
        self.tp_rank, self.tp_size, self.device = tp_rank, tp_size, device
        self.get_model = get_model
        self.weight_update_receivers = weight_update_receivers
        self._external_receivers = {}

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size,
                                  group_name, backend="nccl", receiver=None,
                                  receiver_init_payload=None):
        assert group_name != "", "Group name cannot be empty"
        if receiver is None:
            return False, "the stand-in has no torch process groups"
        try:
            if group_name in self._external_receivers:
                raise ValueError(f"group {group_name!r} already exists")
            self._external_receivers[group_name] = build_weight_update_receiver(
                receiver, self.weight_update_receivers,
                WeightUpdateReceiverContext(
                    model=self.get_model(), device=torch.device(self.device),
                    tp_rank=self.tp_rank, tp_size=self.tp_size, group_name=group_name,
                    master_address=master_address, master_port=master_port,
                    world_size=world_size, rank_offset=rank_offset,
                    init_payload=receiver_init_payload))
            return True, "Succeeded to initialize external weight-update receiver."
        except Exception as e:  # noqa: BLE001
            return False, f"Failed to initialize external weight-update receiver: {e}."

    def receive_weights_from_distributed(self, *, names, dtypes, shapes, group_name,
                                         load_format=None, receiver_payload=None):
        external = self._external_receivers.get(group_name)
        if external is None:
            raise ValueError(f"Group {group_name} has no external receiver")
        if names or dtypes or shapes:
            raise ValueError(f"Group {group_name!r} is an external receiver: tensor "
                             "names/dtypes/shapes must be empty")
        if load_format is not None:
            raise ValueError(f"Group {group_name!r} is an external receiver: load_format "
                             "is not supported on receiver rounds")
        external.receive(receiver_payload)
        return []

    def destroy_weights_update_group(self, group_name):
        try:
            if group_name in self._external_receivers:
                self._external_receivers.pop(group_name).destroy()
                return True, "Succeeded to destroy external weight-update receiver."
            return False, "The group to be destroyed does not exist."
        except Exception as e:  # noqa: BLE001
            return False, f"Failed to destroy external weight-update receiver: {e}."
