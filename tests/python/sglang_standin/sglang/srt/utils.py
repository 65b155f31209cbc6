"""python/sglang/srt/utils.py (0.5.x): dynamic_import and MultiprocessingSerializer."""

import importlib
import io
import pickle

from torch.multiprocessing.reductions import ForkingPickler


def dynamic_import(func_path):
    """"package.module.attribute" -> the attribute (imports the module part, then getattr)."""
    module_path, _, attribute = func_path.rpartition(".")
    return getattr(importlib.import_module(module_path), attribute)


class MultiprocessingSerializer:
    """SGLang pickles named tensors with torch's ForkingPickler (tensors travel as shared-memory
    handles) and unpickles them in the TP worker."""

    @staticmethod
    def serialize(obj, output_str=False):
        buffer = io.BytesIO()
        ForkingPickler(buffer).dump(obj)
        return buffer.getvalue()

    @staticmethod
    def deserialize(data):
        return pickle.loads(data)
