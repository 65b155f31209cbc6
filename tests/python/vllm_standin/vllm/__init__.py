"""Stand-in of the vllm package for wsync's tests (see ../README.md): only the version."""
import os

__version__ = os.environ.get("VLLM_STANDIN_VERSION", "0.29.0")
