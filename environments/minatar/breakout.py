"""Breakout-MinAtar: bounce a ball off a paddle to break three rows of bricks.

Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments". Rules follow `minatar/environments/breakout.py`
(MinAtar 1.0.15), which `tests/environments/test_minatar_breakout.py` steps side by side:

- the paddle moves one column per `l`/`r` step on row 9; the ball moves one cell
  diagonally per step (direction 0 up-left, 1 up-right, 2 down-right, 3 down-left);
- a side wall reflects it horizontally (the ball stays in the edge column that step), the
  top row reflects it vertically; a brick is removed for +1, the ball stays on its row and
  reflects vertically; right after a strike (`strike`) the ball passes through the next
  brick cell it meets without breaking it, as in the reference;
- on reaching row 9: if no brick is left, rows 1-3 are refilled; a ball coming from the
  paddle's column reflects vertically, one landing on the paddle (from the neighbouring
  column) reverses both directions, and otherwise the episode terminates;
- the episode starts with the ball on row 3 at column 0 heading down-right or at column
  9 heading down-left, with probability 1/2 each.

Kept divergences: after termination the reference keeps returning `(0, terminal)` with a
frozen state, and so does `step_env` here; `reset` also resets `last_action` to 0 (no-op),
which minatar's `Environment.reset()` does not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..checks import params_dataclass
from .common import MinAtarEnv, MinAtarParams, MinAtarState

__all__ = ["Breakout", "EnvParams", "EnvState"]

_CHANNELS = np.arange(4, dtype=np.int32)  # paddle, ball, trail, brick
_FLAT_INDEX = np.arange(400, dtype=np.int32).reshape(10, 10, 4)
_BRICK_ROWS = np.isin(np.arange(10), (1, 2, 3))  # rows holding bricks at the start


@struct.dataclass
class EnvState(MinAtarState):
    ball_x: jax.Array  # int32 column
    ball_y: jax.Array  # int32 row
    ball_dir: jax.Array  # int32: 0 up-left, 1 up-right, 2 down-right, 3 down-left
    pos: jax.Array  # int32 paddle column (row 9)
    last_x: jax.Array  # int32: the ball's previous cell (the trail channel)
    last_y: jax.Array
    brick_map: jax.Array  # (10, 10) bool
    strike: jax.Array  # bool: a brick was hit on the previous step


@params_dataclass
class EnvParams(MinAtarParams):
    """Breakout adds no parameters to the shared ones."""


class Breakout(MinAtarEnv):
    """Breakout on a 10x10 grid; minimal actions `n`, `l`, `r`."""

    env_id = "Breakout-MinAtar"
    CHANNELS = ("paddle", "ball", "trail", "brick")
    MINIMAL_ACTIONS = ("n", "l", "r")

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        from_right = jax.random.uniform(key) < 0.5
        ball_x = jnp.where(from_right, 9, 0).astype(jnp.int32)
        return EnvState(
            ball_x=ball_x,
            ball_y=jnp.int32(3),
            ball_dir=jnp.where(from_right, 3, 2).astype(jnp.int32),
            pos=jnp.int32(4),
            last_x=ball_x,
            last_y=jnp.int32(3),
            brick_map=jnp.broadcast_to(_BRICK_ROWS[:, None], (10, 10)),
            strike=jnp.bool_(False),
            terminal=jnp.bool_(False),
            last_action=jnp.int32(0),
            time=jnp.int32(0),
        )

    def apply(self, state, full_action, draws, params):
        # A terminated game stays frozen, as the reference's `act` returns early.
        live = ~state.terminal
        pos = jnp.clip(state.pos - (full_action == 1) + (full_action == 3), 0, 9)
        d = state.ball_dir
        new_x = state.ball_x + jnp.where((d == 1) | (d == 2), 1, -1)
        new_y = state.ball_y + jnp.where(d >= 2, 1, -1)

        side = (new_x < 0) | (new_x > 9)
        new_x = jnp.clip(new_x, 0, 9)
        d = jnp.where(side, d ^ 1, d)  # horizontal reflection: 0<->1, 2<->3

        top = new_y < 0
        cell_y = jnp.maximum(new_y, 0)  # the cell is only read below the top
        in_cell = state.brick_map[cell_y, new_x]
        brick = ~top & in_cell
        breaks = brick & ~state.strike & live
        bottom = ~top & ~brick & (new_y == 9)
        from_above = bottom & (state.ball_x == pos)
        on_paddle = bottom & ~from_above & (new_x == pos)
        terminal = bottom & ~from_above & ~on_paddle

        d = jnp.where(top | breaks | from_above, 3 - d, d)  # vertical reflection
        d = jnp.where(on_paddle, d ^ 2, d)  # both reversed
        new_y = jnp.where(top, 0, new_y)
        new_y = jnp.where(breaks | from_above | on_paddle, state.ball_y, new_y)

        bricks = state.brick_map.at[cell_y, new_x].set(in_cell & ~breaks)
        refill = bottom & live & ~jnp.any(bricks)
        bricks = bricks | (refill & _BRICK_ROWS[:, None])

        next_state = state.replace(
            ball_x=new_x,
            ball_y=new_y,
            ball_dir=d,
            pos=pos,
            last_x=state.ball_x,
            last_y=state.ball_y,
            strike=brick,
            terminal=terminal,
        )
        # The bricks are frozen by `live` above, cheaper than selecting the whole map.
        next_state = jax.tree.map(lambda old, new: jnp.where(live, new, old), state, next_state)
        next_state = next_state.replace(brick_map=bricks)
        return next_state, jnp.where(breaks, 1.0, 0.0), next_state.terminal

    def get_obs(self, state, params=None, key=None):
        # Flat (row, column, channel) indices of the three one-cell channels: an `any` over a
        # tiny axis runs faster under vmap than or-ing three cell masks (experiments/README.md,
        # "MinAtar observations").
        cells = jnp.stack([
            (9 * 10 + state.pos) * 4,
            (state.ball_y * 10 + state.ball_x) * 4 + 1,
            (state.last_y * 10 + state.last_x) * 4 + 2,
        ])
        one_cell = jnp.any(_FLAT_INDEX[..., None] == cells, axis=-1)
        return one_cell | (state.brick_map[:, :, None] & (_CHANNELS == 3))
