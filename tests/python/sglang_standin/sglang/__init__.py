"""Stand-in of SGLang for wsync's tests (see ../README.md): ``__version__`` from
$SGLANG_STANDIN_VERSION, default 0.5.5 (python/sglang/version.py)."""

import os

__version__ = os.environ.get("SGLANG_STANDIN_VERSION", "0.5.5")
