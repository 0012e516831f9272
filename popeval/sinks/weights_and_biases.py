"""Weights & Biases as a sink (the only module that imports wandb)."""

from __future__ import annotations

import logging
import math
import os
import queue
import re
import threading
import uuid
from pathlib import Path
from typing import Any

from .base import RunInfo
from .files import METRICS_CSV

__all__ = ["WandbSink", "wandb_mode", "CLOSE_TIMEOUT"]

log = logging.getLogger("popeval")


def wandb_mode(requested: str) -> str:
    """`auto` -> the environment's `WANDB_MODE` if set, else `online` with an API key
    configured, else `offline`."""
    if requested != "auto":
        return requested
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env in ("disabled", "offline", "online"):
        return env
    if env in ("dryrun", "run"):  # W&B's older names
        return "offline" if env == "dryrun" else "online"
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


#: How long `WandbSink.close` waits for W&B by default (seconds); `POPEVAL_WANDB_CLOSE_TIMEOUT`
#: overrides it. W&B uploads what it missed later (`wandb sync`), so the run need not wait.
CLOSE_TIMEOUT = 5.0
#: Set once a `close` gave up waiting: the process then does not wait for W&B's service at exit.
gave_up = threading.Event()
_NO_API_KEY = re.compile(r"api[ _]?key", re.IGNORECASE)  # W&B's UsageError without a key, in every version


def close_timeout_from_env() -> float:
    """`POPEVAL_WANDB_CLOSE_TIMEOUT` in seconds, else `CLOSE_TIMEOUT`."""
    text = os.environ.get("POPEVAL_WANDB_CLOSE_TIMEOUT", "").strip()
    if not text:
        return CLOSE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise ValueError(f"POPEVAL_WANDB_CLOSE_TIMEOUT must be a number of seconds >= 0, got {text!r}")
    return value


def _sync_dir(run, wandb_dir: Path) -> str:
    """The offline run's directory (`RUN/wandb/offline-run-<time>-<id>`, what `wandb sync`
    takes): `run.sync_dir` in newer W&B, the parent of its files' directory (`run.dir`) in older."""
    try:
        where = getattr(run, "sync_dir", None) or Path(run.dir).parent
    except Exception:  # noqa: BLE001 - a W&B without either: the pattern that finds it
        where = wandb_dir / "offline-run-*"
    return str(where)


def _quiet_init(wandb, **kwargs):
    """`wandb.init` without W&B's own traceback on its logger when it fails: the caller says
    what happened in one line (the fallback to offline, or "W&B disabled")."""
    logger = logging.getLogger("wandb")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        return wandb.init(**kwargs)
    finally:
        logger.setLevel(level)


class WandbSink:
    """W&B logging into `RUN/wandb` (offline runs: `RUN/wandb/offline-run-*`, uploaded later with
    `wandb sync RUN/wandb/offline-run-*`).

    Every W&B call runs on this sink's own (daemon) thread, so a slow or unreachable W&B service
    never holds up the evolve loop, nor the end of the process; `close` waits at most
    `close_timeout` seconds for it (default `POPEVAL_WANDB_CLOSE_TIMEOUT`, else 5). Any failure
    logs one warning and turns the sink off; `online` without an API key falls back to
    offline, saying so in one line. The run's W&B id is chosen up front and kept in the
    checkpoint's metadata (`wandb_id`), so a resumed run continues the same W&B run.

    A symbolic link at `RUN/wandb` is refused at `start` (ValueError, one line): W&B would
    write its files wherever the link points, outside the run directory.

    An offline run says at its start, in one line, where its files are, how to upload them,
    and that `metrics_file` in the run directory (`CSVSink`'s; None: no such file) holds the
    same metrics.
    """

    META_KEY = "wandb_id"

    def __init__(self, mode: str = "auto", project: str = "popeval", close_timeout: float | None = None,
                 metrics_file: str | None = METRICS_CSV):
        self.mode = wandb_mode(mode)
        self.project = project
        self.metrics_file = metrics_file
        self.close_timeout = close_timeout_from_env() if close_timeout is None else float(close_timeout)
        self.run = None
        self._queue: queue.SimpleQueue | None = None
        self._closed = threading.Event()
        self._dir: Path | None = None  # RUN/wandb

    def _call(self, fn, *args) -> None:
        if self._queue is not None:
            self._queue.put((fn, args))

    def _work(self, calls: queue.SimpleQueue) -> None:
        for fn, args in iter(calls.get, None):
            self._guarded(fn, *args)
        self._closed.set()

    def _guarded(self, fn, *args) -> None:
        if fn != self._init and self.run is None:  # nothing to do once W&B is off
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - W&B must never stop a run
            log.warning("W&B disabled for this run (%s: %s)", type(e).__name__, " ".join(str(e).split()))
            self.run = None

    def _init(self, info: RunInfo, run_id: str, resuming: bool) -> None:
        import wandb

        kwargs = dict(project=self.project, dir=str(info.run_dir), config=info.config, name=info.name, id=run_id,
                      resume="allow" if resuming else None, reinit=True, settings=wandb.Settings(init_timeout=60))
        try:
            self.run = _quiet_init(wandb, mode=self.mode, **kwargs)
        except Exception as e:
            if self.mode != "online" or not _NO_API_KEY.search(str(e)):
                raise
            self.mode = "offline"
            self.run = wandb.init(mode=self.mode, **kwargs)
            log.warning("W&B: no API key configured (`wandb login` or WANDB_API_KEY), so %s",
                        self._offline_line(info.run_dir))
        else:
            if self.mode == "offline":
                log.info("W&B: %s", self._offline_line(info.run_dir))

    def _offline_line(self, run_dir: Path) -> str:
        """Where an offline run's files are, how to upload them, and where else its metrics are."""
        where = _sync_dir(self.run, run_dir / "wandb")
        also = f"; {run_dir / self.metrics_file} holds the same metrics" if self.metrics_file else ""
        return f"this run logs offline to {where}; upload it later with `wandb sync {where}`{also}"

    def start(self, info: RunInfo) -> None:
        if self.mode == "disabled":
            return
        resume_id = info.meta.get(self.META_KEY)
        run_id = resume_id or uuid.uuid4().hex[:12]
        info.meta[self.META_KEY] = run_id
        self._dir = info.run_dir / "wandb"
        if self._dir.is_symlink():
            raise ValueError(f"{self._dir}: a symbolic link; W&B would write its files where it points, outside "
                             "the run directory (remove the link, or run with --wandb=disabled)")
        self._queue = queue.SimpleQueue()
        self._closed.clear()
        threading.Thread(target=self._work, args=(self._queue,), name="popeval-wandb", daemon=True).start()
        self._call(self._init, info, run_id, resume_id is not None)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = {k: v for k, v in metrics.items() if v == v}
        self._call(lambda: self.run.log(values, step=step))

    def close(self) -> None:
        if self._queue is None:
            return
        calls, self._queue = self._queue, None
        calls.put((lambda: self.run.finish(), ()))  # after everything queued
        calls.put(None)
        if not self._closed.wait(self.close_timeout):
            gave_up.set()
            log.warning("W&B did not finish within %g s (POPEVAL_WANDB_CLOSE_TIMEOUT sets the wait); what it has "
                        "not uploaded stays in %s, for `wandb sync`", self.close_timeout, self._dir)
