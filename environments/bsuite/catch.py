"""Catch-bsuite: move a paddle along the bottom row to catch a ball falling straight down.

Osband et al. (2020), "Behaviour Suite for Reinforcement Learning", ICLR. Reference
implementation: `bsuite.environments.catch.Catch` (bsuite 0.3.x), which
`tests/environments/test_bsuite.py` steps side by side.

The observation is the (rows, columns) float32 board with 1 at the ball and at the paddle.
The ball starts in row 0 of a uniformly drawn column, the paddle in the middle of the bottom
row. Actions 0/1/2 move the paddle left/stay/right (clipped at the walls), then the ball drops
one row. When the ball reaches the paddle's row the episode terminates with reward +1 (caught)
or -1 (missed); every other step gives 0. Episodes last exactly `rows - 1` steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .. import spaces
from ..checks import bounded, check_int, params_dataclass
from ..environment import Environment
from .common import one_hot_board


@struct.dataclass
class EnvState:
    ball_x: jax.Array
    ball_y: jax.Array
    paddle_x: jax.Array
    time: jax.Array


@params_dataclass
class EnvParams:
    max_steps_in_episode: int = bounded(9, 1)  # rows - 1: the natural episode length


class Catch(Environment):
    """Three actions: 0 moves the paddle left, 1 keeps it, 2 moves it right."""

    env_id = "Catch-bsuite"
    stochastic = False  # only the reset draws (the ball's column)

    def __init__(self, rows: int = 10, columns: int = 5):
        # rows >= 2: with one row the ball would start on the paddle's row and never land.
        self.rows = check_int("Catch-bsuite", "rows", rows, 2)
        self.columns = check_int("Catch-bsuite", "columns", columns, 1)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(max_steps_in_episode=self.rows - 1)

    def reset_state(self, key, params):
        ball_x = jax.random.randint(key, (), 0, self.columns, dtype=jnp.int32)
        return EnvState(
            ball_x=ball_x,
            ball_y=jnp.int32(0),
            paddle_x=jnp.int32(self.columns // 2),
            time=jnp.int32(0),
        )

    def transition(self, key, state, action, params):
        paddle_x = jnp.clip(state.paddle_x + action - 1, 0, self.columns - 1)
        ball_y = state.ball_y + 1
        terminated = ball_y == self.rows - 1
        reward = jnp.where(terminated, jnp.where(paddle_x == state.ball_x, 1.0, -1.0), 0.0)
        return state.replace(paddle_x=paddle_x, ball_y=ball_y), reward, terminated

    def get_obs(self, state, params=None, key=None):
        shape = (self.rows, self.columns)
        ball = one_hot_board(shape, state.ball_y, state.ball_x)
        paddle = one_hot_board(shape, self.rows - 1, state.paddle_x)
        return jnp.maximum(ball, paddle)

    def observation_space(self, params=None):
        return spaces.Box(0.0, 1.0, (self.rows, self.columns), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(3)
