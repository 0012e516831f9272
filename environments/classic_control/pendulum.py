"""Pendulum-v1: swing a frictionless pendulum up and keep it upright.

The classic inverted-pendulum swing-up task. Dynamics (explicit Euler, velocity clipped),
cost `angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2` with the clipped torque, reset
distribution and the 200-step limit follow gymnasium 1.x's `Pendulum-v1`, which
`tests/environments/test_classic_control.py` steps side by side.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .. import spaces
from ..checks import bounded, params_dataclass
from ..environment import Environment


@struct.dataclass
class EnvState:
    theta: jax.Array
    theta_dot: jax.Array
    last_u: jax.Array  # clipped torque of the last step, for rendering
    time: jax.Array


@params_dataclass
class EnvParams:
    max_speed: float = bounded(8.0, 0.0)
    max_torque: float = bounded(2.0, 0.0)
    dt: float = bounded(0.05, 0.0, open_low=True)
    g: float = bounded(10.0, 0.0)
    m: float = bounded(1.0, 0.0, open_low=True)
    l: float = bounded(1.0, 0.0, open_low=True)  # noqa: E741 - the pole length, gymnasium's name
    max_steps_in_episode: int = bounded(200, 1)


def angle_normalize(x: jax.Array) -> jax.Array:
    """Maps an angle to [-pi, pi)."""
    return ((x + jnp.pi) % (2 * jnp.pi)) - jnp.pi


class Pendulum(Environment):
    """One continuous action: the torque, clipped to [-max_torque, max_torque]."""

    env_id = "Pendulum-v1"
    stochastic = False

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        high = jnp.array([jnp.pi, 1.0])
        s = jax.random.uniform(key, (2,), minval=-high, maxval=high)
        return EnvState(theta=s[0], theta_dot=s[1], last_u=jnp.float32(0.0), time=jnp.int32(0))

    def transition(self, key, state, action, params):
        u = jnp.clip(action[0], -params.max_torque, params.max_torque)
        th, thdot = state.theta, state.theta_dot
        costs = angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * u**2
        newthdot = thdot + (
            3 * params.g / (2 * params.l) * jnp.sin(th) + 3.0 / (params.m * params.l**2) * u
        ) * params.dt
        newthdot = jnp.clip(newthdot, -params.max_speed, params.max_speed)
        newth = th + newthdot * params.dt
        next_state = state.replace(theta=newth, theta_dot=newthdot, last_u=u)
        return next_state, -costs, jnp.bool_(False)

    def get_obs(self, state, params=None, key=None):
        return jnp.stack(
            [jnp.cos(state.theta), jnp.sin(state.theta), state.theta_dot]
        ).astype(jnp.float32)

    def observation_space(self, params=None):
        params = self._params(params)
        high = jnp.array([1.0, 1.0, params.max_speed])
        return spaces.Box(-high, high, (3,), jnp.float32)

    def action_space(self, params=None):
        params = self._params(params)
        return spaces.Box(-params.max_torque, params.max_torque, (1,), jnp.float32)
