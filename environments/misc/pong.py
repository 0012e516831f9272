"""Pong-misc: two-paddle Pong against a scripted opponent on a small grid.

The classic Pong game (Atari, 1972; the Atari 2600 version is the Arcade Learning
Environment's Pong, Bellemare et al. 2013) reduced to a `height` x `width` grid of cells.
The agent's paddle occupies column 0, the opponent's column `width - 1`; each paddle is
`paddle_len` cells tall and moves one cell per step, clipped to the grid. The ball moves
one cell per step in each axis (velocity `(vy, vx)` in {-1, +1}^2). One step:

1. the agent's paddle moves (action 0 stay, 1 up, 2 down);
2. the opponent's paddle moves one cell towards the ball's row (its centre row
   `top + paddle_len // 2` tracks the ball's row) with probability `opponent_skill`
   (0.8), and otherwise stays;
3. the ball moves vertically, bouncing off the top and bottom edges
   (`y' = y + vy`; if `y'` leaves `[0, height - 1]`, `vy <- -vy` and `y' = y + vy`);
4. the ball moves horizontally: `x' = x + vx`. If `x'` is a paddle column and that paddle
   covers row `y'`, the ball bounces (`vx <- -vx`, `x' = x + vx`) and its vertical
   velocity follows the part of the paddle it hit: `vy <- -1` on the upper half,
   `+1` on the lower half, unchanged at the centre of an odd-length paddle. Otherwise the
   paddle's owner concedes a point: reward +1 if the opponent missed, -1 if the agent
   missed, and the ball is served again from the centre column, a uniformly drawn row and
   a uniformly drawn diagonal direction.

The game ends (terminated) when either player reaches `points_to_win` (21, as Atari Pong)
and is truncated after `max_steps_in_episode` (5000) steps. Rows grow downwards. The
observation is `[agent_top, opponent_top, ball_y, ball_x, ball_vy, ball_vx]` (float32).

No reference package implements it; `tests/environments/test_misc.py` checks these rules state by state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .. import spaces
from ..checks import bounded, check_int, params_dataclass
from ..environment import Environment


@struct.dataclass
class EnvState:
    agent_top: jax.Array  # int32 row of the agent paddle's top cell
    opponent_top: jax.Array  # int32
    ball: jax.Array  # (2,) int32 row, column
    velocity: jax.Array  # (2,) int32 vy, vx in {-1, +1}
    agent_score: jax.Array  # int32
    opponent_score: jax.Array  # int32
    time: jax.Array


@params_dataclass
class EnvParams:
    opponent_skill: float = bounded(0.8, 0.0, 1.0)
    points_to_win: int = bounded(21, 1)
    max_steps_in_episode: int = bounded(5000, 1)


class Pong(Environment):
    """Three actions: 0 stay, 1 up, 2 down. Grid and paddle sizes are constructor arguments."""

    env_id = "Pong-misc"
    def __init__(self, height: int = 10, width: int = 16, paddle_len: int = 3):
        self.height = check_int("Pong", "height", height, 2)
        self.width = check_int("Pong", "width", width, 4)
        self.paddle_len = check_int("Pong", "paddle_len", paddle_len, 1)
        if self.paddle_len > self.height:
            raise ValueError(f"Pong: paddle_len ({paddle_len}) must not exceed height ({height})")

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def _serve(self, key):
        key_row, key_dir = jax.random.split(key)
        row = jax.random.randint(key_row, (), 0, self.height)
        velocity = 2 * jax.random.bernoulli(key_dir, 0.5, (2,)).astype(jnp.int32) - 1
        return jnp.stack([row, self.width // 2]).astype(jnp.int32), velocity

    def reset_state(self, key, params):
        ball, velocity = self._serve(key)
        top = jnp.int32((self.height - self.paddle_len) // 2)
        zero = jnp.int32(0)
        return EnvState(top, top, ball, velocity, zero, zero, zero)

    def _move_paddle(self, top, delta):
        return jnp.clip(top + delta, 0, self.height - self.paddle_len).astype(jnp.int32)

    def transition(self, key, state, action, params):
        key_opp, key_serve = jax.random.split(key)
        agent_top = self._move_paddle(state.agent_top, jnp.array([0, -1, 1])[action])
        (y, x), (vy, vx) = state.ball, state.velocity
        track = jnp.sign(y - (state.opponent_top + self.paddle_len // 2))
        moves = jax.random.uniform(key_opp) < params.opponent_skill
        opponent_top = self._move_paddle(state.opponent_top, jnp.where(moves, track, 0))

        vy = jnp.where((y + vy < 0) | (y + vy > self.height - 1), -vy, vy)
        y = y + vy
        x_next = x + vx
        at_agent, at_opponent = x_next == 0, x_next == self.width - 1
        top = jnp.where(at_agent, agent_top, opponent_top)
        offset = y - top
        covered = (offset >= 0) & (offset < self.paddle_len)
        hit = (at_agent | at_opponent) & covered
        missed = (at_agent | at_opponent) & ~covered
        half = (self.paddle_len - 1) / 2
        vy = jnp.where(hit, jnp.where(offset < half, -1, jnp.where(offset > half, 1, vy)), vy)
        vx = jnp.where(hit, -vx, vx)
        ball, velocity = jnp.stack([y, x + vx]), jnp.stack([vy, vx])

        served_ball, served_velocity = self._serve(key_serve)
        ball = jnp.where(missed, served_ball, ball).astype(jnp.int32)
        velocity = jnp.where(missed, served_velocity, velocity).astype(jnp.int32)
        reward = jnp.where(missed, jnp.where(at_opponent, 1.0, -1.0), 0.0)
        agent_score = state.agent_score + (missed & at_opponent)
        opponent_score = state.opponent_score + (missed & at_agent)
        next_state = state.replace(
            agent_top=agent_top,
            opponent_top=opponent_top,
            ball=ball,
            velocity=velocity,
            agent_score=agent_score,
            opponent_score=opponent_score,
        )
        done = (agent_score >= params.points_to_win) | (opponent_score >= params.points_to_win)
        return next_state, reward, done

    def get_obs(self, state, params=None, key=None):
        return jnp.concatenate(
            [jnp.stack([state.agent_top, state.opponent_top]), state.ball, state.velocity]
        ).astype(jnp.float32)

    def observation_space(self, params=None):
        top = self.height - self.paddle_len
        low = jnp.array([0, 0, 0, 1, -1, -1])
        high = jnp.array([top, top, self.height - 1, self.width - 2, 1, 1])
        return spaces.Box(low, high, (6,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(3)
