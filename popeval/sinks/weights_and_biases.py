"""Weights & Biases as a sink (the only module that imports wandb)."""

from __future__ import annotations

import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from .base import RunInfo

__all__ = ["WandbSink", "wandb_mode"]

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


class WandbSink:
    """W&B logging into `RUN/wandb` (offline runs: `RUN/wandb/offline-run-*`, uploaded later with
    `wandb sync RUN/wandb/offline-run-*`).

    Every W&B call runs on this sink's own thread, so a slow or unreachable W&B service never
    holds up the evolve loop; `close` waits at most `close_timeout` seconds for it. Any failure
    logs one warning and turns the sink off. The run's W&B id is chosen up front and kept in
    the checkpoint's metadata (`wandb_id`), so a resumed run continues the same W&B run.
    """

    META_KEY = "wandb_id"

    def __init__(self, mode: str = "auto", project: str = "popeval", close_timeout: float = 60.0):
        self.mode = wandb_mode(mode)
        self.project = project
        self.close_timeout = close_timeout
        self.run = None
        self._worker = None

    def _call(self, fn, *args) -> None:
        if self._worker is not None:
            self._worker.submit(self._guarded, fn, *args)

    def _guarded(self, fn, *args) -> None:
        if fn != self._init and self.run is None:  # nothing to do once W&B is off
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - W&B must never stop a run
            log.warning("W&B disabled for this run (%s: %s)", type(e).__name__, e)
            self.run = None

    def _init(self, info: RunInfo, run_id: str, resuming: bool) -> None:
        import wandb

        self.run = wandb.init(
            project=self.project, dir=str(info.run_dir), config=info.config, mode=self.mode,
            name=info.name, id=run_id, resume="allow" if resuming else None, reinit=True,
            settings=wandb.Settings(init_timeout=60),
        )

    def start(self, info: RunInfo) -> None:
        if self.mode == "disabled":
            return
        resume_id = info.meta.get(self.META_KEY)
        run_id = resume_id or uuid.uuid4().hex[:12]
        info.meta[self.META_KEY] = run_id
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="popeval-wandb")
        self._call(self._init, info, run_id, resume_id is not None)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = {k: v for k, v in metrics.items() if v == v}
        self._call(lambda: self.run.log(values, step=step))

    def close(self) -> None:
        if self._worker is None:
            return
        worker, self._worker = self._worker, None
        finished = worker.submit(self._guarded, lambda: self.run.finish())  # after everything queued
        worker.shutdown(wait=False)
        try:
            finished.result(timeout=self.close_timeout)
        except FutureTimeout:
            log.warning("W&B did not finish within %.0f s; its files may be incomplete", self.close_timeout)
