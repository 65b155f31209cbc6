"""Stand-in of vllm/model_executor/model_loader/weight_utils.py (see ../../../README.md), the
loader reload/layerwise.py @ fc26ee2a falls back to (`_get_weight_loader`):
`default_weight_loader(param, loaded_weight)` copies a whole tensor of the parameter's shape
(upstream also fills a 0-d parameter from a 1-element tensor; not needed here)."""


def default_weight_loader(param, loaded_weight):
    if param.size() != loaded_weight.size():
        raise AssertionError(f"Attempted to load weight ({loaded_weight.size()}) into parameter "
                             f"({param.size()})")
    param.data.copy_(loaded_weight)
