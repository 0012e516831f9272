"""Asterix-MinAtar: pick up gold and dodge the enemies that cross the screen.

Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments". Rules follow `minatar/environments/asterix.py`
(MinAtar 1.0.15), which `tests/environments/test_minatar_asterix.py` steps side by side. One step:

1. when the spawn timer is 0, an entity appears in a free row (slot `i` is row `i + 1`,
   chosen uniformly among the free slots; nothing appears when all 8 are taken) at the
   left edge heading right with probability `spawn_left_prob` (else at the right edge
   heading left), gold with probability `gold_prob` (else an enemy); the timer restarts
   at `spawn_speed`;
2. the player moves one cell (`l`, `r`; `u`, `d` within rows 1..8);
3. an entity on the player's cell is collected (gold, +1) or ends the episode (enemy);
4. when the move timer is 0, every entity moves one column (leaving the screen frees
   its slot) and step 3 is checked again; the timer restarts at `move_speed`;
5. both timers count down; with `difficulty_ramping`, every `ramp_interval + 2` steps
   `spawn_speed` drops by 1 and, every other time, `move_speed` too (both down to 1).

The reference's numpy draws map onto `draw`'s uniforms: `rand() < 1/2` (side),
`rand() < 1/3` (gold) and `randint(n_free)` (the slot, `floor(u * n_free)` here).

Kept divergences: the reference's unused `shot_timer` is not stored; after termination
the reference keeps returning `(0, terminal)` with a frozen state, and so does `step_env`
here; `reset` also resets `last_action` to 0 (no-op), which minatar's
`Environment.reset()` does not.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..checks import bounded, flag, params_dataclass
from .common import OBS_COLS, OBS_ROWS, MinAtarEnv, MinAtarParams, MinAtarState, lane_rows

__all__ = ["Asterix", "EnvParams", "EnvState", "SpawnDraws"]

_NUM_SLOTS = 8
_SLOT_ROWS = np.arange(1, _NUM_SLOTS + 1, dtype=np.int32)  # slot i lives on row i + 1
_CHANNELS = np.arange(4, dtype=np.int32)  # player, enemy, trail, gold


@struct.dataclass
class EnvState(MinAtarState):
    player_x: jax.Array  # int32 column
    player_y: jax.Array  # int32 row (1..8)
    entity_x: jax.Array  # (8,) int32 column of the entity in slot i (row i + 1)
    entity_right: jax.Array  # (8,) bool: heading right (spawned at the left edge)
    entity_gold: jax.Array  # (8,) bool: gold, else enemy
    entity_active: jax.Array  # (8,) bool: slot occupied
    spawn_speed: jax.Array  # int32
    spawn_timer: jax.Array  # int32
    move_speed: jax.Array  # int32
    move_timer: jax.Array  # int32
    ramp_timer: jax.Array  # int32
    ramp_index: jax.Array  # int32


@params_dataclass
class EnvParams(MinAtarParams):
    difficulty_ramping: bool = flag(True)
    ramp_interval: int = bounded(100, 0)
    # The spawn and move timers restart at these and count down to 0 (unfloored): >= 1.
    init_spawn_speed: int = bounded(10, 1)
    init_move_interval: int = bounded(5, 1)
    spawn_left_prob: float = bounded(0.5, 0.0, 1.0)
    gold_prob: float = bounded(1.0 / 3.0, 0.0, 1.0)


class SpawnDraws(NamedTuple):
    """The uniforms one step may use; only read when an entity spawns."""

    left_u: jax.Array  # < spawn_left_prob: spawn at the left edge, heading right
    gold_u: jax.Array  # < gold_prob: gold
    slot_u: jax.Array  # floor(slot_u * n_free) picks the free slot


class Asterix(MinAtarEnv):
    """Asterix on a 10x10 grid; minimal actions `n`, `l`, `u`, `r`, `d`."""

    env_id = "Asterix-MinAtar"
    CHANNELS = ("player", "enemy", "trail", "gold")
    MINIMAL_ACTIONS = ("n", "l", "u", "r", "d")

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        off = jnp.zeros(_NUM_SLOTS, jnp.bool_)
        spawn_speed = jnp.asarray(params.init_spawn_speed, jnp.int32)
        move_speed = jnp.asarray(params.init_move_interval, jnp.int32)
        return EnvState(
            player_x=jnp.int32(5),
            player_y=jnp.int32(5),
            entity_x=jnp.zeros(_NUM_SLOTS, jnp.int32),
            entity_right=off,
            entity_gold=off,
            entity_active=off,
            spawn_speed=spawn_speed,
            spawn_timer=spawn_speed,
            move_speed=move_speed,
            move_timer=move_speed,
            ramp_timer=jnp.asarray(params.ramp_interval, jnp.int32),
            ramp_index=jnp.int32(0),
            terminal=jnp.bool_(False),
            last_action=jnp.int32(0),
            time=jnp.int32(0),
        )

    def draw(self, key, state, params):
        return SpawnDraws(*jax.random.uniform(key, (3,)))

    def apply(self, state, full_action, draws, params):
        a = full_action
        # 1. Spawn into the k-th free slot.
        free = ~state.entity_active
        n_free = jnp.sum(free, dtype=jnp.int32)
        k = jnp.minimum(jnp.floor(draws.slot_u * n_free).astype(jnp.int32), n_free - 1)
        spawn_now = state.spawn_timer == 0
        new = spawn_now & free & (jnp.cumsum(free) - 1 == k)
        right = draws.left_u < params.spawn_left_prob
        x = jnp.where(new, jnp.where(right, 0, 9), state.entity_x)
        heading_right = jnp.where(new, right, state.entity_right)
        gold = jnp.where(new, draws.gold_u < params.gold_prob, state.entity_gold)
        active = state.entity_active | new
        spawn_timer = jnp.where(spawn_now, state.spawn_speed, state.spawn_timer)

        # 2. Move the player.
        px = jnp.clip(state.player_x - (a == 1) + (a == 3), 0, 9)
        py = jnp.clip(state.player_y - (a == 2) + (a == 4), 1, 8)
        on_player_row = _SLOT_ROWS == py

        # 3. Collisions; 4. entities move, then collisions again.
        hit = active & on_player_row & (x == px)
        reward = jnp.sum(hit & gold, dtype=jnp.int32)
        terminal = jnp.any(hit & ~gold)
        active = active & ~(hit & gold)
        move_now = state.move_timer == 0
        x = jnp.where(move_now & active, x + jnp.where(heading_right, 1, -1), x)
        active = active & (x >= 0) & (x <= 9)
        hit = move_now & active & on_player_row & (x == px)
        reward = reward + jnp.sum(hit & gold, dtype=jnp.int32)
        terminal = terminal | jnp.any(hit & ~gold)
        active = active & ~(hit & gold)
        move_timer = jnp.where(move_now, state.move_speed, state.move_timer)

        # 5. Timers and the difficulty ramp.
        ramping = params.difficulty_ramping & ((state.spawn_speed > 1) | (state.move_speed > 1))
        ramp_up = ramping & (state.ramp_timer < 0)
        faster_moves = ramp_up & (state.move_speed > 1) & (state.ramp_index % 2 == 1)
        faster_spawns = ramp_up & (state.spawn_speed > 1)
        ramp_timer = jnp.where(
            ramp_up, params.ramp_interval, state.ramp_timer - ramping.astype(jnp.int32)
        )

        next_state = state.replace(
            player_x=px,
            player_y=py,
            entity_x=x,
            entity_right=heading_right,
            entity_gold=gold,
            entity_active=active,
            spawn_speed=state.spawn_speed - faster_spawns,
            spawn_timer=spawn_timer - 1,
            move_speed=state.move_speed - faster_moves,
            move_timer=move_timer - 1,
            ramp_timer=ramp_timer.astype(jnp.int32),
            ramp_index=state.ramp_index + ramp_up,
            terminal=terminal,
        )
        # A terminated game stays frozen, as the reference's `act` returns early.
        next_state = jax.tree.map(
            lambda old, new: jnp.where(state.terminal, old, new), state, next_state
        )
        reward = jnp.where(state.terminal, 0, reward).astype(jnp.float32)
        return next_state, reward, next_state.terminal

    def get_obs(self, state, params=None, key=None):
        shown = state.entity_active
        x = lane_rows(jnp.where(shown, state.entity_x, -1), -1)
        behind = state.entity_x + jnp.where(state.entity_right, -1, 1)
        trail = lane_rows(jnp.where(shown, behind, -1), -1)
        channel = lane_rows(jnp.where(state.entity_gold, 3, 1), 1)
        return (
            ((OBS_ROWS == state.player_y) & (OBS_COLS == state.player_x) & (_CHANNELS == 0))
            | ((OBS_COLS == x) & (_CHANNELS == channel))
            | ((OBS_COLS == trail) & (_CHANNELS == 2))
        )
