"""Stand-in of vllm/config/weight_transfer.py (see ../../README.md). Written for the tests.

Upstream declares `WeightTransferConfig` with vLLM's `@config` decorator (vllm/config/utils.py:
a pydantic dataclass whose model config forbids extra fields), read in the stored copies of
vllm-project/vllm (`vllm/config/weight_transfer.py`, the 0.33-generation file with
`backend: Literal["nccl", "ipc", "sparse_nccl"] | str = "nccl"`, validated against the factory's
registry at engine creation, plus backend subclasses carrying `packed` and buffer sizes; at
055e47c2 the path is a compatibility alias of vllm/foundation/config/weight_transfer.py). The
"main" generation's base class reads `config.weight_format` ("checkpoint" or "runtime"), so the
stand-in adds that field there (default "checkpoint": an assumption, the default itself was not
read). pydantic is not available here: the stand-in refuses an unknown field the way pydantic's
`extra="forbid"` does (a ValueError naming the field, "Extra inputs are not permitted"), and a
`weight_format` outside the Literal, with the standard library only.
"""

import vllm

_FORMATS = ("checkpoint", "runtime")


class ValidationError(ValueError):
    """What pydantic raises (a ValueError subclass there too)."""


def _fields():
    fields = {"backend": "nccl"}
    if vllm.STANDIN_GENERATION == "main":
        fields["weight_format"] = "checkpoint"
    return fields


class WeightTransferConfig:
    def __init__(self, **kwargs):
        fields = _fields()
        extra = sorted(set(kwargs) - set(fields))
        if extra:
            raise ValidationError(
                f"{len(extra)} validation error(s) for WeightTransferConfig\n" +
                "\n".join(f"{name}\n  Extra inputs are not permitted" for name in extra))
        for name, default in fields.items():
            setattr(self, name, kwargs.get(name, default))
        if not isinstance(self.backend, str):
            raise ValidationError("WeightTransferConfig\nbackend\n  Input should be a string")
        if "weight_format" in fields and self.weight_format not in _FORMATS:
            raise ValidationError(f"WeightTransferConfig\nweight_format\n  Input should be "
                                  f"'checkpoint' or 'runtime'")

    def __repr__(self):
        body = ", ".join(f"{n}={getattr(self, n)!r}" for n in _fields())
        return f"WeightTransferConfig({body})"

    def __eq__(self, other):
        return isinstance(other, WeightTransferConfig) and \
            all(getattr(self, n) == getattr(other, n) for n in _fields())

