"""Checkpoints: flax-serialised (msgpack) pytrees plus JSON metadata, written atomically.

No pickles: a checkpoint restores into a template pytree built by a fresh run with the same
config, so it is portable across machines and JAX versions that keep the same structure.

`checkpoint.msgpack` is the one commit point: it holds the state together with the progress
counters a resumption needs (`generation`, `env_steps`), so a process killed between writing
it and `checkpoint.json` (the full metadata, also for people and tools) still resumes
consistently. Checkpoints written before the counters moved in (state alone in the msgpack)
still load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from popeval import keys

__all__ = ["save", "load", "load_meta", "exists", "CHECKPOINT", "META", "PROGRESS"]

CHECKPOINT = "checkpoint.msgpack"
META = "checkpoint.json"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _to_numpy(tree: Any) -> Any:
    """Host numpy arrays; typed PRNG keys become their raw key data."""
    return jax.tree.map(lambda x: np.asarray(jax.device_get(keys.to_raw(x))), tree)


#: Metadata fields stored inside `checkpoint.msgpack` with the state (deterministic counters).
PROGRESS = ("generation", "env_steps")


def save(run_dir: str | os.PathLike, state: Any, meta: dict) -> None:
    """Writes `state` and `meta` (JSON-serialisable) to `run_dir`; a crash leaves the old ones."""
    run_dir = Path(run_dir)
    payload = {"state": serialization.to_state_dict(_to_numpy(state)),
               "progress": {k: int(meta[k]) for k in PROGRESS}}
    _atomic_write(run_dir / CHECKPOINT, serialization.msgpack_serialize(payload))
    _atomic_write(run_dir / META, json.dumps(meta, indent=2, sort_keys=True).encode())


def exists(run_dir: str | os.PathLike) -> bool:
    run_dir = Path(run_dir)
    return (run_dir / CHECKPOINT).is_file() and (run_dir / META).is_file()


def _read(run_dir: Path) -> tuple[Any, dict]:
    """`(state dict, meta)`: the counters of the msgpack win over a `checkpoint.json` that a
    kill left one checkpoint behind."""
    raw = serialization.msgpack_restore((run_dir / CHECKPOINT).read_bytes())
    meta = json.loads((run_dir / META).read_text())
    if isinstance(raw, dict) and set(raw) == {"state", "progress"}:
        meta.update({k: int(v) for k, v in raw["progress"].items()})
        return raw["state"], meta
    return raw, meta  # the older layout: the state alone


def load_meta(run_dir: str | os.PathLike) -> dict:
    """The metadata of the last checkpoint."""
    return _read(Path(run_dir))[1]


def load(run_dir: str | os.PathLike, template: Any) -> tuple[Any, dict]:
    """Restores `(state, meta)` into the structure of `template`."""
    state_dict, meta = _read(Path(run_dir))
    raw = serialization.from_state_dict(_to_numpy(template), state_dict)

    def restore(t, x):
        if keys.is_typed_key(t):
            return keys.from_raw(np.asarray(x), t)
        return np.asarray(x, dtype=np.asarray(t).dtype)

    return jax.tree.map(restore, template, raw), meta
