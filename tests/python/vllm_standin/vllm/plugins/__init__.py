"""Stand-in of vllm/plugins/__init__.py (see ../../README.md), as read at vllm-project/vllm @
a27dcf13 (the same calls at 01425553): `load_general_plugins()` runs once per process (a module
flag); it loads the entry points of group "vllm.general_plugins" (only the names listed in
`VLLM_PLUGINS`, comma-separated, when it is set) and logs, without raising, an entry point that
fails to *load*, then calls every loaded function **without catching**: a plugin function that
raises stops the process that loads it (vLLM calls this in its API server, engine core and every
worker process, whatever weight-transfer backend is configured). Written for the tests."""

import logging
import os

logger = logging.getLogger(__name__)

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"

plugins_loaded = False


def load_plugins_by_group(group):
    from importlib.metadata import entry_points

    allowed = os.environ.get("VLLM_PLUGINS")
    allowed = None if allowed is None else allowed.split(",")
    loaded = {}
    for plugin in entry_points(group=group):
        if allowed is not None and plugin.name not in allowed:
            continue
        try:
            loaded[plugin.name] = plugin.load()
        except Exception:  # noqa: BLE001 - upstream logs a plugin it cannot import.
            logger.exception("Failed to load plugin %s", plugin.name)
    return loaded


def load_general_plugins():
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()  # Not caught, as upstream.
