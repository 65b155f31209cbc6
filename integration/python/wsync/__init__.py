"""wsync: weight sync from RL trainers to rollout engines (Python binding of libwsync.so)."""

from ._lib import MemoryKind, QuantScheme, Role, State, Status, WsyncError, library_path, settings
from .log import route_to_logging, stop_routing
from .session import Session

__all__ = ["MemoryKind", "QuantScheme", "Role", "State", "Status", "WsyncError", "Session",
           "library_path", "settings", "TrainerSync", "RolloutSync", "route_to_logging",
           "stop_routing"]
__version__ = "0.1.0"


def __getattr__(name):  # Lazy: torch is needed only by the helpers.
    if name in ("TrainerSync", "RolloutSync"):
        from . import trainer
        return getattr(trainer, name)
    raise AttributeError(name)
