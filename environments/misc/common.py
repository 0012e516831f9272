"""What the misc environments share: grid cells and moves, and the meta-RL bandit base class.

Their `EnvParams` are range-checked at `make`/`replace` time by the mechanism every family
uses (`bounded`, `flag` and `params_dataclass` in `environments/checks.py`).
"""

from __future__ import annotations

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
    "free_cells",
    "uniform_cell",
    "wall_step",
]

#: Row/column offsets of the four grid actions, in gymnasium FrozenLake's order:
#: 0 left, 1 down, 2 right, 3 up.
DIRECTIONS = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]], dtype=np.int32)  # numpy: no JAX work at import


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
