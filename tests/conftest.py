"""Helpers shared by the test files (pytest puts `tests/` on `sys.path`: `from conftest import ...`)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

#: `metrics.csv` columns that depend on wall time, not on the computation.
TIMING_COLUMNS = frozenset({"steps/per_second", "time/elapsed"})


def subprocess_env(**overrides: str) -> dict[str, str]:
    """The environment for a fresh popeval process: this one's, with no device count chosen
    (each test sets its own), JAX on the CPU, W&B off and no compilation cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", WANDB_MODE="disabled", WANDB_SILENT="true", POPEVAL_CACHE_DIR="")
    env.update(overrides)
    return env


def read_metrics(run_dir: Path, timing: bool = True) -> list[dict[str, str]]:
    """The rows of `RUN/metrics.csv`; without the timing columns when `timing=False`."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return rows if timing else [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]
