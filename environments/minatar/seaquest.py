"""Seaquest-MinAtar: a submarine shoots fish and enemy subs, rescues divers, and surfaces.

Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments". Rules follow `minatar/environments/seaquest.py`
(MinAtar 1.0.15), which `tests/environments/test_minatar_seaquest.py` steps side by side. One step:

1. when the enemy spawn timer is 0 it restarts at `e_spawn_speed` and an enemy (a sub with
   probability `sub_prob`, else a fish) appears on a uniform row 1..8, at the left edge
   heading right with probability `spawn_left_prob` (else at the right edge heading left),
   unless an enemy on that row heads the other way; likewise every `diver_spawn_speed`
   steps a diver appears (no such check);
2. the player fires (`f`, gun cold; the bullet starts on the sub's cell, heading where the
   sub faces) or moves one cell (`l`/`r` also turn it; rows 0..8);
3. friendly bullets move one cell, newest first; one landing on an enemy kills it (+1; the
   oldest fish on that cell, else the oldest sub);
4. divers, newest first: one on the sub's cell, or moving onto it (every
   `diver_move_interval + 1` steps), is picked up while fewer than `max_divers` are aboard;
5. subs, then enemy bullets, then fish (newest first): an enemy or enemy bullet on the
   player's cell before or after its move ends the episode; enemies move every
   `move_speed + 1` steps and one moving onto a friendly bullet dies with it (+1; the oldest
   bullet on the cell); a sub whose shot timer is 0 fires where it now is (even when it
   just died), its bullet moving one cell per step from this step on;
6. the gun and spawn timers count down; with oxygen <= 0 the episode ends; below the surface
   the oxygen drops by 1; arriving at the surface (row 0) with no diver ends the episode,
   otherwise the oxygen refills and one diver leaves, or with `max_divers` aboard all leave
   for a bonus of `oxygen * 10 // max_oxygen` (the reference then also subtracts the one
   diver, leaving the count at -1, so that surfacing again without a diver refills too:
   kept); with `difficulty_ramping` each surfacing lowers `e_spawn_speed` (down to
   `min_spawn_speed`) and, every other time, `move_speed` (down to `min_move_interval`).

Layout: the reference's lists are fixed-size arrays with an `active` mask, kept in spawn
order with the newest at index 0 (a spawn shifts every slot by one and drops the last),
so "the oldest" is the highest active index. The capacities hold for the reference
constants: 32 enemies (an enemy lives `10 * m + 9` steps at move interval `m`; with the
ramp at most 30 are alive, once one spawns every step at `m = 2`), 2 friendly bullets (one
every 5 steps, gone within 9), 2 divers (one every 30 steps, gone within 59). Enemy bullet
`i` is the last bullet fired by enemy `i` (a sub fires every `enemy_shot_interval + 1` =
11 steps and its bullet is gone within 10), so it shares that enemy's row and direction.
With constants that keep more objects alive (e.g. a much faster spawn or fire rate) the
oldest ones would be dropped silently.

The reference's numpy draws map onto `draw`'s: `rand() < 1/2` (edge), `rand() < 1/3` (sub)
and `randint(1, 9)` (row) for an enemy, then `rand() < 1/2`, `randint(1, 9)` for a diver.

Kept divergences: after termination the reference keeps returning `(0, terminal)` with a
frozen state, and so does `step_env` here; `reset` also resets `last_action` to 0 (no-op),
which minatar's `Environment.reset()` does not. The reference's unused `ramp_interval`
constant is not a parameter. Out-of-range actions: see common.py.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..checks import bounded, flag, params_dataclass
from .common import MinAtarEnv, MinAtarParams, MinAtarState, grid_mask

__all__ = ["EnvParams", "EnvState", "Seaquest", "SpawnDraws"]

MAX_ENEMIES = 32
MAX_BULLETS = 2
MAX_DIVERS = 2

_COLS = np.arange(10, dtype=np.int32)
_ENEMY_IDX = np.arange(MAX_ENEMIES, dtype=np.int32)


@struct.dataclass
class EnvState(MinAtarState):
    sub_x: jax.Array  # int32 column of the player's sub (its front)
    sub_y: jax.Array  # int32 row, 0 (surface) .. 8
    sub_right: jax.Array  # bool: facing right
    oxygen: jax.Array  # int32
    diver_count: jax.Array  # int32 divers aboard (-1 and below after a full surfacing)
    bullet_x: jax.Array  # (2,) int32 friendly bullets, newest first
    bullet_y: jax.Array  # (2,) int32
    bullet_right: jax.Array  # (2,) bool
    bullet_active: jax.Array  # (2,) bool
    enemy_x: jax.Array  # (32,) int32 fish and subs, newest first
    enemy_y: jax.Array  # (32,) int32
    enemy_right: jax.Array  # (32,) bool
    enemy_sub: jax.Array  # (32,) bool: a sub, else a fish
    enemy_active: jax.Array  # (32,) bool
    enemy_move_timer: jax.Array  # (32,) int32
    enemy_shot_timer: jax.Array  # (32,) int32 (subs only)
    e_bullet_x: jax.Array  # (32,) int32: enemy i's bullet (row enemy_y[i], enemy_right[i])
    e_bullet_active: jax.Array  # (32,) bool
    diver_x: jax.Array  # (2,) int32 divers, newest first
    diver_y: jax.Array  # (2,) int32
    diver_right: jax.Array  # (2,) bool
    diver_active: jax.Array  # (2,) bool
    diver_move_timer: jax.Array  # (2,) int32
    e_spawn_speed: jax.Array  # int32
    e_spawn_timer: jax.Array  # int32
    d_spawn_timer: jax.Array  # int32
    move_speed: jax.Array  # int32
    ramp_index: jax.Array  # int32
    shot_timer: jax.Array  # int32: the player's gun


@params_dataclass
class EnvParams(MinAtarParams):
    difficulty_ramping: bool = flag(True)
    max_oxygen: int = bounded(200, 1)  # divides the surfacing bonus and the oxygen gauge
    # The timers count down to 0 and stay there until they fire: 0 means every step.
    init_spawn_speed: int = bounded(20, 0)
    min_spawn_speed: int = bounded(1, 0)  # the ramp stops here
    init_move_interval: int = bounded(5, 0)
    min_move_interval: int = bounded(2, 0)  # the ramp stops here
    diver_spawn_speed: int = bounded(30, 0)
    diver_move_interval: int = bounded(5, 0)
    shot_cool_down: int = bounded(5, 0)
    enemy_shot_interval: int = bounded(10, 0)
    max_divers: int = bounded(6, 0)
    spawn_left_prob: float = bounded(0.5, 0.0, 1.0)
    sub_prob: float = bounded(1.0 / 3.0, 0.0, 1.0)


class SpawnDraws(NamedTuple):
    """The draws one step may use; only read when an enemy or a diver spawns."""

    enemy_left_u: jax.Array  # < spawn_left_prob: at the left edge, heading right
    enemy_sub_u: jax.Array  # < sub_prob: a sub, else a fish
    enemy_row: jax.Array  # int32 in 1..8
    diver_left_u: jax.Array
    diver_row: jax.Array


def _push(spawn, arrays, new):
    """Shifts each array one slot back (dropping the last) and puts `new` at index 0."""
    return tuple(
        jnp.where(spawn, jnp.concatenate([jnp.asarray(v, a.dtype)[None], a[:-1]]), a)
        for a, v in zip(arrays, new)
    )


def _cells(y, x, mask):
    """`(10, 10)` bool: the cells `(y[i], x[i])` of the objects with `mask[i]` (rows are
    on the grid; columns off it are dropped). A scatter: on CPU about twice as fast as
    comparing every object with every cell."""
    x = jnp.where(mask & _on_grid(x), x, 10)
    return jnp.zeros((10, 10), jnp.bool_).at[y, x].set(True, mode="drop")


def _step(right):
    return jnp.where(right, 1, -1)


def _on_grid(x):
    return (x >= 0) & (x <= 9)


class Seaquest(MinAtarEnv):
    """Seaquest on a 10x10 grid; minimal actions: all six."""

    env_id = "Seaquest-MinAtar"
    CHANNELS = (
        "sub_front", "sub_back", "friendly_bullet", "trail", "enemy_bullet",
        "enemy_fish", "enemy_sub", "oxygen_guage", "diver_guage", "diver",
    )  # fmt: skip
    MINIMAL_ACTIONS = ("n", "l", "u", "r", "d", "f")

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        def zeros(n, dtype=jnp.int32):
            return jnp.zeros(n, dtype)

        spawn_speed = jnp.asarray(params.init_spawn_speed, jnp.int32)
        return EnvState(
            sub_x=jnp.int32(5),
            sub_y=jnp.int32(0),
            sub_right=jnp.bool_(False),
            oxygen=jnp.asarray(params.max_oxygen, jnp.int32),
            diver_count=jnp.int32(0),
            bullet_x=zeros(MAX_BULLETS),
            bullet_y=zeros(MAX_BULLETS),
            bullet_right=zeros(MAX_BULLETS, jnp.bool_),
            bullet_active=zeros(MAX_BULLETS, jnp.bool_),
            enemy_x=zeros(MAX_ENEMIES),
            enemy_y=zeros(MAX_ENEMIES),
            enemy_right=zeros(MAX_ENEMIES, jnp.bool_),
            enemy_sub=zeros(MAX_ENEMIES, jnp.bool_),
            enemy_active=zeros(MAX_ENEMIES, jnp.bool_),
            enemy_move_timer=zeros(MAX_ENEMIES),
            enemy_shot_timer=zeros(MAX_ENEMIES),
            e_bullet_x=zeros(MAX_ENEMIES),
            e_bullet_active=zeros(MAX_ENEMIES, jnp.bool_),
            diver_x=zeros(MAX_DIVERS),
            diver_y=zeros(MAX_DIVERS),
            diver_right=zeros(MAX_DIVERS, jnp.bool_),
            diver_active=zeros(MAX_DIVERS, jnp.bool_),
            diver_move_timer=zeros(MAX_DIVERS),
            e_spawn_speed=spawn_speed,
            e_spawn_timer=spawn_speed,
            d_spawn_timer=jnp.asarray(params.diver_spawn_speed, jnp.int32),
            move_speed=jnp.asarray(params.init_move_interval, jnp.int32),
            ramp_index=jnp.int32(0),
            shot_timer=jnp.int32(0),
            terminal=jnp.bool_(False),
            last_action=jnp.int32(0),
            time=jnp.int32(0),
        )

    def draw(self, key, state, params):
        key_u, key_row = jax.random.split(key)
        u = jax.random.uniform(key_u, (3,))
        rows = jax.random.randint(key_row, (2,), 1, 9)
        return SpawnDraws(u[0], u[1], rows[0], u[2], rows[1])

    def apply(self, state, full_action, draws, params):
        s = state

        # 1. Spawns.
        spawn = s.e_spawn_timer == 0
        right = draws.enemy_left_u < params.spawn_left_prob
        row = draws.enemy_row
        head_on = jnp.any(s.enemy_active & (s.enemy_y == row) & (s.enemy_right != right))
        (ex, ey, e_right, e_sub, e_alive, e_move, e_shot, eb_x, eb_alive) = _push(
            spawn & ~head_on,
            (s.enemy_x, s.enemy_y, s.enemy_right, s.enemy_sub, s.enemy_active,
             s.enemy_move_timer, s.enemy_shot_timer, s.e_bullet_x, s.e_bullet_active),
            (jnp.where(right, 0, 9), row, right, draws.enemy_sub_u < params.sub_prob, True,
             s.move_speed, params.enemy_shot_interval, 0, False),
        )  # fmt: skip
        e_spawn_timer = jnp.where(spawn, s.e_spawn_speed, s.e_spawn_timer)
        d_spawn = s.d_spawn_timer == 0
        new_right = draws.diver_left_u < params.spawn_left_prob
        dx, dy, d_right, d_alive, d_move = _push(
            d_spawn,
            (s.diver_x, s.diver_y, s.diver_right, s.diver_active, s.diver_move_timer),
            (jnp.where(new_right, 0, 9), draws.diver_row, new_right, True,
             params.diver_move_interval),
        )  # fmt: skip
        d_spawn_timer = jnp.where(d_spawn, params.diver_spawn_speed, s.d_spawn_timer)

        # 2. The player.
        a = full_action
        fire = (a == 5) & (s.shot_timer == 0)
        bx, by, b_right, b_alive = _push(
            fire,
            (s.bullet_x, s.bullet_y, s.bullet_right, s.bullet_active),
            (s.sub_x, s.sub_y, s.sub_right, True),
        )
        shot_timer = jnp.where(fire, params.shot_cool_down, s.shot_timer)
        x = jnp.clip(s.sub_x - (a == 1) + (a == 3), 0, 9)
        y = jnp.clip(s.sub_y - (a == 2) + (a == 4), 0, 8)
        sub_right = jnp.where(a == 1, False, jnp.where(a == 3, True, s.sub_right))

        # 3. Friendly bullets move; each, newest first, kills the oldest fish (else sub) on
        # its cell.
        bx = bx + _step(b_right)
        b_alive = b_alive & _on_grid(bx)
        fish_first = jnp.where(e_sub, 0, MAX_ENEMIES) + _ENEMY_IDX + 1
        reward = jnp.int32(0)
        for k in range(MAX_BULLETS):
            e_alive, b_alive, hit = _collide(
                k, (ex == bx[k]) & (ey == by[k]), fish_first, e_alive, b_alive
            )
            reward += hit

        # 4. Divers, newest first, are picked up while there is room.
        d_moves = d_alive & (d_move == 0)
        d_next = dx + _step(d_right)
        d_gone = d_moves & ~_on_grid(d_next)
        meet = (dy == y) & ((dx == x) | (d_moves & ~d_gone & (d_next == x)))
        meet = d_alive & meet
        before = jnp.cumsum(meet) - meet
        picked = meet & (s.diver_count + before < params.max_divers)
        diver_count = s.diver_count + jnp.sum(picked)
        dx = jnp.where(d_moves, d_next, dx)
        d_move = jnp.where(d_moves, params.diver_move_interval, d_move - 1)
        d_alive = d_alive & ~picked & ~d_gone

        # 5. Enemies (subs, then fish, newest first) move and meet the player or a bullet;
        # subs fire; enemy bullets (the new ones too) move.
        alive_before = e_alive
        e_moves = e_alive & (e_move == 0)
        ex_old, ex = ex, jnp.where(e_moves, ex + _step(e_right), ex)
        e_gone = e_moves & ~_on_grid(ex)
        on_row = ey == y
        crash = e_alive & on_row & ((ex_old == x) | (ex == x))
        # Each bullet, oldest first, takes a sub (newest first), else a fish, that moved
        # onto it: the same pairs as the reference's enemy-by-enemy loops.
        can_hit = e_moves & ~e_gone & ~(on_row & (ex == x))
        sub_first = jnp.where(e_sub, MAX_ENEMIES, 0) + MAX_ENEMIES - _ENEMY_IDX
        for k in reversed(range(MAX_BULLETS)):
            e_alive, b_alive, hit = _collide(
                k, can_hit & (ex == bx[k]) & (ey == by[k]), sub_first, e_alive, b_alive
            )
            reward += hit
        e_alive = e_alive & ~e_gone
        e_move = jnp.where(e_moves, s.move_speed, e_move - 1)
        fires = alive_before & e_sub & (e_shot == 0)  # even a sub that just died
        e_shot = jnp.where(fires, params.enemy_shot_interval, e_shot - 1)
        eb_old = jnp.where(fires, ex, eb_x)
        eb_alive = eb_alive | fires  # fired off the grid: gone after its move below
        eb_x = eb_old + _step(e_right)
        crash |= eb_alive & on_row & ((eb_old == x) | (eb_x == x))
        eb_alive = eb_alive & _on_grid(eb_x)

        # 6. Timers, oxygen and surfacing.
        terminal = jnp.any(crash) | (s.oxygen <= 0)
        below = y > 0
        oxygen = jnp.where(below, s.oxygen - 1, s.oxygen)
        arrive = ~below & (s.sub_y > 0)  # the reference's `surface` flag is `sub_y == 0`
        terminal |= arrive & (diver_count == 0)
        refill = arrive & (diver_count != 0)
        full = diver_count == params.max_divers
        reward += jnp.where(refill & full, oxygen * 10 // params.max_oxygen, 0)
        diver_count = jnp.where(refill, jnp.where(full, 0, diver_count) - 1, diver_count)
        oxygen = jnp.where(refill, params.max_oxygen, oxygen)
        faster_spawn = s.e_spawn_speed > params.min_spawn_speed
        faster_move = s.move_speed > params.min_move_interval
        ramp = refill & params.difficulty_ramping & (faster_spawn | faster_move)

        next_state = s.replace(
            sub_x=x,
            sub_y=y,
            sub_right=sub_right,
            oxygen=oxygen,
            diver_count=diver_count,
            bullet_x=bx,
            bullet_y=by,
            bullet_right=b_right,
            bullet_active=b_alive,
            enemy_x=ex,
            enemy_y=ey,
            enemy_right=e_right,
            enemy_sub=e_sub,
            enemy_active=e_alive,
            enemy_move_timer=e_move,
            enemy_shot_timer=e_shot,
            e_bullet_x=eb_x,
            e_bullet_active=eb_alive,
            diver_x=dx,
            diver_y=dy,
            diver_right=d_right,
            diver_active=d_alive,
            diver_move_timer=d_move,
            e_spawn_speed=s.e_spawn_speed - (ramp & faster_spawn),
            e_spawn_timer=e_spawn_timer - (e_spawn_timer > 0),
            d_spawn_timer=d_spawn_timer - (d_spawn_timer > 0),
            move_speed=s.move_speed - (ramp & faster_move & (s.ramp_index % 2 == 1)),
            ramp_index=s.ramp_index + ramp,
            shot_timer=shot_timer - (shot_timer > 0),
            terminal=terminal,
        )
        # A terminated game stays frozen, as the reference's `act` returns early.
        next_state = jax.tree.map(lambda old, new: jnp.where(s.terminal, old, new), s, next_state)
        reward = jnp.where(s.terminal, 0, reward).astype(jnp.float32)
        return next_state, reward, next_state.terminal

    def get_obs(self, state, params=None, key=None):
        params = self._params(params)
        s = state
        cols = _COLS[None, :]
        bottom = np.arange(10)[:, None] == 9
        oxygen_cells = jnp.maximum(s.oxygen, 0) * 10 // params.max_oxygen
        trail = _cells(
            jnp.concatenate([s.enemy_y, s.diver_y]),
            jnp.concatenate([s.enemy_x - _step(s.enemy_right), s.diver_x - _step(s.diver_right)]),
            jnp.concatenate([s.enemy_active, s.diver_active]),
        )
        return jnp.stack(
            [
                grid_mask(s.sub_y, s.sub_x),
                grid_mask(s.sub_y, s.sub_x - _step(s.sub_right)),
                _cells(s.bullet_y, s.bullet_x, s.bullet_active),
                trail,
                _cells(s.enemy_y, s.e_bullet_x, s.e_bullet_active),
                _cells(s.enemy_y, s.enemy_x, s.enemy_active & ~s.enemy_sub),
                _cells(s.enemy_y, s.enemy_x, s.enemy_active & s.enemy_sub),
                bottom & (cols < oxygen_cells),
                bottom & (cols >= 9 - s.diver_count) & (cols < 9),
                _cells(s.diver_y, s.diver_x, s.diver_active),
            ],
            axis=-1,
        )


def _collide(k, match, priority, e_alive, b_alive):
    """Bullet `k`, if alive, kills the matching enemy of highest `priority` (> 0)."""
    score = jnp.where(match & e_alive & b_alive[k], priority, 0)
    best = jnp.max(score)
    hit = best > 0
    return e_alive & ~(hit & (score == best)), b_alive.at[k].set(b_alive[k] & ~hit), hit
