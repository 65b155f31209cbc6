"""Stand-in of vllm.config (see ../../README.md): only `WeightTransferConfig`."""
from vllm.config.weight_transfer import WeightTransferConfig  # noqa: F401
