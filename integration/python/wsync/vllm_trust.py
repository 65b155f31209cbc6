"""What a vLLM worker trusts (issue 42): the job's coordinator, the secret source and the rule
regexes come from the engine's launch configuration (the environment of the engine process),
never from an init request, which vLLM's RLHF route takes from any HTTP client of the engine
(``POST /init_weight_transfer_engine``, vllm/entrypoints/serve/dev/rlhf/api_router.py, forwards
its ``init_info`` to every worker's ``parse_init_info``)."""

import dataclasses
import json
import os
from typing import List, Optional

from . import _lib
from ._lib import Status, WsyncError

# Init-info fields an engine request may not set, with where the engine takes each from.
LAUNCH_ONLY_FIELDS = {
    "secret_file": "$WSYNC_SECRET_FILE (else $WSYNC_SECRET) of the engine process",
    "secret_env": "$WSYNC_SECRET_FILE (else $WSYNC_SECRET) of the engine process",
    "secret": "$WSYNC_SECRET_FILE (else $WSYNC_SECRET) of the engine process",
    "extra_rules": "$WSYNC_RULES of the engine process",
    "landing_rules": "$WSYNC_RULES of the engine process",
    "skip": "$WSYNC_RULES of the engine process",
}

_RULE_KEYS = ("extra_rules", "landing_rules", "skip")


@dataclasses.dataclass
class LaunchConfig:
    """What the engine trusts, fixed when the engine process was launched (its environment,
    which no engine request can change):

    WSYNC_COORDINATOR_PORT, WSYNC_COORDINATOR_HOST
                       the job's coordinator: the settings' variables (`wsync settings`; the
                       port required, the host defaulting as the setting does); a request's
                       ``coordinator`` must be this one, 'host:port' (or absent)
    WSYNC_SECRET_FILE  a file holding the job secret; else WSYNC_SECRET holds the secret
    WSYNC_RULES        optional JSON object: "extra_rules" ([pattern, kind, targets...] rows),
                       "landing_rules" ([pattern, "direct" | "loader"] rows), "skip" (patterns
                       of local names to leave out)
    """
    coordinator: str
    secret_file: Optional[str] = None
    secret_env: Optional[str] = None  # None: the setting's default (WSYNC_SECRET)
    extra_rules: List[List[str]] = dataclasses.field(default_factory=list)
    landing_rules: List[List[str]] = dataclasses.field(default_factory=list)
    skip: List[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_environment(cls, environ=None):
        environ = os.environ if environ is None else environ
        call = "init_transfer_engine"
        port = environ.get("WSYNC_COORDINATOR_PORT", "").strip()
        if not port:
            old = environ.get("WSYNC_COORDINATOR", "").strip()
            raise WsyncError(Status.INVALID_ARGUMENT, "the engine's launch configuration names "
                             "no coordinator: set WSYNC_COORDINATOR_PORT (and "
                             "WSYNC_COORDINATOR_HOST) in the vLLM engine's environment (an init "
                             "request cannot choose it)"
                             + (f"; WSYNC_COORDINATOR={old!r} is no longer read" if old else ""),
                             call)
        host = (environ.get("WSYNC_COORDINATOR_HOST", "").strip()
                or _lib.setting("coordinator_host")["default"])
        coordinator = f"{host}:{port}"
        secret_file = environ.get("WSYNC_SECRET_FILE") or None
        rules = {}
        text = environ.get("WSYNC_RULES", "").strip()
        if text:
            try:
                rules = json.loads(text)
            except ValueError as error:
                raise WsyncError(Status.INVALID_ARGUMENT, f"WSYNC_RULES is not JSON: {error}",
                                 call) from None
            unknown = sorted(set(rules) - set(_RULE_KEYS)) if isinstance(rules, dict) else None
            if unknown is None or unknown:
                raise WsyncError(Status.INVALID_ARGUMENT, "WSYNC_RULES must be a JSON object "
                                 f"with keys among {', '.join(_RULE_KEYS)}"
                                 + (f", not {', '.join(unknown)}" if unknown else ""), call)
        return cls(coordinator=coordinator, secret_file=secret_file,
                   secret_env=None if secret_file else _lib.setting("secret_env")["default"],
                   **{k: list(rules.get(k, [])) for k in _RULE_KEYS})

    def check_request(self, info):
        """Refuses a request whose coordinator is not this configuration's."""
        if info.coordinator is not None and info.coordinator != self.coordinator:
            raise WsyncError(Status.INVALID_ARGUMENT, f"init_info field 'coordinator' "
                             f"({info.coordinator!r}) is not the engine's launch configuration "
                             f"(WSYNC_COORDINATOR_HOST/_PORT: {self.coordinator!r}): a request "
                             "cannot "
                             "redirect the engine", "init_transfer_engine")


def refuse_launch_only_fields(init_dict):
    """Raises WsyncError(INVALID_ARGUMENT) naming the fields of an init request that only the
    engine's launch configuration may set."""
    names = sorted(set(init_dict or ()) & set(LAUNCH_ONLY_FIELDS))
    if names:
        raise WsyncError(Status.INVALID_ARGUMENT, "init_info field(s) refused: " + "; ".join(
            f"{name!r} (the engine takes it from {LAUNCH_ONLY_FIELDS[name]})" for name in names)
            + ": an engine request cannot choose the secret, the coordinator or rules",
            "parse_init_info")
