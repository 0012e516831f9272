"""SpaceInvaders-MinAtar: shoot down a descending wave of aliens from a cannon.

Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments". Rules follow `minatar/environments/space_invaders.py`
(MinAtar 1.0.15), which `tests/environments/test_minatar_space_invaders.py` steps side by side. One step:

1. `f` with a cold gun puts a bullet on the cannon's cell (row 9) and restarts the gun's
   cool-down; otherwise `l`/`r` move the cannon one column;
2. friendly bullets move up one row (leaving at the top), enemy bullets down one row
   (leaving at the bottom); an enemy bullet or an alien on the cannon's cell ends the
   episode;
3. when the alien move timer is 0 it restarts at `min(#aliens, enemy_move_interval)`
   (so a thinned wave speeds up), and the aliens move one column in their direction or,
   when one of them is on the edge column it heads to, they reverse and move one row down
   (with aliens on row 9 this ends the episode; the reference's `np.roll` wraps that row
   to row 0, and so does this code);
4. when the alien shot timer is 0 it restarts at `enemy_shot_interval` and the alien
   nearest the cannon fires (the nearest non-empty column, the left one on a tie; its
   lowest alien): an enemy bullet appears on that alien's cell;
5. an alien sharing a cell with a friendly bullet dies with it (+1 each);
6. timers count down; when no alien is left a new wave fills rows 0-3, columns 2-7, and
   with `difficulty_ramping` the move interval drops by one (not below
   `min_enemy_move_interval`). The aliens keep their direction and move timer.

The game draws no random numbers; only sticky actions (common.py) use the key.

Kept divergences: after termination the reference keeps returning `(0, terminal)` with a
frozen state, and so does `step_env` here; `reset` also resets `last_action` to 0 (no-op),
which minatar's `Environment.reset()` does not. Out-of-range actions: see common.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..checks import bounded, flag, params_dataclass
from .common import MinAtarEnv, MinAtarParams, MinAtarState, grid_mask

__all__ = ["EnvParams", "EnvState", "SpaceInvaders"]

_COLS = np.arange(10, dtype=np.int32)
_ROWS = np.arange(10, dtype=np.int32)
_WAVE = (_ROWS[:, None] < 4) & (_COLS[None, :] >= 2) & (_COLS[None, :] < 8)  # a fresh wave


@struct.dataclass
class EnvState(MinAtarState):
    pos: jax.Array  # int32 cannon column (row 9)
    alien_map: jax.Array  # (10, 10) bool
    f_bullet_map: jax.Array  # (10, 10) bool: friendly bullets
    e_bullet_map: jax.Array  # (10, 10) bool: enemy bullets
    alien_dir: jax.Array  # int32: -1 left, +1 right
    enemy_move_interval: jax.Array  # int32, shrinks with each cleared wave (ramping)
    alien_move_timer: jax.Array  # int32
    alien_shot_timer: jax.Array  # int32
    ramp_index: jax.Array  # int32
    shot_timer: jax.Array  # int32: the cannon's cool-down


@params_dataclass
class EnvParams(MinAtarParams):
    difficulty_ramping: bool = flag(True)
    shot_cool_down: int = bounded(5, 0)  # the gun's timer stays at 0 until it fires
    # The aliens' timers restart at these and count down to 0 (unfloored): >= 1.
    enemy_move_interval: int = bounded(12, 1)  # of the first wave
    min_enemy_move_interval: int = bounded(6, 1)  # the ramp stops here
    enemy_shot_interval: int = bounded(10, 1)


class SpaceInvaders(MinAtarEnv):
    """SpaceInvaders on a 10x10 grid; minimal actions `n`, `l`, `r`, `f`."""

    env_id = "SpaceInvaders-MinAtar"
    CHANNELS = ("cannon", "alien", "alien_left", "alien_right", "friendly_bullet", "enemy_bullet")
    MINIMAL_ACTIONS = ("n", "l", "r", "f")

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        empty = jnp.zeros((10, 10), jnp.bool_)
        interval = jnp.asarray(params.enemy_move_interval, jnp.int32)
        return EnvState(
            pos=jnp.int32(5),
            alien_map=jnp.asarray(_WAVE),
            f_bullet_map=empty,
            e_bullet_map=empty,
            alien_dir=jnp.int32(-1),
            enemy_move_interval=interval,
            alien_move_timer=interval,
            alien_shot_timer=jnp.asarray(params.enemy_shot_interval, jnp.int32),
            ramp_index=jnp.int32(0),
            shot_timer=jnp.int32(0),
            terminal=jnp.bool_(False),
            last_action=jnp.int32(0),
            time=jnp.int32(0),
        )

    def apply(self, state, full_action, draws, params):
        fire = (full_action == 5) & (state.shot_timer == 0)
        pos = jnp.clip(state.pos - (full_action == 1) + (full_action == 3), 0, 9)
        cannon = _COLS == pos  # (10,) the cannon's column
        f_map = state.f_bullet_map | (fire & grid_mask(9, pos))
        shot_timer = jnp.where(fire, params.shot_cool_down, state.shot_timer)

        # Bullets: friendly ones up, enemy ones down; both leave the grid at its edge.
        f_map = jnp.concatenate([f_map[1:], jnp.zeros((1, 10), jnp.bool_)])
        e_map = jnp.concatenate([jnp.zeros((1, 10), jnp.bool_), state.e_bullet_map[:-1]])
        aliens = state.alien_map
        terminal = jnp.any((e_map[9] | aliens[9]) & cannon)

        # Aliens move (sideways, or down on reaching the edge they head to).
        move = state.alien_move_timer == 0
        move_timer = jnp.where(
            move, jnp.minimum(jnp.sum(aliens), state.enemy_move_interval), state.alien_move_timer
        )
        left = state.alien_dir < 0
        reverse = move & jnp.where(left, jnp.any(aliens[:, 0]), jnp.any(aliens[:, 9]))
        terminal |= reverse & jnp.any(aliens[9])
        sideways = jnp.where(left, jnp.roll(aliens, -1, axis=1), jnp.roll(aliens, 1, axis=1))
        aliens = jnp.where(reverse, jnp.roll(aliens, 1, axis=0), jnp.where(move, sideways, aliens))
        alien_dir = jnp.where(reverse, -state.alien_dir, state.alien_dir)
        terminal |= jnp.any(aliens[9] & cannon)

        # The alien nearest the cannon (left column first on a tie, lowest alien) shoots.
        shoot = state.alien_shot_timer == 0
        occupied = jnp.any(aliens, axis=0)
        order = 2 * jnp.abs(_COLS - pos) + (_COLS > pos)
        col = jnp.argmin(jnp.where(occupied, order, 100))
        lowest = 9 - jnp.argmax(aliens[::-1, col])
        e_map = e_map | (shoot & grid_mask(lowest, col))
        alien_shot_timer = jnp.where(shoot, params.enemy_shot_interval, state.alien_shot_timer)

        kills = aliens & f_map
        reward = jnp.sum(kills).astype(jnp.float32)
        aliens, f_map = aliens & ~kills, f_map & ~kills

        # New wave (faster with ramping) once the last alien is gone.
        cleared = ~jnp.any(aliens)
        ramp = cleared & params.difficulty_ramping & (
            state.enemy_move_interval > params.min_enemy_move_interval
        )
        next_state = state.replace(
            pos=pos,
            alien_map=aliens | (cleared & _WAVE),
            f_bullet_map=f_map,
            e_bullet_map=e_map,
            alien_dir=alien_dir,
            enemy_move_interval=state.enemy_move_interval - ramp,
            alien_move_timer=move_timer - 1,
            alien_shot_timer=alien_shot_timer - 1,
            ramp_index=state.ramp_index + ramp,
            shot_timer=shot_timer - (shot_timer > 0),
            terminal=terminal,
        )
        # A terminated game stays frozen, as the reference's `act` returns early.
        next_state = jax.tree.map(
            lambda old, new: jnp.where(state.terminal, old, new), state, next_state
        )
        reward = jnp.where(state.terminal, 0.0, reward)
        return next_state, reward, next_state.terminal

    def get_obs(self, state, params=None, key=None):
        aliens = state.alien_map
        left = state.alien_dir < 0
        return jnp.stack(
            [
                grid_mask(9, state.pos),
                aliens,
                aliens & left,
                aliens & ~left,
                state.f_bullet_map,
                state.e_bullet_map,
            ],
            axis=-1,
        )
