"""What every sink shares: the `Sink` protocol and the `RunInfo` it is started with."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

__all__ = ["RunInfo", "Sink"]


@dataclasses.dataclass
class RunInfo:
    """What sinks are told about a run when it starts."""

    run_dir: Path
    name: str  # the run's name (its directory's name)
    title: str  # e.g. "CartPole-v1 / Open_ES"
    config: dict  # the experiment, as saved in config.json
    start_generation: int  # > 0 when resuming
    num_generations: int
    meta: dict  # saved with every checkpoint; sinks may keep resume information here
    target: float | None = None  # the return the experiment aims for, if any


class Sink(Protocol):
    def start(self, info: RunInfo) -> None: ...

    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...
