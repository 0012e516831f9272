"""SimpleBandit-bsuite: a one-step bandit whose arms pay 0, 0.1, ..., 1 in shuffled order.

Osband et al. (2020), "Behaviour Suite for Reinforcement Learning", ICLR (experiment
`bandit`). Reference implementation: `bsuite.environments.bandit.SimpleBandit`
(bsuite 0.3.x), which `tests/environments/test_bsuite.py` steps side by side.

Every episode is one step: the observation is a (1, 1) float32 one (also after the step),
and pulling arm `a` pays `rewards[a]`, deterministically, then terminates. The payouts are
`linspace(0, 1, num_actions)` permuted by `mapping_seed`, drawn exactly as bsuite draws
them (`np.random.RandomState(mapping_seed).choice(num_actions, num_actions, replace=False)`),
into the `EnvParams.rewards` array; any other payout vector can be put there. bsuite draws a
random mapping when given no `mapping_seed`; here the default is 0 (its sweep's first setting).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import bounded, check_int, params_dataclass
from ..environment import Environment
from .common import check_seed


@struct.dataclass
class EnvState:
    time: jax.Array


@params_dataclass
class EnvParams:
    rewards: jax.Array = bounded()  # (num_actions,) float32: the payout of each arm
    max_steps_in_episode: int = bounded(1, 1)  # one pull per episode


def arm_rewards(num_actions: int = 11, mapping_seed: int = 0) -> np.ndarray:
    """bsuite's payouts for `SimpleBandit(mapping_seed, num_actions)` (float32, (num_actions,))."""
    order = np.random.RandomState(mapping_seed).choice(num_actions, num_actions, replace=False)
    return np.linspace(0.0, 1.0, num_actions)[order].astype(np.float32)


class SimpleBandit(Environment):
    """`num_actions` arms, one pull per episode."""

    env_id = "SimpleBandit-bsuite"
    stochastic = False

    def __init__(self, num_actions: int = 11, mapping_seed: int = 0):
        self.num_arms = check_int("SimpleBandit-bsuite", "num_actions", num_actions, 1)
        self.mapping_seed = check_seed("SimpleBandit-bsuite", "mapping_seed", mapping_seed)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(rewards=jnp.asarray(arm_rewards(self.num_arms, self.mapping_seed)))

    def reset_state(self, key, params):
        return EnvState(time=jnp.int32(0))

    def transition(self, key, state, action, params):
        return state, params.rewards[action], jnp.bool_(True)

    def get_obs(self, state, params=None, key=None):
        return jnp.ones((1, 1), jnp.float32)

    def observation_space(self, params=None):
        return spaces.Box(0.0, 1.0, (1, 1), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(self.num_arms)
