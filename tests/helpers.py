"""Helpers the test files import (`from tests.helpers import ...`); the fixtures are in the conftests."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

#: The repository's root.
REPO = Path(__file__).resolve().parents[1]

#: One environment of each family, and a continuous-action one: the default tier's sweeps.
REPRESENTATIVES = ("CartPole-v1", "Pendulum-v1", "Catch-bsuite", "FourRooms-misc", "PointRobot-misc",
                   "Breakout-MinAtar")


def sweep(env_ids) -> list:
    """`env_ids` as parameters: the representatives run by default, the others under `-m slow`."""
    return [pytest.param(e, marks=() if e in REPRESENTATIVES else pytest.mark.slow) for e in env_ids]


#: `metrics.csv` columns that depend on wall time, not on the computation.
TIMING_COLUMNS = frozenset({"steps/per_second", "time/elapsed"})


def subprocess_env(**overrides: str) -> dict[str, str]:
    """The environment for a fresh popeval process: this one's, with no device count chosen
    (each test sets its own), JAX on the CPU, W&B off and the session's compilation cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", WANDB_MODE="disabled", WANDB_SILENT="true", POPEVAL_CACHE_DIR="")
    env.update(overrides)
    return env


def read_metrics(run_dir: Path, timing: bool = True) -> list[dict[str, str]]:
    """The rows of `RUN/metrics.csv`; without the timing columns when `timing=False`."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return rows if timing else [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]


def computed_once(tmp_path_factory, name: str, compute):
    """`compute(directory)` (returning JSON values) run once per test session, by whichever
    xdist worker asks first; the others wait for it and get what it returned. An expensive
    run shared by tests that may land on different workers is then paid for once."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this session
    directory, done = root / f"once-{name}", root / f"once-{name}.json"
    with open(root / f"once-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            done.write_text(json.dumps(compute(directory)))
        return json.loads(done.read_text())


#: A process that runs `evolve` on each `{run_dir: flat config}` of its JSON argument.
SCRIPT = textwrap.dedent("""
    import json, sys
    from popeval.strategies import EvolveConfig, RunOptions, evolve
    for name, config in json.loads(sys.argv[1]).items():
        evolve(EvolveConfig.from_flat(**config), RunOptions(run_dir=name, wandb="disabled", progress=False))
""")


def flatten(tree, prefix=""):
    """`{path: array}` of a nested dict (a loaded checkpoint)."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}/{key}").items()}
    return {prefix: np.asarray(tree)}
