"""Session: one wsync session of this process, mirroring the C ABI call for call."""

import ctypes
import os

from . import _lib
from ._lib import MemoryKind, QuantScheme, Role, State, Status, WsyncError

_TORCH_DTYPES = {
    "torch.float32": "fp32", "torch.float": "fp32",
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16", "torch.half": "fp16",
    "torch.int8": "int8", "torch.int32": "int32", "torch.int64": "int64",
    "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e5m2",
}


def dtype_name(dtype):
    """wsync's spelling of a dtype: a torch.dtype or a string the ABI accepts."""
    if isinstance(dtype, str):
        return dtype
    name = _TORCH_DTYPES.get(str(dtype))
    if name is None:
        raise WsyncError(Status.INVALID_ARGUMENT, f"dtype {dtype} has no wsync equivalent",
                         "dtype_name")
    return name


def _role(role):
    if isinstance(role, str):
        try:
            return Role[role.upper()]
        except KeyError:
            raise WsyncError(Status.INVALID_ARGUMENT,
                             f"role must be 'trainer' or 'rollout', not {role!r}", "init")
    return Role(role)


_QUANT_SCHEMES = {"fp8_block": QuantScheme.FP8_BLOCK, "fp8_channel": QuantScheme.FP8_CHANNEL,
                  "fp8_tensor": QuantScheme.FP8_TENSOR}


def _quant_scheme(scheme):
    if isinstance(scheme, QuantScheme):
        return scheme
    if scheme not in _QUANT_SCHEMES:
        raise WsyncError(Status.INVALID_ARGUMENT,
                         f"unknown FP8 scheme {scheme!r}; expected one of "
                         f"{', '.join(_QUANT_SCHEMES)}", "declare_fp8_parameter")
    return _QUANT_SCHEMES[scheme]


def _bytes(text):
    return None if text is None else str(text).encode("utf-8")


def parse_coordinator(coordinator):
    """'host:port' (or ':port', or an int port) -> (host, port)."""
    if isinstance(coordinator, int):
        return "127.0.0.1", coordinator
    host, _, port = str(coordinator).rpartition(":")
    try:
        return (host or "127.0.0.1"), int(port)
    except ValueError:
        raise WsyncError(Status.INVALID_ARGUMENT,
                         f"coordinator must be 'host:port', not {coordinator!r}", "init")


# Secrets read from the environment, by variable name: the variable is removed once read (so that
# processes started later do not inherit it), and a later session of this process (an engine's
# replacement of an aborted session) finds the secret here.
_env_secrets = {}


def _secret_from_environment(name):
    value = os.environ.pop(name, None)
    if value is not None:  # One trailing newline dropped, as the library does.
        value = value[:-1] if value.endswith("\n") else value
        _env_secrets[name] = value[:-1] if value.endswith("\r") else value
    return _env_secrets.get(name)


def _setting_text(row, value):
    """A keyword's value as the text config_set takes (WSYNC_<NAME>'s syntax); None: unset (None,
    False, 0 and "" leave the field unset, as a zero field does in the C ABI)."""
    if value is None or value is False or value == "" or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0):
        return None
    if value is True:
        if row["name"] == "verify":  # verify=True: per-chunk hashes.
            return "hash"
        if row["type"] == "bool":
            return "true"
    return str(value)


class Session:
    """One process's session.

    Who this process is: role ('trainer' | 'rollout'), rank, num_trainers, num_rollouts, job_id,
    host_coordinator (trainer rank 0 runs the coordinator), device_index (this process's GPU as
    its node numbers it, not relative to CUDA_VISIBLE_DEVICES; None: unknown; processes of one
    node on one GPU are "same_device", wsync.placement.device gives the named layouts' choice),
    coordinator ('host:port', instead of coordinator_host and coordinator_port), and secret (the
    job secret itself, str or bytes: handed to init in memory, in a buffer wiped after it).

    Every other keyword is a setting of the loaded library's table (wsync.settings(), `wsync
    settings`: name, type, default, variable, help), e.g. deadline_seconds, staging_budget_bytes,
    replica_policy, path_transports, verify ("off", "hash" or True, "keyed"), delta ("off",
    "auto", "on"; every process of the job must pass the same), metrics_address, secret_file,
    secret_env (default WSYNC_SECRET: the variable is removed from the environment once read, so
    that processes started later do not inherit it; later sessions of this process find it in
    the process's memory). The library parses each value as it parses the setting's variable and
    refuses one that does not parse, naming it. A keyword left out (or None, False, 0, "") is
    unset: the setting's variable WSYNC_<NAME> applies, else its default. An unknown keyword is a
    TypeError listing the settings.

    Buffers registered here must stay allocated, at the same address, until finalize().
    """

    def __init__(self, role, rank=0, num_trainers=1, num_rollouts=1, job_id="wsync",
                 coordinator=None, host_coordinator=False, device_index=None, secret=None,
                 **settings):
        self._api = _lib.load()
        self._handle = None
        self._callbacks = None
        self._wave_callback = None
        self._wave_error = None  # What the wave callback raised in the running sync.
        self._keep = {}  # Buffer id -> the object whose memory the session was given.
        rows = {row["name"]: row for row in _lib.settings()}
        unknown = sorted(name for name in settings if name not in rows or name == "secret")
        if unknown:
            raise TypeError(f"Session() got unknown keyword argument(s) {', '.join(unknown)}; the "
                            f"settings are: {', '.join(n for n in rows if n != 'secret')}")
        if coordinator is not None:
            settings["coordinator_host"], settings["coordinator_port"] = \
                parse_coordinator(coordinator)
        secret_file = settings.get("secret_file")
        secret_env = settings.pop("secret_env", None)
        config = _lib.Config()
        config.struct_size = ctypes.sizeof(_lib.Config)
        config.role = int(_role(role))
        config.rank = int(rank)
        config.num_trainers = int(num_trainers)
        config.num_rollouts = int(num_rollouts)
        config.job_id = _bytes(job_id)
        config.host_coordinator = 1 if host_coordinator else 0
        if device_index is not None:
            config.has_device_index = 1
            config.device_index = int(device_index)
        texts = []  # config_set keeps pointers to text settings until init returns.
        for name, value in settings.items():
            text = _setting_text(rows[name], value)
            if text is None:
                continue
            texts.append(text.encode("utf-8"))
            _lib.check(self._api.config_set(ctypes.byref(config), name.encode("utf-8"),
                                            texts[-1]), None, f"init ({name}={value!r})")
        secret_buffer = None
        try:
            if secret is not None:
                if secret_file is not None or secret_env is not None:
                    raise WsyncError(Status.INVALID_ARGUMENT,
                                     "give one of secret, secret_file, secret_env", "init")
            elif secret_file is None:
                secret = _secret_from_environment(secret_env or rows["secret_env"]["default"])
                if secret is None:  # The library names the variable in its error.
                    config.secret_env = _bytes(secret_env)
            else:
                config.secret_env = _bytes(secret_env)  # Both: the library refuses them.
            if secret is not None:
                raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
                secret_buffer = ctypes.create_string_buffer(raw, len(raw))
                config.secret = ctypes.addressof(secret_buffer)
                config.secret_length = len(raw)
            handle = ctypes.c_void_p()
            code = self._api.init(ctypes.byref(config), ctypes.byref(handle))
            _lib.check(code, None, "init")
            self._handle = handle.value
        finally:
            if secret_buffer is not None:
                ctypes.memset(secret_buffer, 0, len(secret_buffer))
        self.role = _role(role)
        self.rank = int(rank)

    # -- helpers --------------------------------------------------------------------------------
    def _check(self, code, call):
        return _lib.check(code, self._handle, call)

    def _live(self, call):
        if self._handle is None:
            raise WsyncError(Status.INVALID_ARGUMENT, "the session is finalized", call)
        return self._handle

    def _text(self, fn, call):
        handle = self._live(call)
        size = ctypes.c_size_t(0)
        self._check(fn(handle, None, ctypes.byref(size)), call)
        while True:
            buffer = ctypes.create_string_buffer(size.value)
            fetched = ctypes.c_size_t(size.value)
            self._check(fn(handle, buffer, ctypes.byref(fetched)), call)
            if fetched.value <= size.value:
                return buffer.value.decode("utf-8", "replace")
            size = fetched  # It grew in between.

    # -- layout (REGISTERED) --------------------------------------------------------------------
    def register_buffer(self, buffer_id, address, nbytes, kind=MemoryKind.HOST, device=0,
                        keep=None):
        """Registers [address, address + nbytes). `keep` (e.g. the tensor or storage) is held
        until finalize, or until the buffer is rebound, so the memory stays alive."""
        self._check(self._api.register_buffer(self._live("register_buffer"), int(buffer_id),
                                              ctypes.c_void_p(int(address)), int(nbytes),
                                              int(kind), int(device)), "register_buffer")
        if keep is not None:
            self._keep[int(buffer_id)] = keep

    def rebind_buffer(self, buffer_id, address, keep=None):
        """After connect, between syncs: buffer `buffer_id` now lives at `address` (same size,
        kind and device; e.g. weights reallocated by an engine's sleep and wake-up). The plan
        and its digest stay; the old memory is no longer touched, and the session lets go of what
        kept it (register_buffer's `keep`). `keep` is held until finalize or the next rebind."""
        api = _lib.require("rebind_buffer")
        self._check(api.rebind_buffer(self._live("rebind_buffer"), int(buffer_id),
                                      ctypes.c_void_p(int(address))), "rebind_buffer")
        if keep is None:
            self._keep.pop(int(buffer_id), None)
        else:
            self._keep[int(buffer_id)] = keep

    def declare_parameter(self, name, dtype, shape):
        shape = list(shape)
        self._check(self._api.declare_parameter(self._live("declare_parameter"), _bytes(name),
                                                _bytes(dtype_name(dtype)), len(shape),
                                                _lib.int64_array(shape)), "declare_parameter")

    def declare_piece(self, parameter, buffer_id, origin, extent, offset, strides):
        origin, extent, strides = list(origin), list(extent), list(strides)
        if not len(origin) == len(extent) == len(strides):
            raise WsyncError(Status.INVALID_ARGUMENT,
                             f"piece of {parameter}: origin, extent and strides differ in length",
                             "declare_piece")
        self._check(self._api.declare_piece(self._live("declare_piece"), _bytes(parameter),
                                            int(buffer_id), len(origin),
                                            _lib.int64_array(origin), _lib.int64_array(extent),
                                            int(offset), _lib.int64_array(strides)),
                    "declare_piece")

    def declare_fp8_parameter(self, name, scheme, scale_name, scale_shape, block=None,
                              scale_dtype="fp32"):
        """Declares parameter `name` (declared before as "fp8_e4m3"; rollouts only) as FP8
        quantized by `scheme` ("fp8_block", "fp8_channel", "fp8_tensor" or a QuantScheme), and
        its fp32 scale tensor `scale_name` of `scale_shape`, whose pieces follow with
        declare_piece. `block`: (rows, cols) of fp8_block's blocks, None for 128 x 128."""
        scheme = _quant_scheme(scheme)
        scale_shape = [int(s) for s in scale_shape]
        rows, cols = (0, 0) if block is None else (int(block[0]), int(block[1]))
        fp8 = _lib.Fp8Parameter()
        fp8.struct_size = ctypes.sizeof(_lib.Fp8Parameter)
        fp8.parameter = _bytes(name)
        fp8.scheme = int(scheme)
        fp8.scale_num_axes = len(scale_shape)
        fp8.block_rows, fp8.block_cols = rows, cols
        fp8.scale_name = _bytes(scale_name)
        fp8.scale_dtype = _bytes(dtype_name(scale_dtype))
        shape = _lib.int64_array(scale_shape)
        fp8.scale_shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        api = _lib.require("declare_fp8_parameter")
        self._check(api.declare_fp8_parameter(self._live("declare_fp8_parameter"),
                                              ctypes.byref(fp8)), "declare_fp8_parameter")

    def set_parameter_wave(self, name, wave):
        """Puts declared parameter `name` of this rollout in wave `wave` (0 .. 4095) of a streamed
        sync: waves move in order, each landing whole on every process (and its wave callback
        run) before the next moves; parameters of different waves may share memory."""
        api = _lib.require("set_parameter_wave")
        self._check(api.set_parameter_wave(self._live("set_parameter_wave"), _bytes(name),
                                           int(wave)), "set_parameter_wave")

    def set_wave_callback(self, fn):
        """fn(version, wave) runs on the thread running the sync after each wave landed, before
        the next moves (None: none). An exception it raises fails the sync on every process; the
        sync then raises WsyncError naming the wave, whose `wave_error` is the exception."""
        api = _lib.require("set_wave_callback")
        if fn is None:
            callback = _lib.WaveFn()
        else:
            def call(user, version, wave):
                try:
                    fn(int(version), int(wave))
                    return int(Status.OK)
                except BaseException as error:  # noqa: BLE001 - nothing may propagate into C.
                    self._wave_error = error
                    return int(Status.INTERNAL)
            callback = _lib.WaveFn(call)
        self._check(api.set_wave_callback(self._live("set_wave_callback"), callback, None),
                    "set_wave_callback")
        self._wave_callback = callback  # Alive while a sync may call it.

    def set_manifest(self, data):
        data = bytes(data)
        self._check(self._api.set_manifest(self._live("set_manifest"), data, len(data)),
                    "set_manifest")

    def set_named_layout(self, model, layout):
        self._check(self._api.set_named_layout(self._live("set_named_layout"), _bytes(model),
                                               _bytes(layout)), "set_named_layout")

    def set_update_callbacks(self, before=None, after=None):
        """Rollout, trainer-triggered mode: before(version) and after(version, status) run on the
        session's background thread around every sync the trainer starts. Exceptions raised by
        them are printed and swallowed (they cannot cross into C)."""

        def guard(fn, *args):
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - nothing may propagate into C.
                import traceback
                traceback.print_exc()

        before_c = _lib.BeforeUpdateFn(lambda user, v: guard(before, v)) if before else \
            _lib.BeforeUpdateFn()
        after_c = _lib.AfterUpdateFn(lambda user, v, s: guard(after, v, Status(s))) if after else \
            _lib.AfterUpdateFn()
        self._check(self._api.set_update_callbacks(self._live("set_update_callbacks"), before_c,
                                                   after_c, None), "set_update_callbacks")
        self._callbacks = (before_c, after_c)  # Alive while the thread may call them.

    # -- job -------------------------------------------------------------------------------------
    def connect(self):
        self._check(self._api.connect(self._live("connect")), "connect")

    def schedule_report(self):
        return self._text(self._api.schedule_report, "schedule_report")

    def metrics_text(self):
        return self._text(self._api.metrics_text, "metrics_text")

    def listening_ports(self):
        """(metrics_port, coordinator_port), 0 for none: the exporter's port from init, the hosted
        coordinator's once connect started it (safe from another thread while connect waits)."""
        metrics_port, coordinator_port = ctypes.c_int32(0), ctypes.c_int32(0)
        self._check(self._api.listening_ports(self._live("listening_ports"),
                                              ctypes.byref(metrics_port),
                                              ctypes.byref(coordinator_port)), "listening_ports")
        return metrics_port.value, coordinator_port.value

    def _check_sync(self, code, call):
        try:
            return self._check(code, call)
        except WsyncError as error:
            cause, self._wave_error = self._wave_error, None
            if cause is None:
                raise
            error.wave_error = cause
            raise error from cause

    def sync(self, version):
        self._wave_error = None
        self._check_sync(self._api.sync(self._live("sync"), int(version)), "sync")

    def sync_begin(self, version):
        self._wave_error = None
        self._check(self._api.sync_begin(self._live("sync_begin"), int(version)), "sync_begin")

    def sync_test(self):
        """True when the sync started by sync_begin committed, False while it runs; raises its
        error."""
        return self._check_sync(self._api.sync_test(self._live("sync_test")),
                                "sync_test") == Status.OK

    def abort(self, reason="aborted by the host"):
        if self._handle is not None:
            self._check(self._api.abort(self._handle, _bytes(reason)), "abort")

    def state(self):
        """(State, version)."""
        version = ctypes.c_int64(-1)
        state = ctypes.c_int(0)
        self._check(self._api.state(self._live("state"), ctypes.byref(version),
                                    ctypes.byref(state)), "state")
        return State(state.value), version.value

    def stats(self):
        """What the last sync of this process did, as a dict."""
        stats = _lib.Stats()
        stats.struct_size = ctypes.sizeof(_lib.Stats)
        self._check(self._api.stats(self._live("stats"), ctypes.byref(stats)), "stats")
        return {name: getattr(stats, name) for name, _ in _lib.Stats._fields_[1:]}

    def progress(self):
        """Where this process stands in its current (or last) sync, as a dict: version, phase
        ('idle', 'agreeing', 'transferring', 'verifying', 'voting'), rounds_done, rounds_total,
        bytes_done, bytes_total, committed_version (-1: none). Safe from another thread while
        sync runs."""
        progress = _lib.Progress()
        progress.struct_size = ctypes.sizeof(_lib.Progress)
        api = _lib.require("progress")
        self._check(api.progress(self._live("progress"), ctypes.byref(progress)), "progress")
        out = {name: getattr(progress, name) for name, _ in _lib.Progress._fields_[1:]}
        phase = out["phase"]
        out["phase"] = _lib.PHASES[phase] if 0 <= phase < len(_lib.PHASES) else "unknown"
        return out

    def last_error(self):
        return _lib.last_error(self._handle) if self._handle is not None else ""

    def finalize(self):
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        try:
            _lib.check(self._api.finalize(handle), None, "finalize")
        finally:
            self._keep = {}
            self._callbacks = None
            self._wave_callback = None

    @property
    def finalized(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False

    def __del__(self):
        try:
            self.finalize()
        except Exception:  # noqa: BLE001
            pass
