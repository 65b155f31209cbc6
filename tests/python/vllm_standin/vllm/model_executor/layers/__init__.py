"""Stand-in (see ../../../README.md): only the attention classes the reload code names."""
