"""A run directory: its files, starting or resuming one, and loading a saved policy.

    RUN/config.json         the experiment (EvolveConfig.to_dict())
    RUN/checkpoint.msgpack  state + progress counters (popeval.checkpoint)
    RUN/checkpoint.json     the checkpoint's metadata (generation, env steps, solved_at, W&B id)
    RUN/metrics.csv         one row per generation (popeval.sinks.CSVSink)
    RUN/fitness.png         the fitness curves (popeval.sinks.PlotSink)
    RUN/result.json         the summary, written when the run ends
    RUN/wandb/              W&B's files (offline runs: RUN/wandb/offline-run-*)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from popeval import checkpoint

from .config import LEGACY_RUN_KEYS, EvolveConfig, RunOptions, config_from_dict, parse_overrides
from .programs import Run, build, init_state

__all__ = ["CONFIG", "RESULT", "prepare", "read_config", "write_result", "load_policy", "EVAL_OVERRIDES"]

CONFIG = "config.json"
RESULT = "result.json"

#: Experiment keys a resumed run may change (extending the budget changes no result so far).
RESUME_OVERRIDES = ("num_generations",)
#: Config keys a saved policy may be evaluated with differently (they change no parameter shape).
EVAL_OVERRIDES = ("env_kwargs", "num_env_steps")


def read_config(run_dir: str | os.PathLike, overrides: dict | None = None) -> EvolveConfig:
    """The experiment saved in `RUN/config.json` (older files' run-control keys ignored)."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise ValueError(f"{run_dir}: not a popeval run directory (no {CONFIG})")
    saved = {k: v for k, v in json.loads(path.read_text()).items() if k not in LEGACY_RUN_KEYS}
    return config_from_dict({**saved, **(overrides or {})})


def _default_dir(config: EvolveConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(f"runs/{config.env_name}-{config.strategy}-seed{config.seed}-{stamp}")


def prepare(config: EvolveConfig | None, options: RunOptions) -> tuple[Path, bool, EvolveConfig]:
    """`(run_dir, resuming, config)`: checks a resumption against the saved experiment, or
    creates a new run directory holding `config.json`. Writes nothing when it raises."""
    if options.resume:
        run_dir = Path(options.resume)
        if not checkpoint.exists(run_dir) or not (run_dir / CONFIG).is_file():
            raise ValueError(f"--resume {run_dir}: not a popeval run directory (no checkpoint found)")
        saved = read_config(run_dir)
        if config is None:
            return run_dir, True, saved
        mine, theirs = config.to_dict(), saved.to_dict()
        diff = sorted(k for k in mine if k not in RESUME_OVERRIDES and mine[k] != theirs[k])
        if diff:
            raise ValueError(f"--resume {run_dir}: the run was made with another config (differs in {diff})")
        return run_dir, True, config
    if config is None:
        raise ValueError("evolve needs a config (or RunOptions(resume=RUN_DIR))")
    run_dir = Path(options.run_dir) if options.run_dir else _default_dir(config)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(f"run directory {run_dir} is not empty; pass resume={run_dir} to continue it")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True))
    return run_dir, False, config


def write_result(run_dir: Path, summary: dict) -> None:
    (run_dir / RESULT).write_text(json.dumps(summary, indent=2))


def load_policy(run_dir: str | os.PathLike, which: str = "best", overrides: list[str] | dict | None = None
                ) -> tuple[Run, Any, Any]:
    """`(run, params, obs_stats)` of a saved run: its `best` or `mean` policy.

    `overrides` (`["--num_env_steps=20000", "--env_kwargs={}"]` or a dict) change how the
    policy is evaluated: only the keys in `EVAL_OVERRIDES`.
    """
    run_dir = Path(run_dir)
    if which not in ("best", "mean"):
        raise ValueError(f"which must be 'best' or 'mean', got {which!r}")
    if not (run_dir / CONFIG).is_file() or not checkpoint.exists(run_dir):
        raise FileNotFoundError(f"{run_dir}: not a popeval run directory (config.json and a checkpoint)")
    changes = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    refused = sorted(set(changes) - set(EVAL_OVERRIDES))
    if refused:
        raise ValueError(f"cannot evaluate a saved policy with other {refused}; "
                         f"only {list(EVAL_OVERRIDES)} may change")
    config = read_config(run_dir, changes)
    run = build(config)
    state, _ = checkpoint.load(run_dir, init_state(run, config))
    params = state.best_params if which == "best" else run.strategy.mean(state.strategy)
    return run, params, state.obs_stats
