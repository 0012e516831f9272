"""DiscountingChain-bsuite: the first action picks a chain whose single reward comes after a
delay of 1, 3, 10, 30 or 100 steps.

Osband et al. (2020), "Behaviour Suite for Reinforcement Learning", ICLR. Reference
implementation: `bsuite.environments.discounting_chain.DiscountingChain` (bsuite 0.3.x),
which `tests/environments/test_bsuite.py` steps side by side.

The first action `a` (of 5) fixes the context; the episode always lasts `episode_len` (100)
steps, and the step that brings the step counter to `reward_timesteps[a]` pays
`1 + bonus * (a == mapping_seed % 5)`, every other step 0: one arm, chosen by
`mapping_seed`, pays 10% more. The observation is the (1, 2) float32 row
`[context, t / episode_len]`, with context -1 before the first action. bsuite draws a random
`mapping_seed` when given none; here it is an `EnvParams` field with default 0 (bsuite's
first sweep setting), vmappable like every other field.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .. import spaces
from ..checks import bounded, params_dataclass
from ..environment import Environment

NUM_ACTIONS = 5


@struct.dataclass
class EnvState:
    context: jax.Array  # int32: -1 before the first action, then that action
    time: jax.Array


@params_dataclass
class EnvParams:
    mapping_seed: int = bounded(0)  # arm mapping_seed % 5 gets the bonus
    bonus: float = bounded(0.1)
    reward_timesteps: jax.Array = bounded(
        low=1, default_factory=lambda: jnp.array([1, 3, 10, 30, 100], jnp.int32)
    )  # (5,): the step at which each arm pays
    episode_len: int = bounded(100, 1)
    max_steps_in_episode: int = bounded(100, 1)  # episode_len: the natural episode length


class DiscountingChain(Environment):
    """Five actions; the first one of an episode chooses the reward delay."""

    env_id = "DiscountingChain-bsuite"
    stochastic = False

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        return EnvState(context=jnp.int32(-1), time=jnp.int32(0))

    def transition(self, key, state, action, params):
        context = jnp.where(state.time == 0, action, state.context)
        t = state.time + 1
        arm_reward = 1.0 + params.bonus * (context == params.mapping_seed % NUM_ACTIONS)
        reward = jnp.where(t == params.reward_timesteps[context], arm_reward, 0.0)
        return state.replace(context=context), reward, t == params.episode_len

    def get_obs(self, state, params=None, key=None):
        params = self._params(params)
        return jnp.stack([
            state.context.astype(jnp.float32),
            jnp.minimum(state.time, params.episode_len).astype(jnp.float32) / params.episode_len,
        ])[None, :]

    def observation_space(self, params=None):
        low = jnp.array([[-1.0, 0.0]])
        high = jnp.array([[NUM_ACTIONS - 1.0, 1.0]])
        return spaces.Box(low, high, (1, 2), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(NUM_ACTIONS)
