"""Acrobot-v1: swing the tip of a two-link underactuated pendulum above a line.

Sutton (1996), "Generalization in reinforcement learning: successful examples using sparse
coarse coding", with the "book" dynamics of Sutton & Barto (1998). One RK4 step of
`dt = 0.2`, joint angles wrapped to [-pi, pi], velocities clipped to 4pi / 9pi, reward -1
per step and 0 on reaching the goal, 500-step limit: gymnasium 1.x's `Acrobot-v1`, which
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
    joint_angle1: jax.Array
    joint_angle2: jax.Array
    velocity_1: jax.Array
    velocity_2: jax.Array
    time: jax.Array


@params_dataclass
class EnvParams:
    dt: float = bounded(0.2, 0.0, open_low=True)
    link_length_1: float = bounded(1.0, 0.0, open_low=True)
    link_mass_1: float = bounded(1.0, 0.0, open_low=True)
    link_mass_2: float = bounded(1.0, 0.0, open_low=True)
    link_com_pos_1: float = bounded(0.5, 0.0, open_low=True)
    link_com_pos_2: float = bounded(0.5, 0.0, open_low=True)
    link_moi: float = bounded(1.0, 0.0, open_low=True)
    max_vel_1: float = bounded(4 * jnp.pi, 0.0)
    max_vel_2: float = bounded(9 * jnp.pi, 0.0)
    gravity: float = bounded(9.8, 0.0)
    max_steps_in_episode: int = bounded(500, 1)


def wrap(x: jax.Array, low: float, high: float) -> jax.Array:
    """Wraps `x` into [low, high] by whole periods (gymnasium's `wrap`, without a loop)."""
    diff = high - low
    x = jnp.where(x > high, x - diff * jnp.ceil((x - high) / diff), x)
    return jnp.where(x < low, x + diff * jnp.ceil((low - x) / diff), x)


def _dsdt(s: jax.Array, torque: jax.Array, p: EnvParams) -> jax.Array:
    """Time derivative of (theta1, theta2, dtheta1, dtheta2) under `torque`."""
    m1, m2, l1 = p.link_mass_1, p.link_mass_2, p.link_length_1
    lc1, lc2, i1, i2, g = p.link_com_pos_1, p.link_com_pos_2, p.link_moi, p.link_moi, p.gravity
    theta1, theta2, dtheta1, dtheta2 = s[0], s[1], s[2], s[3]
    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * jnp.cos(theta2)) + i1 + i2
    d2 = m2 * (lc2**2 + l1 * lc2 * jnp.cos(theta2)) + i2
    phi2 = m2 * lc2 * g * jnp.cos(theta1 + theta2 - jnp.pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * dtheta2**2 * jnp.sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * jnp.sin(theta2)
        + (m1 * lc1 + m2 * l1) * g * jnp.cos(theta1 - jnp.pi / 2)
        + phi2
    )
    ddtheta2 = (
        torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * jnp.sin(theta2) - phi2
    ) / (m2 * lc2**2 + i2 - d2**2 / d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return jnp.stack([dtheta1, dtheta2, ddtheta1, ddtheta2])


class Acrobot(Environment):
    """Three actions: torque -1, 0 or +1 on the joint between the links."""

    env_id = "Acrobot-v1"
    stochastic = False

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        s = jax.random.uniform(key, (4,), minval=-0.1, maxval=0.1)
        return EnvState(s[0], s[1], s[2], s[3], jnp.int32(0))

    def transition(self, key, state, action, params):
        torque = jnp.array([-1.0, 0.0, 1.0])[action]  # gymnasium's torque noise is 0
        s = jnp.stack([state.joint_angle1, state.joint_angle2, state.velocity_1, state.velocity_2])
        # One classical Runge-Kutta step over [0, dt] (gymnasium's rk4 with t=[0, dt]).
        dt = params.dt
        k1 = _dsdt(s, torque, params)
        k2 = _dsdt(s + dt / 2 * k1, torque, params)
        k3 = _dsdt(s + dt / 2 * k2, torque, params)
        k4 = _dsdt(s + dt * k3, torque, params)
        ns = s + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        next_state = state.replace(
            joint_angle1=wrap(ns[0], -jnp.pi, jnp.pi),
            joint_angle2=wrap(ns[1], -jnp.pi, jnp.pi),
            velocity_1=jnp.clip(ns[2], -params.max_vel_1, params.max_vel_1),
            velocity_2=jnp.clip(ns[3], -params.max_vel_2, params.max_vel_2),
        )
        terminated = (
            -jnp.cos(next_state.joint_angle1)
            - jnp.cos(next_state.joint_angle2 + next_state.joint_angle1)
        ) > 1.0
        reward = jnp.where(terminated, 0.0, -1.0)
        return next_state, reward, terminated

    def get_obs(self, state, params=None, key=None):
        return jnp.stack(
            [
                jnp.cos(state.joint_angle1), jnp.sin(state.joint_angle1),
                jnp.cos(state.joint_angle2), jnp.sin(state.joint_angle2),
                state.velocity_1, state.velocity_2,
            ]
        ).astype(jnp.float32)

    def observation_space(self, params=None):
        params = self._params(params)
        high = jnp.array([1.0, 1.0, 1.0, 1.0, params.max_vel_1, params.max_vel_2])
        return spaces.Box(-high, high, (6,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(3)
