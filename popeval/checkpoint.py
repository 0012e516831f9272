"""Checkpoints: flax-serialised (msgpack) pytrees plus JSON metadata, written atomically.

No pickles: a checkpoint restores into a template pytree built by a fresh run with the same
config, so it is portable across machines and JAX versions that keep the same structure.

`checkpoint.msgpack` is the one commit point: it holds the state, the progress counters a
resumption needs (`generation`, `env_steps`) and a SHA-256 of both, so its bytes depend on
the computation alone, a corrupted file is refused with an error naming it, and a process
killed between writing it and `checkpoint.json` (the rest of the metadata: wall time, when the
target was reached, the W&B id) still resumes from consistent counters (the rest is then one
checkpoint old). Every write goes to a temporary file that is renamed into place, or removed
when the write fails: a full disk leaves the previous checkpoint and no litter. Checkpoints
of earlier versions (the state alone, or state and counters without a checksum) still load.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from popeval import keys

__all__ = ["save", "load", "load_meta", "load_state_dict", "exists", "atomic_write", "CheckpointError",
           "CHECKPOINT", "META", "PROGRESS"]

CHECKPOINT = "checkpoint.msgpack"
META = "checkpoint.json"
_FORMAT = 3  # 1: the state alone; 2: {"state", "progress"}; 3: {"format", "sha256", "payload"}
#: Metadata fields stored inside `checkpoint.msgpack` with the state (deterministic counters).
PROGRESS = ("generation", "env_steps")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (corrupted, truncated, or not a checkpoint)."""


def atomic_write(path: Path, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file and a rename; on failure the old file
    is intact and the temporary file removed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _to_numpy(tree: Any) -> Any:
    """Host numpy arrays; typed PRNG keys become their raw key data."""
    return jax.tree.map(lambda x: np.asarray(jax.device_get(keys.to_raw(x))), tree)


def save(run_dir: str | os.PathLike, state: Any, meta: dict) -> None:
    """Writes `state` and `meta` (JSON-serialisable) to `run_dir`; a crash leaves the old ones."""
    run_dir = Path(run_dir)
    payload = serialization.msgpack_serialize(
        {"state": serialization.to_state_dict(_to_numpy(state)), "progress": {k: int(meta[k]) for k in PROGRESS}})
    wrapped = {"format": _FORMAT, "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}
    atomic_write(run_dir / CHECKPOINT, serialization.msgpack_serialize(wrapped))
    atomic_write(run_dir / META, json.dumps(meta, indent=2, sort_keys=True).encode())


def exists(run_dir: str | os.PathLike) -> bool:
    """Whether `run_dir` holds a checkpoint (its commit point, `checkpoint.msgpack`)."""
    return (Path(run_dir) / CHECKPOINT).is_file()


def _read(run_dir: Path) -> tuple[Any, dict]:
    """`(state dict, meta)` of the checkpoint in `run_dir`: the msgpack's counters win over a
    `checkpoint.json` that a kill left one checkpoint behind."""
    path = run_dir / CHECKPOINT
    try:
        raw = serialization.msgpack_restore(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - msgpack raises many kinds on damaged input
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    if isinstance(raw, dict) and raw.get("format") == _FORMAT:
        payload = raw.get("payload")
        if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != raw.get("sha256"):
            raise CheckpointError(f"{path}: corrupted checkpoint (its SHA-256 does not match its contents)")
        raw = serialization.msgpack_restore(payload)
    try:
        meta = json.loads((run_dir / META).read_text())
    except FileNotFoundError:
        meta = {}  # killed before the first checkpoint.json: the counters are in the msgpack
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{run_dir / META}: unreadable checkpoint metadata ({e})") from None
    if isinstance(raw, dict) and set(raw) == {"state", "progress"}:
        meta.update({k: int(v) for k, v in raw["progress"].items()})
        return raw["state"], meta
    if "generation" not in meta:
        raise CheckpointError(f"{run_dir / META}: missing (a checkpoint of the first format needs it)")
    return raw, meta  # the first layout: the state alone


def load_meta(run_dir: str | os.PathLike) -> dict:
    """The metadata of the last checkpoint."""
    return _read(Path(run_dir))[1]


def load_state_dict(run_dir: str | os.PathLike) -> Any:
    """The saved state as nested dicts of numpy arrays (no template needed)."""
    return _read(Path(run_dir))[0]


def load(run_dir: str | os.PathLike, template: Any) -> tuple[Any, dict]:
    """Restores `(state, meta)` into the structure of `template`."""
    state_dict, meta = _read(Path(run_dir))
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
