"""FourRooms-misc: navigate between four connected rooms to a goal cell.

Sutton, Precup & Singh (1999), "Between MDPs and semi-MDPs: A framework for temporal
abstraction in reinforcement learning" (the rooms example): a 13x13 grid (walls on the
border) of four rooms joined by four one-cell hallways, 104 free cells. Four actions
(0 left, 1 down, 2 right, 3 up); as in the paper, an action moves the agent one cell in its
direction with probability `1 - fail_prob` (2/3) and otherwise in one of the three other
directions, each with probability `fail_prob / 3`; a move into a wall leaves the agent in
place.

Entering the goal cell pays 1 and terminates the episode; every other transition pays 0;
episodes are truncated after 500 steps. At reset the start is drawn uniformly from the free
cells other than the goal (or fixed at `start` if `random_start` is False); the goal is
`goal` unless `random_goal`, in which case it is drawn uniformly from the free cells too.
The observation is `[agent_row, agent_col, goal_row, goal_col]` (float32).

No reference package implements it; `tests/environments/test_misc.py` checks the layout, the slip
distribution and the shortest-path episode length with `fail_prob = 0`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import bounded, flag, params_dataclass, params_name
from ..environment import Environment
from .common import free_cells, uniform_cell, wall_step

LAYOUT = (
    "#############",
    "#     #     #",
    "#     #     #",
    "#           #",
    "#     #     #",
    "#     #     #",
    "## ####     #",
    "#     ### ###",
    "#     #     #",
    "#     #     #",
    "#           #",
    "#     #     #",
    "#############",
)
WALLS = np.array([[c == "#" for c in row] for row in LAYOUT])


@struct.dataclass
class EnvState:
    pos: jax.Array  # (2,) int32 row, col
    goal: jax.Array  # (2,) int32 row, col
    time: jax.Array


@params_dataclass
class EnvParams:
    fail_prob: float = bounded(1.0 / 3.0, 0.0, 1.0)
    random_start: bool = flag(True)
    random_goal: bool = flag(False)
    start: tuple[int, int] = bounded((1, 1), 1, 11)  # used when random_start is False
    goal: tuple[int, int] = bounded((11, 11), 1, 11)  # used when random_goal is False
    max_steps_in_episode: int = bounded(500, 1)

    def check_values(self):
        for name in ("start", "goal"):
            row, col = (np.asarray(v, int) for v in getattr(self, name))
            if np.any(WALLS[row, col]):
                raise ValueError(f"{params_name(self)}: {name}={getattr(self, name)} is a wall")


class FourRooms(Environment):
    """Four actions (0 left, 1 down, 2 right, 3 up) in the fixed four-room layout."""

    env_id = "FourRooms-misc"
    def __init__(self):
        self.walls = WALLS  # (13, 13) bool numpy array: the layout
        self._walls = jnp.asarray(WALLS)
        self._cells = jnp.asarray(free_cells(WALLS))  # (104, 2)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        key_goal, key_start = jax.random.split(key)
        no_cell = jnp.array([-1, -1], jnp.int32)
        goal = uniform_cell(key_goal, self._cells, no_cell)
        goal = jnp.where(params.random_goal, goal, jnp.asarray(params.goal))
        pos = uniform_cell(key_start, self._cells, goal)
        pos = jnp.where(params.random_start, pos, jnp.asarray(params.start))
        return EnvState(pos=pos.astype(jnp.int32), goal=goal.astype(jnp.int32), time=jnp.int32(0))

    def transition(self, key, state, action, params):
        key_fail, key_other = jax.random.split(key)
        fail = jax.random.uniform(key_fail) < params.fail_prob
        other = (action + jax.random.randint(key_other, (), 1, 4)) % 4
        pos, _ = wall_step(self._walls, state.pos, jnp.where(fail, other, action))
        at_goal = jnp.all(pos == state.goal)
        return state.replace(pos=pos), at_goal.astype(jnp.float32), at_goal

    def get_obs(self, state, params=None, key=None):
        return jnp.concatenate([state.pos, state.goal]).astype(jnp.float32)

    def observation_space(self, params=None):
        return spaces.Box(0, WALLS.shape[0] - 1, (4,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(4)
