"""Reacher-misc: move the tip of a planar N-link arm to a random target.

The reaching task of MuJoCo's Reacher (Todorov, Erez & Tassa 2012; Brockman et al. 2016)
with simple dynamics written here instead of a physics engine: the arm lies in the
horizontal plane (no gravity), its base is fixed at the origin, and each joint is an
independent damped rotor (no inertial coupling between links). With joint angles `q`
(relative to the previous link), joint velocities `w`, the action `a` clipped to
[-1, 1]^N and semi-implicit Euler steps of `dt`:

    w' = clip(w + dt * (max_torque * a - damping * w) / inertia, -max_speed, max_speed)
    q' = q + dt * w'
    tip(q) = sum_i link_length * (cos phi_i, sin phi_i),   phi_i = q_0 + ... + q_i
    r = -||tip(q') - target|| - ctrl_cost * ||a||^2

At reset the angles are drawn from U[-0.1, 0.1] (as MuJoCo's Reacher), the velocities
are zero and the target is drawn uniformly from the disc of radius
`target_frac * N * link_length` (reachable by the arm). No termination; truncated after
`max_steps_in_episode` (50, as MuJoCo's Reacher). The observation is
`[cos q (N), sin q (N), w (N), target (2), tip - target (2)]` (float32).

No reference implementation exists for these dynamics; `tests/environments/test_misc.py` checks them.
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
    angles: jax.Array  # (N,) joint angles q
    velocities: jax.Array  # (N,) joint velocities w
    target: jax.Array  # (2,)
    time: jax.Array


@params_dataclass
class EnvParams:
    link_length: float = bounded(0.1, 0.0, open_low=True)
    inertia: float = bounded(0.01, 0.0, open_low=True)
    damping: float = bounded(0.01, 0.0)
    max_torque: float = bounded(0.2, 0.0)
    max_speed: float = bounded(20.0, 0.0)
    dt: float = bounded(0.02, 0.0, open_low=True)
    target_frac: float = bounded(1.0, 0.0, 1.0)
    reset_noise: float = bounded(0.1, 0.0)
    ctrl_cost: float = bounded(0.1, 0.0)
    max_steps_in_episode: int = bounded(50, 1)


def fingertip(angles: jax.Array, link_length) -> jax.Array:
    """Position (2,) of the arm's tip for joint angles (N,)."""
    phi = jnp.cumsum(angles)
    return link_length * jnp.stack([jnp.sum(jnp.cos(phi)), jnp.sum(jnp.sin(phi))])


class Reacher(Environment):
    """`num_links` continuous actions in [-1, 1]: the joint torques (as fractions of max_torque)."""

    env_id = "Reacher-misc"
    stochastic = False  # only the reset is random

    def __init__(self, num_links: int = 2):
        self.num_links = check_int("Reacher", "num_links", num_links, 1)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        key_q, key_r, key_phi = jax.random.split(key, 3)
        n = self.num_links
        noise = params.reset_noise
        angles = jax.random.uniform(key_q, (n,), minval=-noise, maxval=noise)
        radius = params.target_frac * n * params.link_length * jnp.sqrt(jax.random.uniform(key_r))
        phi = jax.random.uniform(key_phi, minval=-jnp.pi, maxval=jnp.pi)
        target = radius * jnp.stack([jnp.cos(phi), jnp.sin(phi)])
        return EnvState(angles=angles, velocities=jnp.zeros(n), target=target, time=jnp.int32(0))

    def transition(self, key, state, action, params):
        a = jnp.clip(action, -1.0, 1.0)
        accel = (params.max_torque * a - params.damping * state.velocities) / params.inertia
        w = jnp.clip(state.velocities + params.dt * accel, -params.max_speed, params.max_speed)
        q = state.angles + params.dt * w
        dist = jnp.linalg.norm(fingertip(q, params.link_length) - state.target)
        reward = -dist - params.ctrl_cost * jnp.sum(a**2)
        return state.replace(angles=q, velocities=w), reward, jnp.bool_(False)

    def get_obs(self, state, params=None, key=None):
        params = self._params(params)
        delta = fingertip(state.angles, params.link_length) - state.target
        q = state.angles
        return jnp.concatenate(
            [jnp.cos(q), jnp.sin(q), state.velocities, state.target, delta]
        ).astype(jnp.float32)

    def observation_space(self, params=None):
        params = self._params(params)
        n = self.num_links
        reach = n * params.link_length
        one = jnp.ones(n)
        high = jnp.concatenate(
            [one, one, params.max_speed * one, reach * jnp.ones(2), 2 * reach * jnp.ones(2)]
        )
        return spaces.Box(-high, high, (3 * n + 4,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Box(-1.0, 1.0, (self.num_links,), jnp.float32)
