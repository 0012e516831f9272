"""PointRobot-misc: steer a point to a hidden goal in the plane (meta-RL 2-D navigation).

Finn, Abbeel & Levine (2017), "Model-agnostic meta-learning for fast adaptation of deep
networks" (2-D navigation); Rakelly et al. (2019), "Efficient off-policy meta-reinforcement
learning via probabilistic context variables" (PEARL) use the same point robot with other
goal distributions. Each episode is a new task: the goal is drawn uniformly from
`[-goal_range, goal_range]^2` (MAML: the unit square, `goal_range = 0.5`) and is not
observed. The point starts at the origin. The action is a velocity command clipped to
`[-max_action, max_action]^2` (0.1):

    pos' = clip(pos + clip(a, -max_action, max_action) + noise_std * N(0, I), -arena, arena)
    r    = -||pos' - goal||^2                      (MAML's negative squared distance)

The episode terminates when `||pos' - goal|| < goal_radius` (0.01, as MAML) and is truncated
after `max_steps_in_episode` (100, MAML's horizon). Following the meta-RL (RL^2 / PEARL
context) convention, the observation is `[pos (2), last clipped action (2), last reward]`
(float32), so a recurrent policy can infer the goal from the rewards.

No reference package implements it; `tests/environments/test_misc.py` checks these properties.
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
    pos: jax.Array  # (2,)
    goal: jax.Array  # (2,)
    last_action: jax.Array  # (2,) the clipped action of the last step
    last_reward: jax.Array
    time: jax.Array


@params_dataclass
class EnvParams:
    goal_range: float = bounded(0.5, 0.0)
    arena: float = bounded(1.0, 0.0, open_low=True)  # positions stay in [-arena, arena]^2
    max_action: float = bounded(0.1, 0.0, open_low=True)
    goal_radius: float = bounded(0.01, 0.0)
    noise_std: float = bounded(0.0, 0.0)
    max_steps_in_episode: int = bounded(100, 1)

    def check_values(self):
        if np.any(np.asarray(self.goal_range) > np.asarray(self.arena)):
            raise ValueError(
                f"{params_name(self)}: goal_range={self.goal_range} exceeds arena={self.arena}"
            )


class PointRobot(Environment):
    """A continuous action: the (x, y) velocity command."""

    env_id = "PointRobot-misc"

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        goal = jax.random.uniform(key, (2,), minval=-params.goal_range, maxval=params.goal_range)
        zero = jnp.zeros(2, jnp.float32)
        return EnvState(zero, goal, zero, jnp.float32(0.0), jnp.int32(0))

    def transition(self, key, state, action, params):
        action = jnp.clip(action, -params.max_action, params.max_action)
        noise = params.noise_std * jax.random.normal(key, (2,))
        pos = jnp.clip(state.pos + action + noise, -params.arena, params.arena)
        # Written out, not `jnp.sum(d ** 2)`: XLA:CPU can contract that two-element reduction
        # differently in the fitness and trajectory programs; the explicit sum rounds alike in
        # both (experiments/README.md, "Point robot's distance").
        d = pos - state.goal
        dist2 = d[0] * d[0] + d[1] * d[1]
        reward = -dist2
        next_state = state.replace(pos=pos, last_action=action, last_reward=reward)
        return next_state, reward, dist2 < params.goal_radius**2

    def get_obs(self, state, params=None, key=None):
        parts = [state.pos, state.last_action, state.last_reward[None]]
        return jnp.concatenate(parts).astype(jnp.float32)

    def observation_space(self, params=None):
        params = self._params(params)
        a, u = params.arena, params.max_action
        low = jnp.stack([-a, -a, -u, -u, -8.0 * a**2])
        high = jnp.stack([a, a, u, u, jnp.zeros_like(a)])
        return spaces.Box(low, high, (5,), jnp.float32)

    def action_space(self, params=None):
        params = self._params(params)
        return spaces.Box(-params.max_action, params.max_action, (2,), jnp.float32)
