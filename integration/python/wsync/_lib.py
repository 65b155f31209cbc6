"""ctypes binding over libwsync.so's C ABI (plugin/include/wsync/wsync.h, ABI version 1).

The library is found, in this order, at ``$WSYNC_LIBRARY``, next to this package
(``wsync/libwsync.so``), or by the dynamic loader's search path (``libwsync.so``). It is loaded
once per process with ``RTLD_LOCAL``; the exported table ``wsyncPlugin_v1`` is the only symbol
used. ctypes releases the GIL around every call, so a blocking ``sync`` does not stall other
Python threads.

Every status other than ``WSYNC_OK`` becomes :class:`WsyncError`, carrying the status ``code``
(an :class:`Status`), the C call that failed and the session's ``last_error`` text.
"""

import ctypes
import enum
import os
import threading

ABI_VERSION = 1


class Status(enum.IntEnum):
    OK = 0
    IN_PROGRESS = 1
    INVALID_ARGUMENT = 2
    LAYOUT_REFUSED = 3
    RANKS_DISAGREE = 4
    TIMED_OUT = 5
    PEER_LOST = 6
    ABORTED = 7
    NO_MEMORY = 8
    AUTHENTICATION = 9
    UNSUPPORTED = 10
    INTERNAL = 11


class Role(enum.IntEnum):
    TRAINER = 1
    ROLLOUT = 2


class MemoryKind(enum.IntEnum):
    HOST = 1
    CUDA = 2


class State(enum.IntEnum):
    REGISTERED = 1
    CONNECTED = 2
    IDLE = 3
    SYNCING = 4
    DIRTY = 5


class QuantScheme(enum.IntEnum):
    """wsync_quant_scheme_t: how an FP8 target parameter is scaled (declare_fp8_parameter)."""
    FP8_BLOCK = 1    # Blocks (default 128 x 128), vLLM's "<module>.weight_scale_inv".
    FP8_CHANNEL = 2  # One scale per output row, "<module>.weight_scale" [rows, 1].
    FP8_TENSOR = 3   # One scale per matrix, "<module>.weight_scale" [1, 1].


class WsyncError(RuntimeError):
    """A wsync call failed. ``code`` is a :class:`Status`, ``message`` the session's last_error,
    ``call`` the C function that returned it."""

    def __init__(self, code, message, call=""):
        try:
            code = Status(code)
        except ValueError:
            pass
        self.code = code
        self.message = message
        self.call = call
        name = code.name if isinstance(code, Status) else str(code)
        super().__init__(f"{call + ': ' if call else ''}WSYNC_{name}: {message}")


class Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("role", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("num_trainers", ctypes.c_int32),
        ("num_rollouts", ctypes.c_int32),
        ("job_id", ctypes.c_char_p),
        ("coordinator_host", ctypes.c_char_p),
        ("coordinator_port", ctypes.c_int32),
        ("host_coordinator", ctypes.c_int32),
        ("secret_file", ctypes.c_char_p),
        ("secret_env", ctypes.c_char_p),
        ("node_id", ctypes.c_char_p),
        ("staging_budget_bytes", ctypes.c_int64),
        ("deadline_seconds", ctypes.c_double),
        ("replica_policy", ctypes.c_char_p),
        ("path_transports", ctypes.c_char_p),
        ("metrics_address", ctypes.c_char_p),
        ("calibration_file", ctypes.c_char_p),
        ("verify", ctypes.c_int32),
        ("heartbeat_interval_seconds", ctypes.c_double),
        ("silence_limit_seconds", ctypes.c_double),
        ("has_device_index", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("delta", ctypes.c_int32),
        ("secret", ctypes.c_void_p),
        ("secret_length", ctypes.c_size_t),
        ("metrics_allow_any_address", ctypes.c_int32),
        ("delta_budget_bytes", ctypes.c_int64),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_int64),
        ("segments", ctypes.c_int64),
        ("chunks", ctypes.c_int64),
        ("rounds", ctypes.c_int64),
        ("sent_bytes", ctypes.c_int64),
        ("received_bytes", ctypes.c_int64),
        ("local_copy_bytes", ctypes.c_int64),
        ("direct_bytes", ctypes.c_int64),
        ("staged_bytes", ctypes.c_int64),
        ("peak_arena_bytes", ctypes.c_int64),
        ("seconds", ctypes.c_double),
        ("verified_chunks", ctypes.c_int64),
        ("delta_messages", ctypes.c_int64),
        ("delta_saved_bytes", ctypes.c_int64),
        ("delta_compared_elements", ctypes.c_int64),
        ("delta_changed_elements", ctypes.c_int64),
        ("delta_encode_seconds", ctypes.c_double),
        ("delta_apply_seconds", ctypes.c_double),
    ]


class Progress(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_int64),
        ("rounds_done", ctypes.c_int64),
        ("rounds_total", ctypes.c_int64),
        ("bytes_done", ctypes.c_int64),
        ("bytes_total", ctypes.c_int64),
        ("committed_version", ctypes.c_int64),
        ("phase", ctypes.c_int32),
    ]


PHASES = ("idle", "agreeing", "transferring", "verifying", "voting")


_status = ctypes.c_int
_session = ctypes.c_void_p
_i64p = ctypes.POINTER(ctypes.c_int64)

BeforeUpdateFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
AfterUpdateFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int)
WaveFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)
LogFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_char_p)


class Fp8Parameter(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("parameter", ctypes.c_char_p),
        ("scheme", ctypes.c_int32),
        ("scale_num_axes", ctypes.c_int32),
        ("block_rows", ctypes.c_int64),
        ("block_cols", ctypes.c_int64),
        ("scale_name", ctypes.c_char_p),
        ("scale_dtype", ctypes.c_char_p),
        ("scale_shape", ctypes.POINTER(ctypes.c_int64)),
    ]


class SettingInfo(ctypes.Structure):
    """wsync_setting_info_t: one row of the library's settings table (setting_info)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("type", ctypes.c_char_p),
        ("offset", ctypes.c_size_t),
        ("default_value", ctypes.c_char_p),
        ("default_note", ctypes.c_char_p),
        ("variable", ctypes.c_char_p),
        ("help", ctypes.c_char_p),
        ("choices", ctypes.c_char_p),
    ]


class PluginV1(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("abi_version", ctypes.c_int32),
        ("init", ctypes.CFUNCTYPE(_status, ctypes.POINTER(Config), ctypes.POINTER(_session))),
        ("register_buffer", ctypes.CFUNCTYPE(_status, _session, ctypes.c_uint64, ctypes.c_void_p,
                                             ctypes.c_uint64, ctypes.c_int, ctypes.c_int32)),
        ("declare_parameter", ctypes.CFUNCTYPE(_status, _session, ctypes.c_char_p, ctypes.c_char_p,
                                               ctypes.c_int32, _i64p)),
        ("declare_piece", ctypes.CFUNCTYPE(_status, _session, ctypes.c_char_p, ctypes.c_uint64,
                                           ctypes.c_int32, _i64p, _i64p, ctypes.c_int64, _i64p)),
        ("set_manifest", ctypes.CFUNCTYPE(_status, _session, ctypes.c_void_p, ctypes.c_size_t)),
        ("set_named_layout", ctypes.CFUNCTYPE(_status, _session, ctypes.c_char_p, ctypes.c_char_p)),
        ("connect", ctypes.CFUNCTYPE(_status, _session)),
        ("schedule_report", ctypes.CFUNCTYPE(_status, _session, ctypes.c_char_p,
                                             ctypes.POINTER(ctypes.c_size_t))),
        ("sync", ctypes.CFUNCTYPE(_status, _session, ctypes.c_int64)),
        ("sync_begin", ctypes.CFUNCTYPE(_status, _session, ctypes.c_int64)),
        ("sync_test", ctypes.CFUNCTYPE(_status, _session)),
        ("set_update_callbacks", ctypes.CFUNCTYPE(_status, _session, BeforeUpdateFn, AfterUpdateFn,
                                                  ctypes.c_void_p)),
        ("abort", ctypes.CFUNCTYPE(_status, _session, ctypes.c_char_p)),
        ("state", ctypes.CFUNCTYPE(_status, _session, _i64p, ctypes.POINTER(ctypes.c_int))),
        ("stats", ctypes.CFUNCTYPE(_status, _session, ctypes.POINTER(Stats))),
        ("metrics_text", ctypes.CFUNCTYPE(_status, _session, ctypes.c_char_p,
                                          ctypes.POINTER(ctypes.c_size_t))),
        ("listening_ports", ctypes.CFUNCTYPE(_status, _session, ctypes.POINTER(ctypes.c_int32),
                                             ctypes.POINTER(ctypes.c_int32))),
        ("last_error", ctypes.CFUNCTYPE(ctypes.c_char_p, _session)),
        ("finalize", ctypes.CFUNCTYPE(_status, _session)),
        ("progress", ctypes.CFUNCTYPE(_status, _session, ctypes.POINTER(Progress))),
        ("rebind_buffer", ctypes.CFUNCTYPE(_status, _session, ctypes.c_uint64, ctypes.c_void_p)),
        ("declare_fp8_parameter", ctypes.CFUNCTYPE(_status, _session,
                                                   ctypes.POINTER(Fp8Parameter))),
        ("set_parameter_wave", ctypes.CFUNCTYPE(_status, _session, ctypes.c_char_p,
                                                ctypes.c_int32)),
        ("set_wave_callback", ctypes.CFUNCTYPE(_status, _session, WaveFn, ctypes.c_void_p)),
        ("set_log", ctypes.CFUNCTYPE(_status, LogFn, ctypes.c_void_p, ctypes.c_char_p,
                                     ctypes.c_int32)),
        ("setting_count", ctypes.CFUNCTYPE(ctypes.c_int32)),
        ("setting_info", ctypes.CFUNCTYPE(_status, ctypes.c_int32, ctypes.POINTER(SettingInfo))),
        ("config_set", ctypes.CFUNCTYPE(_status, ctypes.POINTER(Config), ctypes.c_char_p,
                                        ctypes.c_char_p)),
    ]


_lock = threading.Lock()
_api = None
_path = None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


class _Elf64Sym(ctypes.Structure):
    _fields_ = [("st_name", ctypes.c_uint32), ("st_info", ctypes.c_uint8),
                ("st_other", ctypes.c_uint8), ("st_shndx", ctypes.c_uint16),
                ("st_value", ctypes.c_uint64), ("st_size", ctypes.c_uint64)]


_RTLD_DL_SYMENT = 1  # <dlfcn.h>


def table_size(table):
    """Bytes of the loaded library's wsyncPlugin_v1 table: its ELF symbol's size (glibc's
    dladdr1), which is sizeof(wsync_plugin_v1_t) of the header the library was built with (plus
    AddressSanitizer's redzone in an ASan build). None when the loader cannot tell (then every
    entry is taken as present)."""
    try:
        dladdr1 = ctypes.CDLL(None).dladdr1
    except AttributeError:
        return None
    dladdr1.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo),
                        ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    dladdr1.restype = ctypes.c_int
    info = _DlInfo()
    symbol = ctypes.c_void_p()
    if not dladdr1(ctypes.addressof(table), ctypes.byref(info), ctypes.byref(symbol),
                   _RTLD_DL_SYMENT) or not symbol.value:
        return None
    return _Elf64Sym.from_address(symbol.value).st_size


def require(entry):
    """The table, after checking that the loaded library has `entry` (one appended to v1 later,
    e.g. "progress", "rebind_buffer", "declare_fp8_parameter"): a library from before it ends
    its table earlier, and calling past the end would jump to whatever follows it. Raises
    WsyncError(UNSUPPORTED) naming the library, the entry and the sizes."""
    api = load()
    field = getattr(PluginV1, entry)
    needed = field.offset + field.size
    if api._size is not None and api._size < needed:
        raise WsyncError(Status.UNSUPPORTED,
                         f"{_path} predates {entry}: its wsyncPlugin_v1 table has {api._size} "
                         f"bytes, {entry} needs {needed} (load a newer libwsync.so)", entry)
    return api


def candidate_paths():
    """Where load() looks, in order."""
    paths = []
    env = os.environ.get("WSYNC_LIBRARY")
    if env:
        paths.append(env)
    paths.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libwsync.so"))
    paths.append("libwsync.so")
    return paths


def load():
    """The plugin's v1 table (loaded on first use); raises WsyncError(UNSUPPORTED) when no
    library is found or its ABI version differs."""
    global _api, _path
    with _lock:
        if _api is not None:
            return _api
        errors = []
        env = os.environ.get("WSYNC_LIBRARY")
        for path in candidate_paths():
            if path != "libwsync.so" and not os.path.exists(path):
                if path == env:  # An explicit path that does not exist is an error.
                    raise WsyncError(Status.UNSUPPORTED,
                                     f"WSYNC_LIBRARY={env} does not exist", "load")
                errors.append(f"{path}: no such file")
                continue
            try:
                library = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            except OSError as error:
                errors.append(f"{path}: {error}")
                if path == env:
                    break
                continue
            try:
                table = PluginV1.in_dll(library, "wsyncPlugin_v1")
            except ValueError:
                raise WsyncError(Status.UNSUPPORTED, f"{path} exports no wsyncPlugin_v1", "load")
            if table.abi_version != ABI_VERSION:
                raise WsyncError(Status.UNSUPPORTED,
                                 f"{path} has ABI version {table.abi_version}, not {ABI_VERSION}",
                                 "load")
            table._library = library  # Keeps the library loaded for the table's lifetime.
            table._size = table_size(table)
            _api, _path = table, path
            return _api
        raise WsyncError(Status.UNSUPPORTED,
                         "cannot load libwsync.so (set WSYNC_LIBRARY, place it next to the wsync "
                         "package, or on the loader path): " + "; ".join(errors), "load")


def library_path():
    """The path the library was loaded from (after load())."""
    load()
    return _path


def last_error(session=None):
    data = load().last_error(session)
    return data.decode("utf-8", "replace") if data else ""


def check(code, session, call):
    """Raises WsyncError for any status but OK (and IN_PROGRESS, returned as is)."""
    if code == Status.OK or code == Status.IN_PROGRESS:
        return Status(code)
    raise WsyncError(code, last_error(session), call)


_settings = None


def settings():
    """The loaded library's settings table (setting_count, setting_info), in wsync_config_t's
    order: one dict per setting with name, type ("bool", "port", "bytes", "seconds", "choice",
    "text", "secret"), offset (in wsync_config_t), default (as its variable is written; "" none),
    default_note, variable ("WSYNC_<NAME>"; "" none), help and choices (a tuple of names for
    "choice")."""
    global _settings
    if _settings is None:
        api = require("config_set")
        rows = []
        for index in range(api.setting_count()):
            info = SettingInfo()
            info.struct_size = ctypes.sizeof(SettingInfo)
            check(api.setting_info(index, ctypes.byref(info)), None, "setting_info")
            text = {name: (getattr(info, name) or b"").decode("utf-8")
                    for name in ("name", "type", "default_value", "default_note", "variable",
                                 "help", "choices")}
            rows.append({"name": text["name"], "type": text["type"], "offset": info.offset,
                         "default": text["default_value"], "default_note": text["default_note"],
                         "variable": text["variable"], "help": text["help"],
                         "choices": tuple(c for c in text["choices"].split(",") if c)})
        _settings = rows
    return _settings


def setting(name):
    """The row of setting `name` (settings()); WsyncError(INVALID_ARGUMENT) when there is none."""
    row = next((row for row in settings() if row["name"] == name), None)
    if row is None:
        raise WsyncError(Status.INVALID_ARGUMENT, f"no setting {name!r}", "setting")
    return row


def setting_value(name):
    """The text of setting `name` in effect where a host leaves its field unset: its variable
    WSYNC_<NAME> when set in this process's environment, else the table's default ("" none)."""
    row = setting(name)
    value = os.environ.get(row["variable"]) if row["variable"] else None
    return value if value else row["default"]


def int64_array(values):
    values = [int(v) for v in values]
    return (ctypes.c_int64 * max(1, len(values)))(*values)
