"""A run directory: its files, starting or resuming one, and loading a saved policy.

    RUN/config.json         the experiment (EvolveConfig.to_dict())
    RUN/checkpoint.msgpack  state + progress counters (popeval.checkpoint)
    RUN/checkpoint.json     the checkpoint's metadata (generation, env steps, solved_at, W&B id)
    RUN/metrics.csv         one row per generation (popeval.sinks.CSVSink)
    RUN/fitness.png         the fitness curves (popeval.sinks.PlotSink)
    RUN/result.json         the summary, written when the run ends
    RUN/wandb/              W&B's files (offline runs: RUN/wandb/offline-run-*)
    RUN/.lock               held by the process running the run (see `Lock`)

An exported controller (`export_policy`, `popeval export RUN OUT`) is the same layout with
the policies alone in the checkpoint: the mean and best parameters and the observation
statistics, not the strategy's state (a GA's population, CMA-ES's covariance).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

from popeval import checkpoint, distributed

from .config import LEGACY_RUN_KEYS, EvolveConfig, RunOptions, config_from_dict, parse_overrides
from .programs import Run, build, init_state

__all__ = ["CONFIG", "RESULT", "Lock", "Prepared", "prepare", "open_run", "read_config", "clean_result", "write_result",
           "read_result", "load_policy", "export_policy", "open_shared", "complete", "EVAL_OVERRIDES"]

CONFIG = "config.json"
RESULT = "result.json"
POLICIES = "policies"  # checkpoint.json's "kind" of an exported controller

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


class Lock:
    """An exclusive lock on a run directory (`fcntl.flock` on `RUN/.lock`), held while one
    process runs it. The operating system releases it when the process ends, however it ends,
    so a killed run never blocks a later resume."""

    FILE = ".lock"

    def __init__(self, run_dir: Path):
        import fcntl

        self._file = open(run_dir / self.FILE, "a+")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "?"
            self._file.close()
            raise ValueError(f"run directory {run_dir} is in use by another popeval process (pid {holder})") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(str(os.getpid()))
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
            self._file.close()  # closing the file releases the lock


class Prepared(NamedTuple):
    run_dir: Path
    resuming: bool  # there is a checkpoint to continue from
    config: EvolveConfig
    saved: EvolveConfig | None  # the experiment as saved in RUN/config.json (when resuming)


def prepare(config: EvolveConfig | None, options: RunOptions) -> Prepared:
    """Checks a resumption against the saved experiment, or checks a new run directory, and
    names the run directory. Writes nothing (see `open_run`)."""
    if options.resume:
        run_dir = Path(options.resume)
        if not (run_dir / CONFIG).is_file():
            raise ValueError(f"--resume {run_dir}: not a popeval run directory (no {CONFIG})")
        saved = read_config(run_dir)
        if config is not None:
            mine, theirs = config.to_dict(), saved.to_dict()
            diff = sorted(k for k in mine if k not in RESUME_OVERRIDES and mine[k] != theirs[k])
            if diff:
                raise ValueError(f"--resume {run_dir}: the run was made with another config (differs in {diff})")
        # A run stopped before its first checkpoint starts again from generation 0.
        return Prepared(run_dir, checkpoint.exists(run_dir), config or saved, saved)
    if config is None:
        raise ValueError("evolve needs a config (or RunOptions(resume=RUN_DIR))")
    run_dir = Path(options.run_dir) if options.run_dir else _default_dir(config)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} is a file")
    if run_dir.exists() and any(run_dir.iterdir()):
        if checkpoint.exists(run_dir) or not (run_dir / CONFIG).is_file():
            raise ValueError(f"run directory {run_dir} is not empty; pass resume={run_dir} to continue it")
        # A popeval run that stopped before its first checkpoint: nothing in it to keep.
    return Prepared(run_dir, False, config, None)


#: Files a run writes, which a fresh start over a run without a checkpoint replaces.
RUN_FILES = (CONFIG, RESULT, "metrics.csv", "metrics.csv.tmp", "fitness.png", checkpoint.META,
             checkpoint.META + ".tmp", checkpoint.CHECKPOINT + ".tmp")


def open_run(prepared: Prepared) -> Lock:
    """Creates the run directory, takes its lock and, for a new run, writes `config.json`."""
    run_dir = prepared.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = Lock(run_dir)
    try:
        if prepared.saved is None:
            for name in RUN_FILES:
                (run_dir / name).unlink(missing_ok=True)
            checkpoint.atomic_write(run_dir / CONFIG, json.dumps(prepared.config.to_dict(), indent=2,
                                                                 sort_keys=True).encode())
    except BaseException:
        lock.release()
        raise
    return lock


def clean_result(summary: dict) -> dict:
    """`summary` as strict JSON values (a NaN or infinite value becomes null)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}


def write_result(run_dir: Path, summary: dict) -> dict:
    """Writes `RUN/result.json` as strict JSON (`clean_result`); returns what it wrote."""
    clean = clean_result(summary)
    checkpoint.atomic_write(run_dir / RESULT, json.dumps(clean, indent=2, allow_nan=False).encode())
    return clean


def read_result(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / RESULT).read_text())
    except (OSError, ValueError):
        return None


class SavedPolicy(NamedTuple):
    run: Run
    params: Any  # one policy's parameters
    obs_stats: Any  # the run's observation statistics, or None
    which: str  # "mean" or "best"


def load_policy(run_dir: str | os.PathLike, which: str | None = None, overrides: list[str] | dict | None = None
                ) -> SavedPolicy:
    """A saved run's `mean` policy (the search distribution's mean, or for population-based
    strategies the best member seen) or its `best` policy (the best member evaluated);
    `None` picks `mean`: the policy the strategy converges to, and the one most robust to
    new episodes.

    `overrides` (`["--num_env_steps=20000", "--env_kwargs={}"]` or a dict) change how the
    policy is evaluated: only the keys in `EVAL_OVERRIDES`.
    """
    run_dir = Path(run_dir)
    which = "mean" if which is None else which
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
    state = init_state(run, config)
    if checkpoint.load_meta(run_dir).get("kind") == POLICIES:
        saved, _ = checkpoint.load(run_dir, _policies(state, state.best_params))
        return SavedPolicy(run, saved[which], saved["obs_stats"], which)
    state, _ = checkpoint.load(run_dir, state)
    params = state.best_params if which == "best" else run.strategy.mean(state.strategy)
    return SavedPolicy(run, params, state.obs_stats, which)


def _policies(state: Any, mean: Any) -> dict:
    return {"mean": mean, "best": state.best_params, "obs_stats": state.obs_stats}


def export_policy(run_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Writes the run's controller to a new directory `out_dir`: its config, result, metrics
    and a checkpoint of the mean and best policies only, which `load_policy`, `popeval eval`
    and `popeval render` read like the run itself."""
    run_dir, out = Path(run_dir), Path(out_dir)
    if not (run_dir / CONFIG).is_file() or not checkpoint.exists(run_dir):
        raise FileNotFoundError(f"{run_dir}: not a popeval run directory (config.json and a checkpoint)")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: exists and is not empty")
    if checkpoint.load_meta(run_dir).get("kind") == POLICIES:
        raise ValueError(f"{run_dir}: already an exported controller")
    config = read_config(run_dir)
    run = build(config)
    state, meta = checkpoint.load(run_dir, init_state(run, config))
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.save(out, _policies(state, run.strategy.mean(state.strategy)),
                    {k: meta[k] for k in checkpoint.PROGRESS} | {"kind": POLICIES})
    for name in (CONFIG, RESULT, "metrics.csv"):
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, out / name)
    return out


def open_shared(config: EvolveConfig | None, options: RunOptions, primary: bool) -> dict:
    """Prepares (or resumes) the run directory on process 0 and tells every process what it
    found: `run_dir`, `resuming`, `config`, `meta`, and `done` (a complete run's summary) or,
    on process 0, `lock` and the built `run`. An error on process 0 is raised on every process."""
    opened: dict = {}
    error = run = None
    if primary:
        try:
            if config is not None:
                run = build(config)  # a bad config fails before any write
            prepared = prepare(config, options)
            meta = {"generation": 0, "env_steps": 0, "elapsed_seconds": 0.0, "wandb_id": None, "solved_at": None}
            if prepared.resuming:
                meta = {**meta, **checkpoint.load_meta(prepared.run_dir)}
            opened = {"run_dir": str(prepared.run_dir), "resuming": prepared.resuming,
                      "config": prepared.config.to_dict(), "meta": meta}
            done = prepared.resuming and complete(meta, prepared.config, prepared.saved)
            if done:
                logging.getLogger("popeval").info(
                    "run %s is complete (%s); nothing to do (raise num_generations to continue it)",
                    prepared.run_dir, done)
                opened["done"] = (read_result(prepared.run_dir)
                                  or {"run_dir": str(prepared.run_dir), "generations": meta["generation"]})
        except Exception as e:
            error = e
    shared = distributed.broadcast_json({"error": f"process 0: {type(error).__name__}: {error}"} if error else opened)
    if error is not None:
        raise error
    if "error" in shared:
        raise RuntimeError(shared["error"])
    if not primary:
        return {**shared, "config": config_from_dict(shared["config"])}
    if "done" not in shared:
        shared.update(lock=open_run(prepared), config=prepared.config,
                      run=run if prepared.config is config else None)
    return shared


def complete(meta: dict, config: EvolveConfig, saved: EvolveConfig | None) -> str | None:
    """Why a resumed run has nothing left to do, or None."""
    gen = int(meta["generation"])
    if gen >= config.num_generations:
        return f"generation {gen} of {config.num_generations}"
    raised = saved is not None and config.num_generations > saved.num_generations
    if config.stop_at_target and meta.get("solved_at") and not raised:
        return f"its target {config.target} was reached at generation {meta['solved_at']['generation']}"
    return None
