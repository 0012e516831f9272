"""How a `popeval` command stops on Ctrl-C (SIGINT) or SIGTERM (`kill`, `docker stop`, a
scheduler): both alike, with one line.

`install` is the console script's first step, before JAX is imported. Until the command calls
`now_writing`, a signal ends the process at once (exit code 128 + the signal's number): nothing
is written yet, and the work under way (importing JAX, joining a multi-process run, compiling
an evaluation) may be C code that a Python exception would reach only seconds later, or a
garbage-collection callback that Python runs with exceptions ignored (JAX registers one). A
helper thread woken by the signal (`signal.set_wakeup_fd`) ends the process, so a main thread
busy in C code does not delay it. From `now_writing` on, a signal raises KeyboardInterrupt,
which the command handles: a run saves its last generation and releases its lock, the launcher
stops its processes. A KeyboardInterrupt that Python ignored is raised again. A repeated
SIGTERM (a scheduler's and the launcher's, say) is the same request; a second Ctrl-C while
stopping stops at once (`popeval.cli`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["install", "now_writing", "received", "uninstall"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The byte that asks the helper thread to deliver the last signal again, once.
_AGAIN = b"\0"

_at_once = True  # nothing written yet: a signal ends the process
_mode = threading.Lock()  # held by whichever thread changes `_at_once` or ends the process
_received: int | None = None  # the last signal
_stopping = False  # a KeyboardInterrupt for a signal is on its way
_prefix = "popeval"
_wake = -1  # the write end of the helper thread's pipe
_default_hook = sys.unraisablehook


def install(prefix: str = "popeval") -> None:
    """Handles SIGINT and SIGTERM as described above (each unless ignored, as a shell ignores
    SIGINT for `cmd &`); `prefix` starts the line said on an exit at once (`popeval evolve`).
    Call it from the main thread, before anything else."""
    global _prefix, _wake, _default_hook
    _prefix = prefix
    read, _wake = os.pipe()
    os.set_blocking(_wake, False)
    for sig in _SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _handle)
    signal.set_wakeup_fd(_wake, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read,), name="popeval-signals", daemon=True).start()
    _default_hook, sys.unraisablehook = sys.unraisablehook, _unraisable


def uninstall() -> None:
    """Ignores SIGINT and SIGTERM from now on: the command has said its last line."""
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def now_writing() -> None:
    """From now on a signal raises KeyboardInterrupt, for the command to stop cleanly."""
    global _at_once
    with _mode:
        _at_once = False


def received() -> int | None:
    """The last signal received (None: none, or `install` was not called)."""
    return _received


def _handle(signum: int, frame) -> None:
    global _received, _stopping
    if signum == signal.SIGTERM and _stopping:
        return  # already stopping: a repeated SIGTERM asks for nothing more
    _received = signum
    if _at_once or _inside_hook(frame):
        _defer()  # the helper thread ends the process, or sends the signal again to raise
        return
    _stopping = True
    raise KeyboardInterrupt


def _defer() -> None:
    """Asks the helper thread to answer the last signal: by an exit, or by sending it again."""
    try:
        os.write(_wake, _AGAIN)
    except OSError:  # the pipe is full: the helper thread is awake already
        pass


def _watch(read: int) -> None:
    """The helper thread: ends the process while nothing is written, else makes sure that a
    signal the main thread did not raise (deferred, or raised where Python ignores it) is."""
    while True:
        for byte in os.read(read, 64):
            if byte not in (_AGAIN[0], *_SIGNALS):
                continue  # another signal that a library handles in Python
            with _mode:
                if _at_once:
                    _exit_at_once(byte or _received or signal.SIGINT)
            if byte == _AGAIN[0]:
                signal.pthread_kill(threading.main_thread().ident, _received)  # wakes it if it waits


def _exit_at_once(signum: int) -> None:
    by = " by SIGTERM" if signum == signal.SIGTERM else ""
    os.write(2, f"{_prefix}: interrupted{by}\n".encode())
    os._exit(128 + signum)


def _unraisable(unraisable) -> None:
    """`sys.unraisablehook` once installed: sends again a signal whose KeyboardInterrupt Python
    ignored (raised in a garbage-collection callback or a finaliser), instead of printing it."""
    global _stopping
    if not (_received is not None and isinstance(unraisable.exc_value, KeyboardInterrupt)):
        return _default_hook(unraisable)
    _stopping = False
    _defer()


def _inside_hook(frame) -> bool:
    """Whether `frame` runs in `_unraisable`, where a KeyboardInterrupt would be ignored too
    (the signal sent again can come while the hook still runs)."""
    while frame is not None:
        if frame.f_code is _unraisable.__code__:
            return True
        frame = frame.f_back
    return False
