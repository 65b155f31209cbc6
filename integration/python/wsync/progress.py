"""A progress line for people while a sync runs: rounds and bytes of this process, on stderr, for
syncs longer than a second. Off when stderr is not a terminal or WSYNC_PROGRESS=0 (unless asked
for explicitly)."""

import os
import sys
import threading

_MIB = 1024.0 * 1024.0


def wanted(show, stream=None):
    """Whether to show the line: `show` when True or False; with None, when `stream` (stderr)
    is a terminal and WSYNC_PROGRESS is not '0'."""
    if show is not None:
        return bool(show)
    stream = stream or sys.stderr
    if os.environ.get("WSYNC_PROGRESS", "") == "0":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def describe(what, progress):
    """'push version 5: transferring, round 3/10, 1.5/4.0 MiB' from Session.progress()."""
    text = f"{what} version {progress['version']}: {progress['phase']}"
    if progress["rounds_total"] > 0:
        text += (f", round {progress['rounds_done']}/{progress['rounds_total']}, "
                 f"{progress['bytes_done'] / _MIB:.1f}/{progress['bytes_total'] / _MIB:.1f} MiB")
    return text


class ProgressLine:
    """Context manager around one sync of `session`: after `after` seconds, rewrites one line on
    `stream` every `interval` seconds with describe(); on exit ends the line (if one was shown).
    A thread reads Session.progress(), which never blocks; the sync runs on the caller's thread
    (ctypes releases the GIL while it is in the library)."""

    def __init__(self, session, what, show=None, stream=None, after=1.0, interval=0.2):
        self._session = session
        self._what = what
        self._stream = stream or sys.stderr
        self._on = wanted(show, self._stream)
        self._after = after
        self._interval = interval
        self._stop = threading.Event()
        self._thread = None
        self._shown = False

    def _run(self):
        if self._stop.wait(self._after):
            return
        while True:
            try:
                line = describe(self._what, self._session.progress())
            except Exception:  # A finalized session: nothing more to show.
                return
            self._stream.write("\r\x1b[K" + line)
            self._stream.flush()
            self._shown = True
            if self._stop.wait(self._interval):
                return

    def __enter__(self):
        if self._on:
            self._thread = threading.Thread(target=self._run, name="wsync-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._shown:
                try:
                    line = describe(self._what, self._session.progress())
                    self._stream.write("\r\x1b[K" + line + "\n")
                except Exception:
                    self._stream.write("\n")
                self._stream.flush()
        return False
