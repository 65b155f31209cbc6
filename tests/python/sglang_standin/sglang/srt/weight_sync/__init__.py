"""Stand-in package (see tests/python/sglang_standin/README.md)."""
