"""MetaMaze-misc: find a hidden reward in a maze, again and again within one episode.

Miconi, Rawal, Clune & Stanley (2019), "Backpropamine: training self-modifying neural
networks with differentiable neuromodulated plasticity", maze navigation task (first in
Miconi, Clune & Stanley 2018, "Differentiable plasticity"). The maze is a `size` x `size`
grid (default 11: a 9x9 interior) with walls on its border and on every interior cell whose
row and column are both even, except the centre cell. Four actions (0 left, 1 down,
2 right, 3 up); a move into a wall leaves the agent in place and costs `wall_penalty`.

At reset the agent is at the centre and the reward cell is drawn uniformly from the other
free cells; it stays put for the whole episode. Entering it pays `goal_reward` and
teleports the agent to a uniformly drawn free cell other than the reward cell, so the
agent must remember where the reward was. The episode never terminates and is truncated
after `max_steps_in_episode` (200) steps. The agent sees only the walls of its 3x3
neighbourhood; the observation is `[walls around the agent (9, row-major, 1 = wall),
one_hot(last_action) (4), last_reward, time / max_steps_in_episode]` (float32, 15 values).

No reference package implements it; `tests/environments/test_misc.py` checks these properties.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import bounded, check_int, params_dataclass
from ..environment import Environment
from .common import free_cells, uniform_cell, wall_step


def maze_walls(size: int) -> np.ndarray:
    """The Backpropamine maze: border walls plus walls at (even row, even column) cells."""
    index = np.arange(size)
    walls = (index[:, None] % 2 == 0) & (index[None, :] % 2 == 0)
    walls[[0, -1], :] = walls[:, [0, -1]] = True
    walls[size // 2, size // 2] = False
    return walls


@struct.dataclass
class EnvState:
    pos: jax.Array  # (2,) int32 row, col
    goal: jax.Array  # (2,) int32 row, col of the reward cell
    last_action: jax.Array  # int32; -1 before the first step
    last_reward: jax.Array  # float32
    time: jax.Array


@params_dataclass
class EnvParams:
    goal_reward: float = bounded(10.0)
    wall_penalty: float = bounded(0.1, 0.0)  # paid (as -wall_penalty) for bumping into a wall
    max_steps_in_episode: int = bounded(200, 1)


class MetaMaze(Environment):
    """Four actions (0 left, 1 down, 2 right, 3 up); `size` (odd, >= 5) sets the maze."""

    env_id = "MetaMaze-misc"
    def __init__(self, size: int = 11):
        size = check_int("MetaMaze", "size", size, 5)
        if size % 2 == 0:
            raise ValueError(f"MetaMaze: size must be odd (walls sit on even cells), got {size}")
        self.size = size
        self.walls = maze_walls(size)  # (size, size) bool numpy array
        self._walls = jnp.asarray(self.walls)
        self._cells = jnp.asarray(free_cells(self.walls))
        self._centre = jnp.array([size // 2, size // 2], jnp.int32)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        return EnvState(
            pos=self._centre,
            goal=uniform_cell(key, self._cells, self._centre),
            last_action=jnp.int32(-1),
            last_reward=jnp.float32(0.0),
            time=jnp.int32(0),
        )

    def transition(self, key, state, action, params):
        pos, bumped = wall_step(self._walls, state.pos, action)
        found = jnp.all(pos == state.goal)
        pos = jnp.where(found, uniform_cell(key, self._cells, state.goal), pos)
        penalty = jnp.where(bumped, params.wall_penalty, 0.0)
        reward = (jnp.where(found, params.goal_reward, 0.0) - penalty).astype(jnp.float32)
        next_state = state.replace(pos=pos, last_action=action, last_reward=reward)
        return next_state, reward, jnp.bool_(False)

    def get_obs(self, state, params=None, key=None):
        params = self._params(params)
        view = jax.lax.dynamic_slice(self._walls, state.pos - 1, (3, 3))
        progress = jnp.minimum(state.time / params.max_steps_in_episode, 1.0)
        return jnp.concatenate(
            [
                view.ravel().astype(jnp.float32),
                jax.nn.one_hot(state.last_action, 4, dtype=jnp.float32),
                jnp.stack([state.last_reward, progress]).astype(jnp.float32),
            ]
        )

    def observation_space(self, params=None):
        params = self._params(params)
        low = jnp.zeros(15).at[13].set(jnp.minimum(-params.wall_penalty, params.goal_reward))
        high = jnp.ones(15).at[13].set(jnp.maximum(params.goal_reward, 0.0))
        return spaces.Box(low, high, (15,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(4)
