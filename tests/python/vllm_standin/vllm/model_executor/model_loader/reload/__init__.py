"""Stand-in of vllm/model_executor/model_loader/reload/__init__.py (see ../../../../README.md):
the layerwise reload bracket, as exported upstream (@ 030ea52e); LAYERWISE_INFO stays in
.layerwise, as upstream."""

from .layerwise import (  # noqa: F401
    finalize_layerwise_processing,
    finalize_layerwise_reload,
    initialize_layerwise_reload,
    record_metadata_for_reloading,
)
