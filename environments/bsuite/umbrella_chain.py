"""UmbrellaChain-bsuite: only the first action matters, and its reward comes at the very end.

Osband et al. (2020), "Behaviour Suite for Reinforcement Learning", ICLR (experiments
`umbrella_length` / `umbrella_distract`). Reference implementation:
`bsuite.environments.umbrella_chain.UmbrellaChain` (bsuite 0.3.x), which
`tests/environments/test_bsuite.py` steps side by side.

At reset `need_umbrella` and `has_umbrella` are iid fair bits. The observation is a
(1, 3 + n_distractor) float32 row `[need_umbrella, has_umbrella, 1 - t / chain_length,
distractors...]` where the distractors are fresh iid fair bits at every observation. The
first action sets `has_umbrella` (0 or 1). Every episode lasts `chain_length` steps: the last
one pays +1 if `has_umbrella == need_umbrella` and -1 otherwise; every earlier step pays a
random +-1 (a fair coin), pure noise for credit assignment.

`chain_length` sets the episode length, hence the default `max_steps_in_episode` and a
rollout's length, so it is a constructor argument like the shape-defining `n_distractor`.
bsuite requires it (its sweep spans 1..100); the default here is 10.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from .. import spaces
from ..checks import bounded, check_int, params_dataclass
from ..environment import Environment
from .common import time_left


@struct.dataclass
class EnvState:
    need_umbrella: jax.Array  # int32 in {0, 1}
    has_umbrella: jax.Array  # int32 in {0, 1}
    distractors: jax.Array  # (n_distractor,) float32 in {0, 1}, part of the observation
    time: jax.Array


@params_dataclass
class EnvParams:
    max_steps_in_episode: int = bounded(10, 1)  # chain_length: the natural episode length


def transition_draws(key: jax.Array, n_distractor: int) -> tuple[jax.Array, jax.Array]:
    """The random numbers of one step: (reward coin in {0, 1} (int32), distractor bits).

    They play bsuite's `rng.binomial(1, 0.5)` (reward `2 * coin - 1` on non-final steps) and
    `rng.binomial(1, 0.5, size=n_distractor)` (the next observation's distractors).
    """
    key_coin, key_distractors = jax.random.split(key)
    coin = jax.random.bernoulli(key_coin, 0.5).astype(jnp.int32)
    return coin, jax.random.bernoulli(key_distractors, 0.5, (n_distractor,)).astype(jnp.float32)


class UmbrellaChain(Environment):
    """Two actions; the first one of an episode picks the umbrella up (1) or not (0)."""

    env_id = "UmbrellaChain-bsuite"
    stochastic = True  # noisy rewards and distractors are drawn every step

    def __init__(self, chain_length: int = 10, n_distractor: int = 0):
        self.chain_length = check_int("UmbrellaChain-bsuite", "chain_length", chain_length, 1)
        self.n_distractor = check_int("UmbrellaChain-bsuite", "n_distractor", n_distractor, 0)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(max_steps_in_episode=self.chain_length)

    def reset_state(self, key, params):
        key_bits, key_distractors = jax.random.split(key)
        need_umbrella, has_umbrella = jax.random.bernoulli(key_bits, 0.5, (2,)).astype(jnp.int32)
        distractors = jax.random.bernoulli(key_distractors, 0.5, (self.n_distractor,))
        return EnvState(
            need_umbrella=need_umbrella,
            has_umbrella=has_umbrella,
            distractors=distractors.astype(jnp.float32),
            time=jnp.int32(0),
        )

    def transition(self, key, state, action, params):
        coin, distractors = transition_draws(key, self.n_distractor)
        has_umbrella = jnp.where(state.time == 0, action, state.has_umbrella)
        terminated = state.time + 1 == self.chain_length
        final = jnp.where(has_umbrella == state.need_umbrella, 1.0, -1.0)
        reward = jnp.where(terminated, final, 2.0 * coin - 1.0)
        next_state = state.replace(has_umbrella=has_umbrella, distractors=distractors)
        return next_state, reward, terminated

    def get_obs(self, state, params=None, key=None):
        head = jnp.stack([
            state.need_umbrella.astype(jnp.float32),
            state.has_umbrella.astype(jnp.float32),
            time_left(state.time, self.chain_length),
        ])
        return jnp.concatenate([head, state.distractors])[None, :]

    def observation_space(self, params=None):
        return spaces.Box(0.0, 1.0, (1, 3 + self.n_distractor), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)
