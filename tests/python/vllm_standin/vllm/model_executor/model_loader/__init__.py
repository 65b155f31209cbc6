"""Stand-in (see ../../../README.md): model_loader.reload and weight_utils.default_weight_loader."""
