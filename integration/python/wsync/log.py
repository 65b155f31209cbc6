"""wsync's trace in Python ``logging`` (the C ABI's set_log, wsync.h).

``route_to_logging()`` hands every line the library delivers to the logger ``wsync.<category>``
(``wsync.connect``, ``wsync.plan``, ``wsync.round``, ``wsync.sync``, ``wsync.fault``,
``wsync.control``, ``wsync.transport``, ``wsync.config``) at the matching level, so that a vLLM or
SGLang adapter's lines and wsync's go through the engine's own handlers. Process-wide, like the C
call. ``WSYNC_LOG`` and ``WSYNC_LOG_LEVEL``, when set in the environment, take precedence over the
arguments (the operator's choice wins). ``stop_routing()`` (also run at interpreter exit) restores
the library's default: standard error, and only what ``WSYNC_LOG`` asks for.

The library calls in from its own threads; ctypes takes the GIL for each line. The handler must
not call into wsync (such a line is dropped).
"""

import atexit
import logging
import threading

from . import _lib

# wsync_log_level_t -> logging levels.
_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}
_lock = threading.Lock()
_callback = None  # The ctypes function the library holds: kept alive while installed.


def abi_level(level):
    """The wsync_log_level_t that delivers what a logger at logging level ``level`` shows."""
    if level <= logging.DEBUG:
        return 4
    if level <= logging.INFO:
        return 3
    if level <= logging.WARNING:
        return 2
    return 1


def route_to_logging(logger=None, categories="all", level=None):
    """Routes wsync's lines to ``logger`` (default ``logging.getLogger("wsync")``), each to its
    child ``<logger>.<category>``. ``categories``: a comma list as WSYNC_LOG takes, or "all".
    ``level``: a logging level; default the logger's effective level. Raises WsyncError
    (INVALID_ARGUMENT) for an unknown category, and UNSUPPORTED for a library without set_log."""
    logger = logger if logger is not None else logging.getLogger("wsync")
    level = logger.getEffectiveLevel() if level is None else level
    children = {}

    def deliver(_user, abi_level_value, category, line):
        try:
            name = category.decode("utf-8", "replace")
            child = children.get(name)
            if child is None:
                child = children.setdefault(name, logger.getChild(name))
            child.log(_LEVELS.get(abi_level_value, logging.INFO),
                      line.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - nothing may propagate into the library's thread.
            pass

    global _callback
    api = _lib.require("set_log")
    callback = _lib.LogFn(deliver)
    with _lock:
        _lib.check(api.set_log(callback, None, categories.encode(), abi_level(level)), None,
                   "set_log")
        _callback = callback  # The previous one is no longer called once set_log returned.


def stop_routing():
    """Back to the library's default sink; the Python callback is released."""
    global _callback
    with _lock:
        if _callback is None:
            return
        _lib.check(_lib.load().set_log(_lib.LogFn(), None, None, 0), None, "set_log")
        _callback = None


atexit.register(stop_routing)
