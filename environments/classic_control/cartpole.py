"""CartPole-v1: balance a pole on a cart by pushing it left or right.

Barto, Sutton & Anderson (1983), "Neuronlike adaptive elements that can solve difficult
learning control problems". Dynamics, reward (+1 every step, the terminating one
included), termination thresholds, reset distribution and the 500-step limit follow
gymnasium 1.x's `CartPole-v1`, which `tests/environments/test_classic_control.py` steps side by side.
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
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array


@params_dataclass
class EnvParams:
    gravity: float = bounded(9.8, 0.0)
    masscart: float = bounded(1.0, 0.0, open_low=True)
    masspole: float = bounded(0.1, 0.0, open_low=True)
    length: float = bounded(0.5, 0.0, open_low=True)  # half the pole's length
    force_mag: float = bounded(10.0, 0.0)
    tau: float = bounded(0.02, 0.0, open_low=True)  # seconds between state updates (explicit Euler)
    theta_threshold_radians: float = bounded(12 * 2 * jnp.pi / 360, 0.0, open_low=True)
    x_threshold: float = bounded(2.4, 0.0, open_low=True)
    reset_bound: float = bounded(0.05, 0.0)
    max_steps_in_episode: int = bounded(500, 1)


class CartPole(Environment):
    """Two actions: 0 pushes the cart left, 1 pushes it right."""

    env_id = "CartPole-v1"
    stochastic = False

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        s = jax.random.uniform(key, (4,), minval=-params.reset_bound, maxval=params.reset_bound)
        return EnvState(x=s[0], x_dot=s[1], theta=s[2], theta_dot=s[3], time=jnp.int32(0))

    def transition(self, key, state, action, params):
        total_mass = params.masscart + params.masspole
        polemass_length = params.masspole * params.length
        force = jnp.where(action == 1, params.force_mag, -params.force_mag)
        costheta, sintheta = jnp.cos(state.theta), jnp.sin(state.theta)
        temp = (force + polemass_length * state.theta_dot**2 * sintheta) / total_mass
        thetaacc = (params.gravity * sintheta - costheta * temp) / (
            params.length * (4.0 / 3.0 - params.masspole * costheta**2 / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        next_state = state.replace(
            x=state.x + params.tau * state.x_dot,
            x_dot=state.x_dot + params.tau * xacc,
            theta=state.theta + params.tau * state.theta_dot,
            theta_dot=state.theta_dot + params.tau * thetaacc,
        )
        terminated = (
            (next_state.x < -params.x_threshold)
            | (next_state.x > params.x_threshold)
            | (next_state.theta < -params.theta_threshold_radians)
            | (next_state.theta > params.theta_threshold_radians)
        )
        return next_state, jnp.float32(1.0), terminated

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot]).astype(jnp.float32)

    def observation_space(self, params=None):
        params = self._params(params)
        high = jnp.array(
            [params.x_threshold * 2, jnp.finfo(jnp.float32).max,
             params.theta_threshold_radians * 2, jnp.finfo(jnp.float32).max]
        )
        return spaces.Box(-high, high, (4,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)
