"""What the bsuite environments share: seed checks and observation pieces."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..checks import check_int

__all__ = ["check_seed", "one_hot_board", "time_left"]


def check_seed(env: str, name: str, value) -> int:
    """A seed for numpy's `RandomState` (an integer in [0, 2**32)), as bsuite uses them."""
    value = check_int(env, name, value, 0)
    if value >= 2**32:
        raise ValueError(f"{env}: {name} must be < 2**32, got {value!r}")
    return value


def one_hot_board(shape: tuple[int, int], row: jax.Array, col: jax.Array) -> jax.Array:
    """A float32 board of `shape`, 1 at (row, col) and 0 elsewhere (all 0 when off the board).

    Built from comparisons rather than a scatter, which is cheaper under `vmap`.
    """
    rows = jnp.arange(shape[0]) == row
    cols = jnp.arange(shape[1]) == col
    return (rows[:, None] & cols[None, :]).astype(jnp.float32)


def time_left(time: jax.Array, length: int) -> jax.Array:
    """bsuite's `1 - time / length` (float32), with `time` clipped to [0, length]."""
    return 1.0 - jnp.clip(time, 0, length).astype(jnp.float32) / length
