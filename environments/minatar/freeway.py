"""Freeway-MinAtar: lead a chicken across eight lanes of traffic, as often as possible.

Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments". Rules follow `minatar/environments/freeway.py`
(MinAtar 1.0.15), which `tests/environments/test_minatar_freeway.py` steps side by side. One step:

1. `u` / `d` move the chicken (column 4) one row when its move timer is 0, which then
   restarts at `player_speed`;
2. reaching row 0 gives +1, puts the chicken back on row 9 and re-draws every car's speed
   and direction (its countdown restarts at the new speed; positions are kept);
3. car `i` (row `i + 1`) moves one column, wrapping around, when its countdown is 0 (then
   the countdown restarts at |speed|, else it counts down); a car on the chicken's cell
   before or after its move sends the chicken back to row 9;
4. the move timer counts down to 0; the episode terminates on step `time_limit + 1`
   (the reference's `terminate_timer < 0`; here `time`, which counts the episode's steps,
   serves as that timer).

Cars start in column 0 with speeds drawn at reset like at a crossing. The reference draws
|speed| uniform in 1..5 (`randint(1, 6)`) and direction `sign(rand() - 0.5)`; here one
uniform per car picks one of the 10 signed speeds (the same distribution from half the
random bits, which dominate the step's cost; the reference's speed-0 car at
`rand() == 0.5` exactly, probability 2**-53, is not modelled).

Kept divergences: after termination the reference keeps returning `(0, terminal)` with a
frozen state, and so does `step_env` here; `reset` also resets `last_action` to 0 (no-op),
which minatar's `Environment.reset()` does not.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from ..checks import bounded, params_dataclass
from .common import OBS_COLS, OBS_ROWS, MinAtarEnv, MinAtarParams, MinAtarState, lane_rows

__all__ = ["CarDraws", "EnvParams", "EnvState", "Freeway"]

_NUM_CARS = 8
_CAR_ROWS = np.arange(1, _NUM_CARS + 1, dtype=np.int32)  # car i drives on row i + 1
_CHANNELS = np.arange(7, dtype=np.int32)  # chicken, car, speed1..speed5
_CHICKEN_X = 4


@struct.dataclass
class EnvState(MinAtarState):
    pos: jax.Array  # int32 chicken row (column 4)
    move_timer: jax.Array  # int32 steps until the chicken may move again
    car_x: jax.Array  # (8,) int32 column of car i (row i + 1)
    car_timer: jax.Array  # (8,) int32 steps until car i moves
    car_speed: jax.Array  # (8,) int32 signed: moves every |speed| + 1 steps; sign = direction


@params_dataclass
class EnvParams(MinAtarParams):
    player_speed: int = bounded(3, 0)
    time_limit: int = bounded(2500, 0)


class CarDraws(NamedTuple):
    """One uniform per car for re-drawing its speed (used at reset and at a crossing)."""

    u: jax.Array  # (8,): floor(10 u) = 0..4 -> speed -1..-5 (left), 5..9 -> 1..5 (right)


def _car_speeds(draws):
    j = jnp.minimum(jnp.floor(draws.u * 10).astype(jnp.int32), 9)
    return jnp.where(j < 5, -(j + 1), j - 4)


class Freeway(MinAtarEnv):
    """Freeway on a 10x10 grid; minimal actions `n`, `u`, `d`."""

    env_id = "Freeway-MinAtar"
    CHANNELS = ("chicken", "car", "speed1", "speed2", "speed3", "speed4", "speed5")
    MINIMAL_ACTIONS = ("n", "u", "d")
    default_rollout_steps = 2501  # the whole game at the default time_limit (it ends on step 2501)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def draw(self, key, state, params):
        return CarDraws(jax.random.uniform(key, (_NUM_CARS,)))

    def reset_state(self, key, params):
        speed = _car_speeds(self.draw(key, None, params))
        return EnvState(
            pos=jnp.int32(9),
            move_timer=jnp.asarray(params.player_speed, jnp.int32),
            car_x=jnp.zeros(_NUM_CARS, jnp.int32),
            car_timer=jnp.abs(speed),
            car_speed=speed,
            terminal=jnp.bool_(False),
            last_action=jnp.int32(0),
            time=jnp.int32(0),
        )

    def apply(self, state, full_action, draws, params):
        can_move = state.move_timer == 0
        up = can_move & (full_action == 2)
        down = can_move & (full_action == 4)
        pos = jnp.clip(state.pos - up + down, 0, 9)
        move_timer = jnp.where(up | down, params.player_speed, state.move_timer)

        crossed = pos == 0
        speed = jnp.where(crossed, _car_speeds(draws), state.car_speed)
        timer = jnp.where(crossed, jnp.abs(speed), state.car_timer)
        pos = jnp.where(crossed, 9, pos)

        on_lane = _CAR_ROWS == pos
        hit = on_lane & (state.car_x == _CHICKEN_X)
        car_moves = timer == 0
        car_x = jnp.where(car_moves, (state.car_x + jnp.sign(speed)) % 10, state.car_x)
        hit = hit | (car_moves & on_lane & (car_x == _CHICKEN_X))
        pos = jnp.where(jnp.any(hit), 9, pos)

        next_state = state.replace(
            pos=pos,
            move_timer=jnp.maximum(move_timer - 1, 0).astype(jnp.int32),
            car_x=car_x,
            car_timer=jnp.where(car_moves, jnp.abs(speed), timer - 1),
            car_speed=speed,
            terminal=state.time >= params.time_limit,
        )
        # A terminated game stays frozen, as the reference's `act` returns early.
        next_state = jax.tree.map(
            lambda old, new: jnp.where(state.terminal, old, new), state, next_state
        )
        reward = jnp.where(crossed & ~state.terminal, 1.0, 0.0)
        return next_state, reward, next_state.terminal

    def get_obs(self, state, params=None, key=None):
        car = lane_rows(state.car_x, -1)
        trail = lane_rows((state.car_x - jnp.sign(state.car_speed)) % 10, -1)
        trail_channel = lane_rows(1 + jnp.abs(state.car_speed), -1)  # speed1..speed5
        return (
            ((OBS_ROWS == state.pos) & (OBS_COLS == _CHICKEN_X) & (_CHANNELS == 0))
            | ((OBS_COLS == car) & (_CHANNELS == 1))
            | ((OBS_COLS == trail) & (_CHANNELS == trail_channel))
        )
