"""Stand-in (see ../../README.md). vLLM's get_tensor_model_parallel_rank & co. are left out: the
engine then reads the ranks from parallel_config, as it does where the TP group is not up."""
