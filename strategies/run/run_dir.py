"""A run directory: its files, starting or resuming one, and loading a saved policy.

    RUN/config.json         the experiment (EvolveConfig.to_dict())
    RUN/checkpoint.msgpack  state + progress counters (popeval.checkpoint)
    RUN/checkpoint.json     the checkpoint's metadata (generation, env steps, solved_at, W&B id,
                            the experiment whose SHA-256 the checkpoint holds)
    RUN/metrics.csv         one row per generation (popeval.sinks.CSVSink)
    RUN/fitness.png         the fitness curves (popeval.sinks.PlotSink)
    RUN/result.json         the summary, written when the run ends
    RUN/wandb/              W&B's files (offline runs: RUN/wandb/offline-run-*)
    RUN/.lock               held by the process running the run (see `Lock`), removed when it ends

A run directory is created complete or not at all: the lock is taken first, then everything is
read, then `config.json` is written atomically. A directory holding only a lock or temporary
files (`*.tmp`, what a kill while starting leaves) counts as empty. Every file is written by
`checkpoint.atomic_write`, which never follows a symbolic link and keeps permission bits.

An exported controller (`export_policy`, `popeval export RUN OUT`) is the same layout with
the policies alone in the checkpoint: the mean and best parameters and the observation
statistics, not the strategy's state (a GA's population, CMA-ES's covariance), so it cannot be
resumed. `--resume`, `eval`, `render` and `export` all refuse a `config.json` edited since its
checkpoint was made (`check_experiment`), before writing anything.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, NamedTuple

from popeval import checkpoint, distributed

from .config import LEGACY_RUN_KEYS, EvolveConfig, RunOptions, config_from_dict, parse_overrides
from .programs import Run, build, init_state

__all__ = ["CONFIG", "RESULT", "Lock", "Prepared", "prepare", "open_run", "read_config", "clean_result", "write_result",
           "read_result", "load_policy", "export_policy", "open_shared", "Opened", "Done", "complete",
           "last_generation", "config_hash", "check_experiment", "EVAL_OVERRIDES"]

CONFIG = "config.json"
RESULT = "result.json"
POLICIES = "policies"  # checkpoint.json's "kind" of an exported controller
EXPERIMENT = "experiment"  # checkpoint.json's copy of the experiment its config_sha256 is the hash of

#: Experiment keys a resumed run may change (extending the budget changes no result so far).
RESUME_OVERRIDES = ("num_generations",)
#: Config keys a saved policy may be evaluated with differently (they change no parameter shape;
#: `env_module` names the module for a run made where its id was registered in the process).
EVAL_OVERRIDES = ("env_kwargs", "num_env_steps", "env_module")


def read_config(run_dir: str | os.PathLike, overrides: dict | None = None) -> EvolveConfig:
    """The experiment saved in `RUN/config.json` (older files' run-control keys ignored)."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise ValueError(_no_config(Path(run_dir), str(run_dir)))
    saved = {k: v for k, v in _config_object(path).items() if k not in LEGACY_RUN_KEYS}
    if not overrides:
        try:
            return config_from_dict(saved)
        except (TypeError, ValueError) as e:  # a key the file got wrong: name the file
            raise ValueError(f"{path}: {e}") from None
    return config_from_dict({**saved, **overrides})


def _config_object(path: Path) -> dict:
    """`config.json`'s JSON object, or a ValueError naming the file."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a popeval config (not JSON: {' '.join(str(e).split())[:100]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a popeval config (a JSON object of config keys), got {type(data).__name__}")
    return data


def config_hash(experiment: EvolveConfig | dict) -> str:
    """A SHA-256 of an experiment as `config.json` holds it (an `EvolveConfig`, or the file's
    dict), `RESUME_OVERRIDES` left out; a checkpoint records it. The file's own keys are hashed,
    so a later popeval that adds config keys or changes defaults still resumes the run."""
    return hashlib.sha256(json.dumps(_hashed(experiment), sort_keys=True).encode()).hexdigest()


def _hashed(experiment: EvolveConfig | dict) -> dict:
    """What `config_hash` hashes: the experiment's keys but `RESUME_OVERRIDES`."""
    saved = experiment.to_dict() if isinstance(experiment, EvolveConfig) else experiment
    return {k: v for k, v in saved.items() if k not in RESUME_OVERRIDES}


def check_experiment(run_dir: str | os.PathLike, meta: dict, what: str | None = None) -> None:
    """Refuses a `config.json` edited since the checkpoint whose metadata `meta` is was made
    (`--resume`, `eval`, `render` and `export` alike), naming the edited keys where
    `checkpoint.json` still holds the experiment. A checkpoint without a config hash (older
    popeval) is not checked.

    Args:
        run_dir: the run directory.
        meta: the checkpoint's metadata (`checkpoint.read`).
        what: the start of the error line (default: the run directory).
    """
    run_dir = Path(run_dir)
    made_by = meta.get(checkpoint.CONFIG_SHA256)
    found = _config_object(run_dir / CONFIG)
    if made_by is None or made_by == config_hash(found):
        return
    recorded = meta.get(EXPERIMENT)
    if isinstance(recorded, dict) and config_hash(recorded) == made_by:
        why = f"edited: {_edits(recorded, _hashed(found))}"
    else:  # an older checkpoint.json, without the experiment
        why = f"its SHA-256 differs: was {CONFIG} edited?"
    raise ValueError(f"{what or run_dir}: {CONFIG} no longer matches the experiment that made the checkpoint "
                     f"({why}); put the original back")


_ABSENT = object()  # a key one side of `_edits` lacks


def _edits(recorded: dict, found: dict) -> str:
    """The keys of `found` that differ from `recorded`, with both values."""
    keys = sorted(k for k in {*recorded, *found} if recorded.get(k, _ABSENT) != found.get(k, _ABSENT))
    return ", ".join(f"{k} {_short(recorded.get(k, _ABSENT))} -> {_short(found.get(k, _ABSENT))}" for k in keys)


def _short(value: Any) -> str:
    """`value` as JSON, at most 40 characters ("(none)": the key is absent)."""
    text = "(none)" if value is _ABSENT else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _saved_dict(run_dir: Path) -> dict:
    """`config.json` as written (`read_config` checked it; read the same way, a byte-order mark
    and all)."""
    return _config_object(run_dir / CONFIG)


def _default_dir(config: EvolveConfig) -> Path:
    """`runs/<env>-<strategy>-seed<seed>-<time>`: one directory under `runs/`, a namespaced id's
    separators (`brax/ant`) turned into `-`."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    env = config.environment.name.replace("/", "-").replace("\\", "-")
    return Path(f"runs/{env}-{config.strategy.name}-seed{config.run.seed}-{stamp}")


class Lock:
    """An exclusive lock on a run directory (`fcntl.flock` on `RUN/.lock`), held while one
    process runs it. The operating system releases it when the process ends, however it ends,
    so a killed run never blocks a later resume; `release` removes the file.

    Args:
        run_dir: the run directory (it exists).
        created: this run created the directory (`release(discard_dir=True)` may remove it).
        created_root: the topmost directory this run created (the run directory or a parent
            such as `runs/`), removed too by a discard when it is left empty.
    """

    FILE = ".lock"

    def __init__(self, run_dir: Path, created: bool = False, created_root: Path | None = None):
        import fcntl

        self.run_dir, self.created, self.created_root = Path(run_dir), created, created_root
        path = self.run_dir / self.FILE
        while True:
            fd = _open_lock_file(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise ValueError(f"run directory {run_dir} is in use by another popeval process (pid {holder})"
                                 ) from None
            if _same_file(fd, path):
                break
            os.close(fd)  # its holder removed it while releasing: lock the file now in its place
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as e:
            os.close(fd)
            e.filename = e.filename or str(path)  # a full disk: name the file
            raise
        self._fd: int | None = fd

    def release(self, discard_dir: bool = False) -> None:
        """Removes `.lock` while still holding it, then releases the lock.

        Args:
            discard_dir: remove the whole run directory instead, when this run created it and
                it holds no checkpoint (a run that failed before saving anything).
        """
        if self._fd is None:
            return
        path = self.run_dir / self.FILE
        try:
            if discard_dir and self.created and not _has_checkpoint(self.run_dir):
                _discard(self.run_dir, self.created_root)
            elif _same_file(self._fd, path):
                path.unlink()
        except OSError:
            pass  # a read-only directory, say: the lock is released all the same
        finally:
            os.close(self._fd)  # closing the file releases the lock
            self._fd = None


def _discard(run_dir: Path, created_root: Path | None) -> None:
    """Removes `run_dir`, then its parents up to `created_root` (what this run created) while
    they are empty: a run that fails at once leaves no empty `runs/` behind."""
    shutil.rmtree(run_dir, ignore_errors=True)
    if created_root is None or created_root == run_dir:
        return
    for parent in run_dir.parents:
        try:
            parent.rmdir()  # only an empty directory
        except OSError:
            return
        if parent == created_root:
            return


def _make_dir(run_dir: Path) -> Path | None:
    """Creates `run_dir` and its missing parents; returns the topmost directory created (None:
    `run_dir` existed)."""
    missing = []
    for d in (run_dir, *run_dir.parents):
        if d.exists():
            break
        missing.append(d)
    try:
        run_dir.mkdir(parents=True)
    except FileExistsError:
        return None
    return missing[-1] if missing else run_dir


def _open_lock_file(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{path}: a symbolic link; popeval never writes through one (remove it)") from None
        raise


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` is still the file open as `fd` (not removed or replaced)."""
    try:
        here = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _has_checkpoint(run_dir: Path) -> bool:
    """A checkpoint, or its metadata without it (a damaged run, never silently restarted)."""
    return checkpoint.exists(run_dir) or (run_dir / checkpoint.META).exists()


def _started(run_dir: Path) -> bool:
    """Whether `run_dir` holds more than a kill while starting leaves (a lock, temporaries)."""
    return any(p.name != Lock.FILE and not p.name.endswith(".tmp") for p in run_dir.iterdir())


class Prepared(NamedTuple):
    run_dir: Path
    resuming: bool  # there is a checkpoint to continue from
    config: EvolveConfig
    saved: EvolveConfig | None  # the experiment as saved in RUN/config.json (when resuming)


def prepare(config: EvolveConfig | None, options: RunOptions) -> Prepared:
    """Checks a resumption against the saved experiment, or checks a new run directory, and
    names the run directory. Writes nothing (see `open_run`, which checks again under the lock)."""
    if options.resume:
        return _check_resume(Path(options.resume), config)
    if config is None:
        raise ValueError("evolve needs a config (or RunOptions(resume=RUN_DIR))")
    return _check_new(Path(options.run_dir) if options.run_dir else _default_dir(config), config)


def _check_resume(run_dir: Path, config: EvolveConfig | None) -> Prepared:
    if not (run_dir / CONFIG).is_file():
        raise ValueError(_no_config(run_dir, f"--resume {run_dir}"))
    saved = read_config(run_dir)
    if config is not None:
        mine, theirs = config.to_dict(), saved.to_dict()
        diff = sorted(k for k in mine if k not in RESUME_OVERRIDES and mine[k] != theirs[k])
        if diff:
            raise ValueError(f"--resume {run_dir}: the run was made with another config (differs in {diff})")
    if not checkpoint.exists(run_dir) and (run_dir / checkpoint.META).exists():
        raise ValueError(f"--resume {run_dir}: {checkpoint.META} says generation {_saved_generation(run_dir)} but "
                         f"{checkpoint.CHECKPOINT} is missing; put it back (resuming from generation 0 would "
                         "drop the run's progress)")
    # A run stopped before its first checkpoint starts again from generation 0.
    return Prepared(run_dir, checkpoint.exists(run_dir), config or saved, saved)


def _no_config(run_dir: Path, what: str) -> str:
    """Why `run_dir` without `config.json` is no run to continue."""
    if run_dir.is_dir() and not _started(run_dir):
        return (f"{what}: the run never started (no {CONFIG}, only a lock or temporary files); "
                f"start it afresh with --run_dir {run_dir}")
    return f"{what}: not a popeval run directory (no {CONFIG})"


def _saved_generation(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / checkpoint.META).read_text())["generation"])
    except (OSError, ValueError, TypeError, KeyError):
        return "?"


def _check_new(run_dir: Path, config: EvolveConfig) -> Prepared:
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} is a file")
    if run_dir.exists() and _started(run_dir):
        if _has_checkpoint(run_dir) or not (run_dir / CONFIG).is_file():
            raise ValueError(f"run directory {run_dir} is not empty; continue it with --resume {run_dir} "
                             f"(Python: RunOptions(resume={str(run_dir)!r}))")
        # A popeval run that stopped before its first checkpoint: nothing in it to keep.
    return Prepared(run_dir, False, config, None)


#: Files a run writes, which a fresh start over a run without a checkpoint replaces.
_REPLACED = (CONFIG, RESULT, "metrics.csv", "fitness.png", checkpoint.META)
RUN_FILES = _REPLACED + tuple(name + ".tmp" for name in (*_REPLACED, checkpoint.CHECKPOINT))


def open_run(config: EvolveConfig | None, options: RunOptions) -> tuple[Lock, Prepared]:
    """Creates the run directory (for a new run), takes its lock and checks it again, now that
    nothing can change it (`prepare`); the caller writes `config.json` (`write_config`) or
    releases the lock."""
    first = prepare(config, options)  # refuses without writing anything
    root = None if options.resume else _make_dir(first.run_dir)
    try:
        lock = Lock(first.run_dir, root is not None, root)
    except BaseException:
        if root is not None:
            _discard(first.run_dir, root)
        raise
    try:
        prepared = _check_resume(first.run_dir, config) if options.resume else _check_new(first.run_dir, config)
    except BaseException:
        lock.release(discard_dir=True)
        raise
    return lock, prepared


def write_config(prepared: Prepared) -> None:
    """Writes `config.json` for a new run (replacing what a run stopped before its first
    checkpoint left), or updates its `RESUME_OVERRIDES` keys (alone) for a resumed run."""
    run_dir, config = prepared.run_dir, prepared.config.to_dict()
    if prepared.saved is None:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
    else:
        saved = _saved_dict(run_dir)
        config = {**saved, **{k: config[k] for k in RESUME_OVERRIDES}}
        if config == saved:
            return
    checkpoint.atomic_write(run_dir / CONFIG, json.dumps(config, indent=2, sort_keys=True).encode())


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
    found = checkpoint.read(run_dir)
    check_experiment(run_dir, found[1])
    run = build(config)
    state = init_state(run, config)
    if found[1].get("kind") == POLICIES:
        saved, _ = checkpoint.load(run_dir, _policies(state, state.best_params), found)
        return SavedPolicy(run, saved[which], saved["obs_stats"], which)
    state, _ = checkpoint.load(run_dir, state, found)
    params = state.best_params if which == "best" else run.strategy.mean(state.strategy)
    return SavedPolicy(run, params, state.obs_stats, which)


def _policies(state: Any, mean: Any) -> dict:
    return {"mean": mean, "best": state.best_params, "obs_stats": state.obs_stats}


def export_policy(run_dir: str | os.PathLike, out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Writes the run's controller to a new directory `out_dir`: its config, result (without
    the run's path), metrics and a checkpoint of the mean and best policies only, which
    `load_policy`, `popeval eval` and `popeval render` read like the run itself.

    Args:
        force: replace `out_dir` when it holds an earlier export (never another directory).

    Raises:
        FileExistsError when `out_dir` is not empty (and, with `force`, not an export).
    """
    run_dir, out = Path(run_dir), Path(out_dir)
    if not (run_dir / CONFIG).is_file() or not checkpoint.exists(run_dir):
        raise FileNotFoundError(f"{run_dir}: not a popeval run directory (config.json and a checkpoint)")
    if _is_export(run_dir):
        raise ValueError(f"{run_dir}: already an exported controller")
    replace = _check_export_target(out, force)
    copies = {name: data for name in (CONFIG, RESULT, "metrics.csv") if (data := _read_own(run_dir / name)) is not None}
    for name in (checkpoint.CHECKPOINT, checkpoint.META):
        if (run_dir / name).is_symlink():
            raise ValueError(f"{run_dir / name}: a symbolic link; export copies only the run's own files")
    config = read_config(run_dir)
    found = checkpoint.read(run_dir)
    check_experiment(run_dir, found[1])
    run = build(config)
    state, meta = checkpoint.load(run_dir, init_state(run, config), found)
    if replace:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    kept = (*checkpoint.PROGRESS, checkpoint.CONFIG_SHA256, EXPERIMENT)
    checkpoint.save(out, _policies(state, run.strategy.mean(state.strategy)),
                    {k: meta[k] for k in kept if k in meta} | {"kind": POLICIES})
    if RESULT in copies:
        copies[RESULT] = _without_run_dir(copies[RESULT])
    for name, data in copies.items():
        checkpoint.atomic_write(out / name, data)
    return out


def _is_export(path: Path) -> bool:
    """Whether `path` holds an exported controller (`export_policy`)."""
    return checkpoint.exists(path) and checkpoint.load_meta(path).get("kind") == POLICIES


def _check_export_target(out: Path, force: bool) -> bool:
    """Whether `export_policy` replaces `out` (an earlier export, with `force`); refuses any
    other directory that is not empty."""
    if not out.exists() or not any(out.iterdir()):
        return False
    if not force:
        raise FileExistsError(f"{out}: exists and is not empty; choose a new directory, or pass --force "
                              "(force=True) to replace an earlier export there")
    if out.is_symlink() or not _is_export(out):
        raise FileExistsError(f"{out}: not an exported controller, so --force does not replace it; "
                              "choose a new directory")
    return True


def _without_run_dir(result: bytes) -> bytes:
    """`result.json` without the path of the run it came from (a path on the machine that ran
    it, meaningless where the controller is shipped)."""
    try:
        summary = json.loads(result)
    except ValueError:
        return result
    if not isinstance(summary, dict):
        return result
    summary.pop("run_dir", None)
    return json.dumps(summary, indent=2, allow_nan=False).encode()


def _read_own(path: Path) -> bytes | None:
    """The bytes of the regular file `path` (None: absent); refuses a symbolic link, whose
    target is not the run's own file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{path}: a symbolic link; export copies only the run's own files") from None
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read() if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None


class Done(NamedTuple):
    """`open_shared`'s answer for a complete run: nothing to do but return its summary."""

    summary: dict  # result.json's, or (none written) the run directory and its generations


class Opened(NamedTuple):
    """`open_shared`'s answer for a run to (continue to) run, on every process."""

    run_dir: Path
    resuming: bool
    config: EvolveConfig
    meta: dict  # the progress it starts from (checkpoint.json's, or a new run's)
    last: int  # the generation it ends at (`last_generation`)
    run: Run  # `build(config)`
    lock: Lock | None = None  # process 0's, held until the run ends
    saved: tuple | None = None  # process 0's checkpoint as `checkpoint.read` returned it, whose metadata `meta` is


def open_shared(config: EvolveConfig | None, options: RunOptions, primary: bool) -> Opened | Done:
    """Prepares (or resumes) the run directory on process 0 and tells every process what it
    found: `Done` for a complete run, else `Opened`, with the programs built once (on process 0
    before any write when `config` is given: a bad config writes nothing). An error on process 0
    is raised on every process."""
    opened: dict = {}
    error = run = None
    held: dict = {}
    if primary:
        try:
            if config is not None:
                run = build(config)
            opened, held = _open_primary(config, options)
        except Exception as e:
            error = e
    try:
        shared = distributed.broadcast_json({"error": f"process 0: {type(error).__name__}: {error}"} if error
                                            else opened)
    except BaseException:
        if "lock" in held:
            held["lock"].release(discard_dir=True)
        raise
    if error is not None:
        raise error
    if "error" in shared:
        raise RuntimeError(shared["error"])
    if "done" in shared:
        return Done(shared["done"])
    experiment = held.get("config") or config_from_dict(shared["config"])
    try:
        run = run if run is not None and experiment is config else build(experiment)
    except BaseException:
        if "lock" in held:
            held["lock"].release(discard_dir=True)
        raise
    return Opened(Path(shared["run_dir"]), shared["resuming"], experiment, shared["meta"], int(shared["last"]), run,
                  held.get("lock"), held.get("saved"))


def _open_primary(config: EvolveConfig | None, options: RunOptions) -> tuple[dict, dict]:
    """Process 0's part of `open_shared`: `(what every process is told, what process 0 keeps:
    lock, config, saved)`.
    Everything is read under the lock; a complete run's lock is released at once."""
    lock, prepared = open_run(config, options)
    try:
        saved = checkpoint.read(prepared.run_dir) if prepared.resuming else None
        meta = _start_meta(prepared, saved)
        if prepared.resuming and prepared.config.run.num_generations < int(meta["generation"]):
            raise ValueError(f"--resume {prepared.run_dir}: num_generations {prepared.config.run.num_generations} is "
                             f"below "
                             f"the {meta['generation']} generations the run has run; a run cannot be shortened "
                             f"(leave num_generations out, or raise it to continue)")
        opened = {"run_dir": str(prepared.run_dir), "resuming": prepared.resuming,
                  "config": prepared.config.to_dict(), "meta": meta,
                  "last": last_generation(meta, prepared.config, prepared.saved)}
        done = prepared.resuming and complete(meta, prepared.config, prepared.saved,
                                              read_result(prepared.run_dir))
        if done:
            logging.getLogger("popeval").info(
                "run %s is complete (%s); nothing to do (raise num_generations to continue it)",
                prepared.run_dir, done)
            opened["done"] = (read_result(prepared.run_dir)
                              or {"run_dir": str(prepared.run_dir), "generations": meta["generation"]})
            lock.release()
            return opened, {}
        write_config(prepared)
    except BaseException:
        lock.release(discard_dir=True)
        raise
    return opened, {"lock": lock, "config": prepared.config, "saved": saved}


def _start_meta(prepared: Prepared, saved: tuple | None) -> dict:
    """The progress a run starts from: the checkpoint's metadata (`saved`), or a new run's."""
    experiment = _hashed(prepared.config if prepared.saved is None else _saved_dict(prepared.run_dir))
    meta = {"generation": 0, "env_steps": 0, "elapsed_seconds": 0.0, "wandb_id": None, "solved_at": None,
            checkpoint.CONFIG_SHA256: config_hash(experiment), EXPERIMENT: experiment}
    if saved is None:
        return meta
    if saved[1].get("kind") == POLICIES:
        raise ValueError(f"--resume {prepared.run_dir}: an exported controller (its policies, without the "
                         "strategy's state) cannot be resumed; resume the run it was exported from")
    check_experiment(prepared.run_dir, saved[1], f"--resume {prepared.run_dir}")
    # A checkpoint from before config hashes (or the experiment's copy) gets them at its next save.
    return {**meta, **saved[1]}


def complete(meta: dict, config: EvolveConfig, saved: EvolveConfig | None, result: dict | None) -> str | None:
    """Why a resumed run has nothing left to do, or None. A run that has run its generations
    or reached its target (`last_generation`) but whose `result.json` is missing or of another
    generation (stopped after its last checkpoint, however, or shortened to it) is not done: it
    still owes its final evaluation."""
    gen = int(meta["generation"])
    if gen < last_generation(meta, config, saved) or (result or {}).get("generations") != gen:
        return None
    if gen < config.run.num_generations:
        return f"its target {config.run.target} was reached at generation {gen}"
    return f"generation {gen} of {config.run.num_generations}"


def last_generation(meta: dict, config: EvolveConfig, saved: EvolveConfig | None) -> int:
    """The generation a run ends at: its budget, or (`stop_at_target`) the generation of its
    checkpoint when that generation reached the target and `num_generations` was not raised
    since (a raised run continues past its target)."""
    solved = (meta.get("solved_at") or {}).get("generation")
    raised = saved is not None and config.run.num_generations > saved.run.num_generations
    if config.run.stop_at_target and solved == int(meta["generation"]) and not raised:
        return solved
    return config.run.num_generations
