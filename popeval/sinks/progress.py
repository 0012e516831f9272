"""Progress: a bar on a terminal, log lines elsewhere."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from .base import RunInfo

__all__ = ["ProgressSink", "LogSink"]

log = logging.getLogger("popeval")


class ProgressSink:
    """A tqdm progress bar over generations with best / mean fitness and steps per second."""

    def __init__(self):
        self.bar = None

    def start(self, info: RunInfo) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=info.num_generations, initial=info.start_generation,
                        desc=info.config.get("env_name"), unit="gen")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.bar.set_postfix(best=f"{metrics['best/fitness']:.1f}", mean=f"{metrics['fitness/mean']:.1f}",
                             sps=f"{metrics['steps/per_second']:.2e}")
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class LogSink:
    """Progress as log lines, for output that is not a terminal (`| tee`, nohup, batch jobs):
    a line when the run starts (the first generation waits for compilation, which can take a
    minute), then one every `every_seconds` seconds (and at the first and last generation)."""

    def __init__(self, every_seconds: float = 30.0, logger: logging.Logger = log):
        self.every_seconds, self.logger = every_seconds, logger
        self._last = -math.inf
        self._total = 0
        self._pending: tuple[int, dict] | None = None

    def start(self, info: RunInfo) -> None:
        self._total = info.num_generations
        self.logger.info("compiling generation %d/%d (or loading it from the compilation cache); then a line "
                         "every %g s", info.start_generation + 1, self._total, self.every_seconds)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_seconds or step == self._total:
            self._write(step, metrics)
            self._last, self._pending = now, None
        else:
            self._pending = (step, metrics)

    def _write(self, step: int, m: dict[str, Any]) -> None:
        self.logger.info("generation %d/%d: mean %.4g, max %.4g, best %.4g, %.3g steps/s, %.0f s",
                         step, self._total, m["fitness/mean"], m["fitness/max"], m["best/fitness"],
                         m["steps/per_second"], m.get("time/elapsed", math.nan))

    def close(self) -> None:
        if self._pending is not None:  # the generation the run stopped at
            self._write(*self._pending)
            self._pending = None
