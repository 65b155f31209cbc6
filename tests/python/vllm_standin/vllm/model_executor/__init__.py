"""Stand-in (see ../../README.md): the parts of vllm.model_executor wsync's loader path calls."""
