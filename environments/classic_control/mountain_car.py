"""MountainCar-v0 and MountainCarContinuous-v0: drive an under-powered car up a hill.

Moore (1990), "Efficient memory-based learning for robot control". Both variants follow
gymnasium 1.x (`MountainCar-v0`: 3 discrete accelerations, -1 per step, goal 0.5, 200-step
limit; `MountainCarContinuous-v0`: force in [-1, 1], +100 at the goal minus
0.1 * action^2 of the *unclipped* action, goal 0.45, 999-step limit). In both, position is
clipped to [-1.2, 0.6] and the velocity is zeroed only at the *left* wall. The
conformance tests in `tests/environments/test_classic_control.py` step gymnasium side by side.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import bounded, params_dataclass, params_name
from ..environment import Environment


@struct.dataclass
class EnvState:
    position: jax.Array
    velocity: jax.Array
    time: jax.Array


def _check_order(params, low: str, high: str):
    """Cross-field rule: `params.<low> <= params.<high>` (the spaces' bounds)."""
    if np.any(np.asarray(getattr(params, low)) > np.asarray(getattr(params, high))):
        raise ValueError(
            f"{params_name(params)}: {low}={getattr(params, low)!r} > {high}={getattr(params, high)!r}"
        )


@params_dataclass
class EnvParams:
    min_position: float = bounded(-1.2)
    max_position: float = bounded(0.6)
    max_speed: float = bounded(0.07, 0.0)
    goal_position: float = bounded(0.5)
    goal_velocity: float = bounded(0.0)
    force: float = bounded(0.001, 0.0)
    gravity: float = bounded(0.0025, 0.0)
    max_steps_in_episode: int = bounded(200, 1)

    def check_values(self):
        _check_order(self, "min_position", "max_position")


@params_dataclass
class ContinuousEnvParams:
    min_action: float = bounded(-1.0)
    max_action: float = bounded(1.0)
    min_position: float = bounded(-1.2)
    max_position: float = bounded(0.6)
    max_speed: float = bounded(0.07, 0.0)
    goal_position: float = bounded(0.45)
    goal_velocity: float = bounded(0.0)
    power: float = bounded(0.0015, 0.0)
    gravity: float = bounded(0.0025, 0.0)
    max_steps_in_episode: int = bounded(999, 1)

    def check_values(self):
        _check_order(self, "min_position", "max_position")
        _check_order(self, "min_action", "max_action")


def _move(state, accel, params):
    """Shared car physics: velocity, then position, with the left-wall stop."""
    velocity = state.velocity + accel - params.gravity * jnp.cos(3 * state.position)
    velocity = jnp.clip(velocity, -params.max_speed, params.max_speed)
    position = jnp.clip(state.position + velocity, params.min_position, params.max_position)
    velocity = jnp.where((position == params.min_position) & (velocity < 0), 0.0, velocity)
    terminated = (position >= params.goal_position) & (velocity >= params.goal_velocity)
    return state.replace(position=position, velocity=velocity), terminated


class _MountainCarBase(Environment):
    stochastic = False

    def reset_state(self, key, params):
        position = jax.random.uniform(key, (), minval=-0.6, maxval=-0.4)
        return EnvState(position=position, velocity=jnp.float32(0.0), time=jnp.int32(0))

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.position, state.velocity]).astype(jnp.float32)

    def observation_space(self, params=None):
        params = self._params(params)
        return spaces.Box(
            jnp.array([params.min_position, -params.max_speed]),
            jnp.array([params.max_position, params.max_speed]),
            (2,),
            jnp.float32,
        )


class MountainCar(_MountainCarBase):
    """Three actions: 0 accelerate left, 1 coast, 2 accelerate right."""

    env_id = "MountainCar-v0"

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def transition(self, key, state, action, params):
        next_state, terminated = _move(state, (action - 1) * params.force, params)
        return next_state, jnp.float32(-1.0), terminated

    def action_space(self, params=None):
        return spaces.Discrete(3)


class MountainCarContinuous(_MountainCarBase):
    """One continuous action: the force, clipped to [min_action, max_action]."""

    env_id = "MountainCarContinuous-v0"

    @property
    def default_params(self) -> ContinuousEnvParams:
        return ContinuousEnvParams()

    def transition(self, key, state, action, params):
        force = jnp.clip(action[0], params.min_action, params.max_action)
        next_state, terminated = _move(state, force * params.power, params)
        # The control cost uses the unclipped action, as gymnasium does.
        reward = jnp.where(terminated, 100.0, 0.0) - 0.1 * action[0] ** 2
        return next_state, reward, terminated

    def action_space(self, params=None):
        params = self._params(params)
        return spaces.Box(params.min_action, params.max_action, (1,), jnp.float32)
