"""Stand-in of the vllm package for wsync's tests (see ../README.md): the version, and from it
the interface generation the other stand-in modules reproduce.

`$VLLM_STANDIN_VERSION` (read at import; default "0.33.0") is `__version__`. Its generation:
  - "0.29": a version below 0.30 (v0.28.x / v0.29.x: `trainer_send_weights` still abstract on
    the worker ABC; outside wsync's supported range, kept for the refusal tests);
  - "main": a development build (".dev" in the version, as setuptools_scm numbers vLLM's main
    after a release: "0.33.1.dev42+g..."), the base class read with `abort_weight_update`
    (a no-op default) and `WeightTransferConfig.weight_format`;
  - "0.33": any other version (the newest releases read, 0.32.x / 0.33.x: no abort anywhere,
    no `trainer_send_weights`).
"""
import os
import re

__version__ = os.environ.get("VLLM_STANDIN_VERSION", "0.33.0")


def _generation(version):
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is not None and (int(match.group(1)), int(match.group(2))) < (0, 30):
        return "0.29"
    return "main" if ".dev" in version else "0.33"


STANDIN_GENERATION = _generation(__version__)
