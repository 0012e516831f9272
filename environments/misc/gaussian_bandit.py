"""GaussianBandit-misc: a meta-RL Gaussian bandit whose arm means change every episode.

The Gaussian-reward variant of the meta-RL bandits of Wang et al. (2016), "Learning to
reinforcement learn", and Duan et al. (2016), "RL^2". At reset each arm's mean is drawn
i.i.d. `mu_i ~ N(0, mean_std^2)`; pulling arm `a` pays `r ~ N(mu_a, reward_std^2)`. The
observation is the RL^2 input (last action one-hot, last reward, elapsed fraction of the
episode). An episode is `max_steps_in_episode` pulls (100 by default) and never terminates
early. Always pulling the best arm earns `T * max_i mu_i` in expectation.

No reference package implements it; `tests/environments/test_misc.py` checks these properties.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..checks import bounded, params_dataclass
from .common import MetaBandit


@params_dataclass
class EnvParams:
    mean_std: float = bounded(1.0, 0.0)
    reward_std: float = bounded(1.0, 0.0)
    max_steps_in_episode: int = bounded(100, 1)


class GaussianBandit(MetaBandit):
    """`num_arms` actions (constructor argument, default 2); real-valued rewards."""

    env_id = "GaussianBandit-misc"

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def draw_arms(self, key, params):
        return params.mean_std * jax.random.normal(key, (self.num_arms,))

    def draw_reward(self, key, arms, action, params):
        return arms[action] + params.reward_std * jax.random.normal(key)

    def reward_bounds(self, params):
        return -jnp.inf, jnp.inf
