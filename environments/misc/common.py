"""What the misc environments share: range-checked `EnvParams`, grid cells and moves, and
the meta-RL bandit base class.

`params_dataclass` makes a flax struct dataclass whose `replace` checks every field declared
with `bounded(...)` and then calls the class's `check_values()`, if any (cross-field rules).
`make` builds the default params and `replace`s the overrides, so
`make("PointRobot-misc", noise_std=-1.0)` raises a `ValueError` at `make` time. The check runs on
concrete values only (traced values inside `jit`/`vmap` are skipped) and only in `replace`:
JAX rebuilds pytrees through `__init__` with arbitrary leaves (tracers, `in_axes` specs such
as 0 or None), so `__init__` must not validate.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import check_int
from ..environment import Environment

__all__ = [
    "DIRECTIONS",
    "BanditState",
    "MetaBandit",
    "bounded",
    "check_params",
    "free_cells",
    "params_dataclass",
    "params_name",
    "uniform_cell",
    "wall_step",
]

#: Row/column offsets of the four grid actions, in gymnasium FrozenLake's order:
#: 0 left, 1 down, 2 right, 3 up.
DIRECTIONS = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]], dtype=np.int32)  # numpy: no JAX work at import


def bounded(default: Any, low: float = -math.inf, high: float = math.inf, *, open_low=False):
    """An `EnvParams` field whose values must lie in `[low, high]` (`(low, high]` if `open_low`)."""
    return struct.field(default=default, metadata={"bounds": (low, high, open_low)})


def params_name(params: Any) -> str:
    """`"point_robot.EnvParams"`: how error messages name a params class."""
    return f"{type(params).__module__.rsplit('.', 1)[-1]}.{type(params).__qualname__}"


def check_params(params: Any) -> Any:
    """Raises `ValueError` if a concrete `bounded` field of `params` is out of range."""
    for f in dataclasses.fields(params):
        if "bounds" not in f.metadata:
            continue
        value = getattr(params, f.name)
        leaves = jax.tree.leaves(value)
        if not leaves or any(isinstance(v, jax.core.Tracer) for v in leaves):
            continue
        low, high, open_low = f.metadata["bounds"]
        arr = np.concatenate([np.ravel(np.asarray(v, dtype=np.float64)) for v in leaves])
        ok = (arr > low if open_low else arr >= low) & (arr <= high) & ~np.isnan(arr)
        if not np.all(ok):
            interval = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise ValueError(
                f"{params_name(params)}: {f.name}={value!r} is out of range, "
                f"expected values in {interval}"
            )
    if hasattr(params, "check_values") and not any(
        isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(params)
    ):
        params.check_values()  # cross-field checks of concrete params
    return params


def params_dataclass(cls):
    """`flax.struct.dataclass` whose `replace` range-checks the `bounded` fields."""
    cls = struct.dataclass(cls)

    def replace(self, **updates):
        return check_params(dataclasses.replace(self, **updates))

    cls.replace = replace
    return cls


def free_cells(walls: np.ndarray) -> np.ndarray:
    """(row, col) of every non-wall cell, row-major: an int32 array of shape (K, 2)."""
    return np.argwhere(~walls).astype(np.int32)


def uniform_cell(key: jax.Array, cells: jax.Array, exclude: jax.Array) -> jax.Array:
    """A uniformly drawn row of `cells` (K, 2) other than `exclude` (2,)."""
    allowed = jnp.any(cells != exclude, axis=-1)
    return cells[jax.random.choice(key, len(cells), p=allowed / allowed.sum())]


def wall_step(walls: jax.Array, pos: jax.Array, direction: jax.Array):
    """Moves `pos` one cell in `direction` unless a wall is there.

    `walls` must have walls on its border, so the target cell is always inside the grid.
    Returns `(new_pos, bumped)`.
    """
    target = pos + jnp.asarray(DIRECTIONS)[direction]
    bumped = walls[target[0], target[1]]
    return jnp.where(bumped, pos, target), bumped


@struct.dataclass
class BanditState:
    arms: jax.Array  # (num_arms,) the task: success probabilities or reward means
    last_action: jax.Array  # int32; -1 before the first pull
    last_reward: jax.Array  # float32
    time: jax.Array


class MetaBandit(Environment):
    """A meta-RL multi-armed bandit (Wang et al. 2016; Duan et al. 2016).

    The arms are drawn at reset (one task per episode). The observation is the RL^2 input
    `[one_hot(last_action) (num_arms), last_reward, time / max_steps_in_episode]`
    (all zeros but the time on the first step); the episode never terminates and is
    truncated after `max_steps_in_episode` pulls. Subclasses define the arm distribution.
    """

    def __init__(self, num_arms: int = 2):
        self.num_arms = check_int(type(self).__name__, "num_arms", num_arms, 1)

    def draw_arms(self, key, params) -> jax.Array:
        raise NotImplementedError

    def draw_reward(self, key, arms, action, params) -> jax.Array:
        raise NotImplementedError

    def reward_bounds(self, params) -> tuple[Any, Any]:
        raise NotImplementedError

    def reset_state(self, key, params):
        return BanditState(
            arms=self.draw_arms(key, params).astype(jnp.float32),
            last_action=jnp.int32(-1),
            last_reward=jnp.float32(0.0),
            time=jnp.int32(0),
        )

    def transition(self, key, state, action, params):
        reward = self.draw_reward(key, state.arms, action, params).astype(jnp.float32)
        return state.replace(last_action=action, last_reward=reward), reward, jnp.bool_(False)

    def get_obs(self, state, params=None, key=None):
        params = self._params(params)
        progress = jnp.minimum(state.time / params.max_steps_in_episode, 1.0)
        return jnp.concatenate(
            [
                jax.nn.one_hot(state.last_action, self.num_arms, dtype=jnp.float32),
                jnp.stack([state.last_reward, progress]).astype(jnp.float32),
            ]
        )

    def observation_space(self, params=None):
        params = self._params(params)
        low, high = self.reward_bounds(params)
        n = self.num_arms
        return spaces.Box(
            jnp.concatenate([jnp.zeros(n), jnp.stack([jnp.asarray(low, float), 0.0])]),
            jnp.concatenate([jnp.ones(n), jnp.stack([jnp.asarray(high, float), 1.0])]),
            (n + 2,),
            jnp.float32,
        )

    def action_space(self, params=None):
        return spaces.Discrete(self.num_arms)
