"""Stand-in of vllm/distributed/weight_transfer (see ../../../README.md)."""
