"""Swimmer-misc: an N-link swimmer in a viscous fluid learns to swim forwards (+x).

The swimming task of MuJoCo's Swimmer (Coulom 2002; Todorov, Erez & Tassa 2012), with
low-Reynolds-number dynamics written here instead of a physics engine: Purcell's (1977)
N-link swimmer under resistive-force theory, integrated with explicit Euler steps.

Configuration `Q = (x, y, theta, q_1 .. q_{N-1})`: link 0 at absolute angle `theta`, link
`i` at `phi_i = theta + q_1 + ... + q_i`. Every link has length `l`, tangent
`t_i = (cos phi_i, sin phi_i)` and normal `n_i = (-sin phi_i, cos phi_i)`; the links are
chained end to end (`e_i = sum_{k<i} l t_k + (l / 2) t_i` from the front end) and `(x, y)` is
the centroid of their centres: `c_i = (x, y) + e_i - mean_k e_k`. (Integrating the centroid
rather than an end keeps the Euler error small: under isotropic drag it does not move.)
The fluid pushes on each link (drag coefficients per unit length `c_t` along it and
`c_n` across it; `c_n > c_t` is what makes swimming possible) with

    F_i = -l (c_t (dc_i . t_i) t_i + c_n (dc_i . n_i) n_i),   T_i = -c_n l^3 / 12 dphi_i

(force at the centre, torque about it). Inertia is negligible, so the joint rates `dq`
(the action) determine the body velocity `(dx, dy, dtheta)` through the balance of
forces and torques (about the centroid): `sum_i F_i = 0` and
`sum_i ((c_i - (x, y)) x F_i + T_i) = 0`, a 3x3 linear system (the `dc_i` and `dphi_i`
are linear in `dQ`). One step of `dt`, with the action `a` clipped to [-1, 1]^(N-1):

    q'       = clip(q + dt * max_joint_speed * a, -max_angle, max_angle)
    dq       = (q' - q) / dt
    (dx, dy, dtheta) = the solution of the balance at Q for dq
    (x, y, theta)'   = (x, y, theta) + dt * (dx, dy, dtheta)
    r        = dx - ctrl_cost * ||a||^2                (the centroid's forward speed)

No termination; truncated after `max_steps_in_episode` (1000, as MuJoCo's Swimmer, which
also uses `dt = 0.04`, three links and +-100 degree joints). At reset the joint angles are
drawn from U[-0.1, 0.1] (as MuJoCo), everything else is zero. The observation, as MuJoCo's, is
`[theta (wrapped to [-pi, pi)), q (N-1), dx, dy, dtheta, dq (N-1)]` (float32) with the
velocities of the last step.

No reference implementation exists for these dynamics; `tests/environments/test_misc.py` checks
physical properties (the scallop theorem, no net motion under isotropic drag, Purcell's
stroke swims).
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
    pose: jax.Array  # (3,) centroid x, y and heading theta of link 0
    joints: jax.Array  # (N-1,) joint angles q
    velocity: jax.Array  # (N+2,) dQ of the last step: dx, dy, dtheta, dq
    time: jax.Array


@params_dataclass
class EnvParams:
    link_length: float = bounded(1.0, 0.0, open_low=True)
    drag_tangential: float = bounded(1.0, 0.0, open_low=True)  # c_t
    drag_normal: float = bounded(2.0, 0.0, open_low=True)  # c_n
    max_joint_speed: float = bounded(2.0, 0.0)
    max_angle: float = bounded(1.7453292519943295, 0.0, 3.141592653589793)  # 100 degrees
    dt: float = bounded(0.04, 0.0, open_low=True)
    reset_noise: float = bounded(0.1, 0.0)
    ctrl_cost: float = bounded(1e-4, 0.0)
    max_steps_in_episode: int = bounded(1000, 1)


def link_angles(config: jax.Array) -> jax.Array:
    """Absolute angles phi (N,) of the links for the configuration `Q = (x, y, theta, q)`."""
    return config[2] + jnp.concatenate([jnp.zeros(1), jnp.cumsum(config[3:])])


def link_centres(config: jax.Array, link_length) -> jax.Array:
    """Centres (N, 2) of the links for the configuration `Q = (x, y, theta, q)`."""
    phi = link_angles(config)
    t = jnp.stack([jnp.cos(phi), jnp.sin(phi)], axis=-1)
    ends = link_length * (jnp.cumsum(t, axis=0) - 0.5 * t)  # e_i, from the front end
    return config[:2] + ends - ends.mean(axis=0)


def body_velocity(config: jax.Array, joint_rates: jax.Array, params) -> jax.Array:
    """`(dx, dy, dtheta)` (3,) for which the fluid's total force and torque vanish."""
    length, c_t, c_n = params.link_length, params.drag_tangential, params.drag_normal
    phi = link_angles(config)
    t = jnp.stack([jnp.cos(phi), jnp.sin(phi)], axis=-1)  # (N, 2)
    n = jnp.stack([-t[:, 1], t[:, 0]], axis=-1)
    # Velocities are linear in dQ: dc_i = dcentres[i] @ dQ, dphi_i = dphi[i] @ dQ.
    dcentres = jax.jacfwd(link_centres)(config, length)  # (N, 2, N+2)
    dphi = jax.jacfwd(link_angles)(config)  # (N, N+2)
    drag = -length * (c_t * t[:, :, None] * t[:, None, :] + c_n * n[:, :, None] * n[:, None, :])
    forces = jnp.einsum("iab,ibk->iak", drag, dcentres)  # (N, 2, N+2): F_i = forces[i] @ dQ
    arm = link_centres(config, length) - config[:2]
    torques = arm[:, 0, None] * forces[:, 1] - arm[:, 1, None] * forces[:, 0]
    torques = torques - c_n * length**3 / 12.0 * dphi
    wrench = jnp.concatenate([forces.sum(0), torques.sum(0)[None]])  # (3, N+2): (F, T) = wrench dQ
    return -jnp.linalg.solve(wrench[:, :3], wrench[:, 3:] @ joint_rates)


class Swimmer(Environment):
    """`num_links - 1` continuous actions in [-1, 1]: the joint rates (x max_joint_speed)."""

    env_id = "Swimmer-misc"
    stochastic = False  # only the reset is random

    def __init__(self, num_links: int = 3):
        self.num_links = check_int("Swimmer", "num_links", num_links, 2)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        m = self.num_links - 1
        noise = jnp.minimum(params.reset_noise, params.max_angle)
        joints = jax.random.uniform(key, (m,), minval=-noise, maxval=noise)
        return EnvState(jnp.zeros(3), joints, jnp.zeros(m + 3), jnp.int32(0))

    def transition(self, key, state, action, params):
        a = jnp.clip(action, -1.0, 1.0)
        joints = state.joints + params.dt * params.max_joint_speed * a
        joints = jnp.clip(joints, -params.max_angle, params.max_angle)
        # (q' - q) / dt, kept inside the joint-speed bound that float rounding could cross.
        speed = params.max_joint_speed
        joint_rates = jnp.clip((joints - state.joints) / params.dt, -speed, speed)
        config = jnp.concatenate([state.pose, state.joints])
        body = body_velocity(config, joint_rates, params)
        pose = state.pose + params.dt * body
        reward = body[0] - params.ctrl_cost * jnp.sum(a**2)
        velocity = jnp.concatenate([body, joint_rates])
        return state.replace(pose=pose, joints=joints, velocity=velocity), reward, jnp.bool_(False)

    def get_obs(self, state, params=None, key=None):
        heading = (state.pose[2] + jnp.pi) % (2 * jnp.pi) - jnp.pi
        return jnp.concatenate([heading[None], state.joints, state.velocity]).astype(jnp.float32)

    def observation_space(self, params=None):
        params = self._params(params)
        m = self.num_links - 1
        one = jnp.ones(m)
        inf = jnp.full(3, jnp.inf)
        high = jnp.concatenate(
            [jnp.pi * jnp.ones(1), params.max_angle * one, inf, params.max_joint_speed * one]
        )
        return spaces.Box(-high, high, (2 * m + 4,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Box(-1.0, 1.0, (self.num_links - 1,), jnp.float32)
