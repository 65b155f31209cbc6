"""Stand-in of vllm/model_executor/layers/quantization/base_config.py (see ../../../../README.md).

Written for the tests (not copied): `QuantizeMethodBase` with the two hooks the layerwise reload
of reload/layerwise.py @ 01424e4b calls on a layer's quant method:

- `process_weights_after_loading(layer)`: checkpoint format -> kernel format (no-op here);
- `get_runtime_weight_reload_mapping(layer, checkpoint_params, runtime_params)`: the parameters
  (by checkpoint name) a reload may load straight into, or None. layerwise.py @ 01424e4b binds a
  layer to its runtime tensors ("mapped layer", no reprocessing) only when the mapping is not
  None and has exactly the checkpoint's names, and, where it is the runtime parameters
  themselves, when their shape, stride and dtype equal the recorded checkpoint format.

Assumption: the base method's default was not read at that commit (base_config.py is stored
here only @ 026bb17c, whose base class has `supports_direct_weight_reload` /
`bind_runtime_weight_reload` instead, both "no" by default). The stand-in's default is likewise
"no" (None): a method binds directly only where it says so.
"""


class QuantizeMethodBase:
    def process_weights_after_loading(self, layer):
        return None

    def get_runtime_weight_reload_mapping(self, layer, checkpoint_params, runtime_params):
        return None
