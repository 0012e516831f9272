"""Checkpoints: flax-serialised (msgpack) pytrees plus JSON metadata, written atomically.

No pickles: a checkpoint restores into a template pytree built by a fresh run with the same
config, so it is portable across machines and JAX versions that keep the same structure.

`checkpoint.msgpack` is the one commit point: it holds the state, the progress counters a
resumption needs (`generation`, `env_steps`, and the generation that reached the run's target,
when one did), the caller's SHA-256 of the experiment that made it (`config_sha256`, when
given) and a SHA-256 of all that, so its bytes depend on the computation alone, a corrupted
file is refused with an error naming it, and a process killed between writing it and
`checkpoint.json` (the rest of the metadata: wall time, the seconds at which the target was
reached, the W&B id) still resumes from consistent counters (the rest is then one checkpoint
old). Counters out of range, and a checkpoint of a later format, are refused by name. Every
write goes to a temporary file that is renamed into place, or removed when the write fails: a
full disk leaves the previous checkpoint and no litter. Checkpoints of earlier versions (the
state alone, or state and counters without a checksum, an experiment hash or the target's
generation) still load.

`atomic_write` is the one way popeval replaces a file in a run directory: it never writes
through a symbolic link (a link planted at the file or its temporary is replaced, not
followed), and the replaced file keeps its permission bits. `open_append` appends without
following a link.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from popeval import keys

__all__ = ["save", "load", "read", "load_meta", "load_state_dict", "exists", "atomic_write", "open_append",
           "CheckpointError", "CHECKPOINT", "META", "PROGRESS", "CONFIG_SHA256", "SOLVED_GENERATION"]

CHECKPOINT = "checkpoint.msgpack"
META = "checkpoint.json"
_FORMAT = 3  # 1: the state alone; 2: {"state", "progress"}; 3: {"format", "sha256", "payload"}
#: Metadata fields stored inside `checkpoint.msgpack` with the state (deterministic counters).
PROGRESS = ("generation", "env_steps")
#: The metadata field holding a SHA-256 of the experiment that made the checkpoint (the caller
#: computes it); stored inside `checkpoint.msgpack` too, when present.
CONFIG_SHA256 = "config_sha256"
#: The progress field (inside `checkpoint.msgpack` only) holding the generation of the metadata's
#: `solved_at`: a kill before `checkpoint.json` is written must not lose that the target was reached.
SOLVED_GENERATION = "solved_generation"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (corrupted, truncated, or not a checkpoint)."""


def atomic_write(path: Path, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file and a rename; on failure the old file
    is intact and the temporary file removed. Never follows a symbolic link (at `path` the
    link itself is replaced), and a replaced regular file keeps its permission bits."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a stale temporary, or a planted link: unlink never follows it
    try:
        mode = _mode_of(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # a full disk fails in write or fsync, which name no file
        raise


def _mode_of(path: Path) -> int | None:
    """The permission bits of the regular file at `path` (None: no file, or a link)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def open_append(path: str | os.PathLike, newline: str | None = "") -> Any:
    """`open(path, "a", newline=newline)` that refuses a symbolic link at `path` (OSError ELOOP)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(fd, "a", newline=newline)


def _to_numpy(tree: Any) -> Any:
    """Host numpy arrays; typed PRNG keys become their raw key data."""
    return jax.tree.map(lambda x: np.asarray(jax.device_get(keys.to_raw(x))), tree)


def save(run_dir: str | os.PathLike, state: Any, meta: dict) -> None:
    """Writes `state` and `meta` (JSON-serialisable) to `run_dir`; a crash leaves the old ones."""
    run_dir = Path(run_dir)
    progress = {k: int(meta[k]) for k in PROGRESS}
    if meta.get(CONFIG_SHA256) is not None:
        progress[CONFIG_SHA256] = str(meta[CONFIG_SHA256])
    if meta.get("solved_at") is not None:
        progress[SOLVED_GENERATION] = int(meta["solved_at"]["generation"])
    payload = serialization.msgpack_serialize(
        {"state": serialization.to_state_dict(_to_numpy(state)), "progress": progress})
    wrapped = {"format": _FORMAT, "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}
    for name, data in ((CHECKPOINT, serialization.msgpack_serialize(wrapped)),
                       (META, json.dumps(meta, indent=2, sort_keys=True).encode())):
        try:
            atomic_write(run_dir / name, data)
        except OSError as e:
            raise _save_error(e, run_dir, name) from e


def _save_error(e: OSError, run_dir: Path, name: str) -> OSError:
    """`e` (a full disk, say) naming the file being written and the checkpoint the run keeps."""
    try:
        kept = f"the checkpoint of generation {read(run_dir)[1]['generation']}"
    except (CheckpointError, OSError, KeyError):
        kept = "no checkpoint"
    return type(e)(e.errno, f"{e.strerror or e} while writing {run_dir / name}; {run_dir} keeps {kept}")


def exists(run_dir: str | os.PathLike) -> bool:
    """Whether `run_dir` holds a checkpoint (its commit point, `checkpoint.msgpack`)."""
    return (Path(run_dir) / CHECKPOINT).is_file()


def read(run_dir: str | os.PathLike) -> tuple[Any, dict]:
    """`(state dict, meta)` of the checkpoint in `run_dir`, from one read: the msgpack's
    counters win over a `checkpoint.json` that a kill left one checkpoint behind."""
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT
    try:
        raw = serialization.msgpack_restore(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - msgpack raises many kinds on damaged input
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    _check_format(raw, path)
    if isinstance(raw, dict) and raw.get("format") == _FORMAT:
        payload = raw.get("payload")
        if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != raw.get("sha256"):
            raise CheckpointError(f"{path}: corrupted checkpoint (its SHA-256 does not match its contents)")
        raw = _restore_payload(payload, path)
    try:
        meta = json.loads((run_dir / META).read_text())
    except FileNotFoundError:
        meta = {}  # killed before the first checkpoint.json: the counters are in the msgpack
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{run_dir / META}: unreadable checkpoint metadata ({e})") from None
    _check_meta(meta, run_dir / META)
    if isinstance(raw, dict) and set(raw) == {"state", "progress"}:
        meta.update(_progress(raw["progress"], path, meta.get("solved_at")))
        return raw["state"], meta
    if "generation" not in meta:
        raise CheckpointError(f"{run_dir / META}: missing (a checkpoint of the first format needs it)")
    return raw, meta  # the first layout: the state alone


def _check_format(raw: Any, path: Path) -> None:
    """Refuses a checkpoint of a later format than this popeval writes (it cannot know its layout)."""
    made = raw.get("format") if isinstance(raw, dict) and "payload" in raw else None
    if isinstance(made, int) and not isinstance(made, bool) and made > _FORMAT:
        raise CheckpointError(f"{path}: made by a newer popeval (checkpoint format {made}; this popeval reads "
                              f"formats up to {_FORMAT}); upgrade popeval to load it")


def _progress(progress: Any, path: Path, solved_at: dict | None) -> dict:
    """The checksummed counters as metadata fields, each range-checked. Where `checkpoint.json`
    is one checkpoint behind and missed the generation that reached the target, `solved_at`
    gets it back, without the seconds (wall time, which only `checkpoint.json` holds)."""
    if not isinstance(progress, dict):
        raise CheckpointError(f"{path}: progress must be a map, got {type(progress).__name__}")
    out = {k: _count(progress.get(k), f"progress.{k}", path) for k in PROGRESS}
    if CONFIG_SHA256 in progress:
        made_by = progress[CONFIG_SHA256]
        if not isinstance(made_by, str):
            raise CheckpointError(f"{path}: progress.{CONFIG_SHA256} must be a string, got {made_by!r:.60}")
        out[CONFIG_SHA256] = made_by
    if progress.get(SOLVED_GENERATION) is not None:
        solved = _count(progress[SOLVED_GENERATION], f"progress.{SOLVED_GENERATION}", path, low=1,
                        high=out["generation"])
        if (solved_at or {}).get("generation") != solved:
            out["solved_at"] = {"generation": solved, "seconds": None}
    return out


def _count(value: Any, field: str, path: Path, low: int = 0, high: int | None = None) -> int:
    """`value` as a counter from `low` to `high` (no bound: None), or an error naming `field`."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"from {low} to {high}"
        raise CheckpointError(f"{path}: {field} must be an integer {bound}, got {value!r:.60}")
    return int(value)


def _restore_payload(payload: bytes, path: Path) -> Any:
    """The checksummed payload's pytree; a well-formed but unloadable one (an object array) is refused."""
    try:
        return serialization.msgpack_restore(payload)
    except Exception as e:  # noqa: BLE001 - msgpack and numpy raise many kinds on crafted input
        raise CheckpointError(f"{path}: not a loadable checkpoint ({type(e).__name__}: {e})") from None


#: `checkpoint.json`'s fields: the types each may hold, in Python and in words.
_META_TYPES = {
    "generation": ((int,), "an integer"),
    "env_steps": ((int,), "an integer"),
    "elapsed_seconds": ((int, float, type(None)), "a number or null"),
    "wandb_id": ((str, type(None)), "a string or null"),
    "solved_at": ((dict, type(None)), "an object or null"),
    CONFIG_SHA256: ((str, type(None)), "a string or null"),
    "experiment": ((dict, type(None)), "an object or null"),
}


#: `checkpoint.json`'s counters, which are never negative.
_NON_NEGATIVE = ("generation", "env_steps", "elapsed_seconds")


def _check_meta(meta: Any, path: Path) -> None:
    """Refuses checkpoint metadata that is not a JSON object with fields of the expected types."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: checkpoint metadata must be a JSON object, got {type(meta).__name__}")
    for key, (types, words) in _META_TYPES.items():
        value = meta.get(key)
        if key in meta and (isinstance(value, bool) or not isinstance(value, types)):
            raise CheckpointError(f"{path}: {key} must be {words}, got {value!r:.60}")
        if key in _NON_NEGATIVE and value is not None and not 0 <= value < math.inf:
            raise CheckpointError(f"{path}: {key} must be >= 0 (and finite), got {value!r:.60}")
    if meta.get("solved_at") is not None:
        _count(meta["solved_at"].get("generation"), "solved_at.generation", path, low=1)


def load_meta(run_dir: str | os.PathLike) -> dict:
    """The metadata of the last checkpoint."""
    return read(run_dir)[1]


def load_state_dict(run_dir: str | os.PathLike) -> Any:
    """The saved state as nested dicts of numpy arrays (no template needed)."""
    return read(run_dir)[0]


def load(run_dir: str | os.PathLike, template: Any, saved: tuple[Any, dict] | None = None) -> tuple[Any, dict]:
    """Restores `(state, meta)` into the structure of `template`.

    Args:
        run_dir: the directory holding the checkpoint.
        template: a pytree of the state's structure, shapes and dtypes.
        saved: what `read(run_dir)` returned, when it was read already (the state and the
            metadata of one read); `None` reads it now.
    """
    state_dict, meta = read(run_dir) if saved is None else saved
    try:
        raw = serialization.from_state_dict(_to_numpy(template), state_dict)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{Path(run_dir) / CHECKPOINT}: does not match this config's state ({e})") from None

    def restore(t, x):
        if keys.is_typed_key(t):
            return keys.from_raw(np.asarray(x), t)
        if np.shape(x) != np.shape(t):
            raise CheckpointError(f"{Path(run_dir) / CHECKPOINT}: an array of shape {np.shape(x)} where this "
                                  f"config's state has {np.shape(t)}")
        return np.asarray(x, dtype=np.asarray(t).dtype)

    return jax.tree.map(restore, template, raw), meta
