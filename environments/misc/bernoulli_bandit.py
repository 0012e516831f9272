"""BernoulliBandit-misc: a meta-RL Bernoulli bandit whose arm probabilities change every episode.

Wang et al. (2016), "Learning to reinforcement learn" (independent-arm bandits) and Duan et
al. (2016), "RL^2: Fast reinforcement learning via slow reinforcement learning". At reset
each arm's success probability is drawn i.i.d. `p_i ~ U[min_prob, max_prob]` (U[0, 1] in
both papers); pulling arm `a` pays `r ~ Bernoulli(p_a)`. The observation is the RL^2 input
(last action one-hot, last reward, elapsed fraction of the episode), so a recurrent policy
can learn to explore and exploit within an episode. An episode is `max_steps_in_episode`
pulls (100 by default) and never terminates early. The expected return of always pulling
the best arm is `T * E[max_i p_i] = T * num_arms / (num_arms + 1)` for U[0, 1] arms.

No reference package implements it; `tests/environments/test_misc.py` checks these properties.
"""

from __future__ import annotations

import jax
import numpy as np

from ..checks import bounded, params_dataclass, params_name
from .common import MetaBandit


@params_dataclass
class EnvParams:
    min_prob: float = bounded(0.0, 0.0, 1.0)
    max_prob: float = bounded(1.0, 0.0, 1.0)
    max_steps_in_episode: int = bounded(100, 1)

    def check_values(self):
        if np.any(np.asarray(self.min_prob) > np.asarray(self.max_prob)):
            raise ValueError(
                f"{params_name(self)}: min_prob={self.min_prob} > max_prob={self.max_prob}"
            )


class BernoulliBandit(MetaBandit):
    """`num_arms` actions (constructor argument, default 2); reward 1 or 0."""

    env_id = "BernoulliBandit-misc"

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def draw_arms(self, key, params):
        shape = (self.num_arms,)
        return jax.random.uniform(key, shape, minval=params.min_prob, maxval=params.max_prob)

    def draw_reward(self, key, arms, action, params):
        return jax.random.bernoulli(key, arms[action])

    def reward_bounds(self, params):
        return 0.0, 1.0
