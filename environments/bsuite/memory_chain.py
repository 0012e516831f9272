"""MemoryChain-bsuite: remember a context bit for `memory_length` steps, then report it.

Osband et al. (2020), "Behaviour Suite for Reinforcement Learning", ICLR (experiments
`memory_len` / `memory_size`). Reference implementation:
`bsuite.environments.memory_chain.MemoryChain` (bsuite 0.3.x), which `tests/environments/test_bsuite.py`
steps side by side.

At reset a context of `num_bits` iid fair bits and a query index (uniform in
[0, num_bits)) are drawn. The observation is a (1, num_bits + 2) float32 row
`[time_left, query, context...]` describing bsuite's step counter `t`:
`time_left = 1 - t / memory_length`; the query is shown only when `t == memory_length - 1`;
the context (as +-1) only when `t == 0`. Timing, as in bsuite: each step returns the
observation of the counter value *before* that step advanced it, so the reset observation is
repeated after the first step, and the query appears after step `memory_length - 1` (at reset
when `memory_length == 1`). Every episode lasts `memory_length + 1` steps: rewards are 0
until the last step, which pays +1 if the action equals `context[query]` and -1 otherwise.

`memory_length` sets the episode length, hence the default `max_steps_in_episode` and a
rollout's length, so it is a constructor argument like the shape-defining `num_bits`. bsuite
requires it (its sweep spans 1..100); the default here is 5.
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
    context: jax.Array  # (num_bits,) int32 in {0, 1}
    query: jax.Array  # int32 in [0, num_bits)
    time: jax.Array  # bsuite's step counter


@params_dataclass
class EnvParams:
    max_steps_in_episode: int = bounded(6, 1)  # memory_length + 1: the natural episode length


class MemoryChain(Environment):
    """Two actions; only the last one of an episode counts (it should be `context[query]`)."""

    env_id = "MemoryChain-bsuite"
    stochastic = False  # only the reset draws (context and query)

    def __init__(self, memory_length: int = 5, num_bits: int = 1):
        self.memory_length = check_int("MemoryChain-bsuite", "memory_length", memory_length, 1)
        self.num_bits = check_int("MemoryChain-bsuite", "num_bits", num_bits, 1)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(max_steps_in_episode=self.memory_length + 1)

    def reset_state(self, key, params):
        key_context, key_query = jax.random.split(key)
        context = jax.random.bernoulli(key_context, 0.5, (self.num_bits,)).astype(jnp.int32)
        query = jax.random.randint(key_query, (), 0, self.num_bits, dtype=jnp.int32)
        return EnvState(context=context, query=query, time=jnp.int32(0))

    def transition(self, key, state, action, params):
        terminated = state.time == self.memory_length
        correct = action == state.context[state.query]
        reward = jnp.where(terminated, jnp.where(correct, 1.0, -1.0), 0.0)
        return state, reward, terminated

    def get_obs(self, state, params=None, key=None):
        t = jnp.maximum(state.time - 1, 0)  # the counter before the last step advanced it
        query = jnp.where(t == self.memory_length - 1, state.query, 0).astype(jnp.float32)
        context = jnp.where(t == 0, 2.0 * state.context - 1.0, 0.0).astype(jnp.float32)
        head = jnp.stack([time_left(t, self.memory_length), query])
        return jnp.concatenate([head, context])[None, :]

    def observation_space(self, params=None):
        low = jnp.array([0.0, 0.0] + [-1.0] * self.num_bits)
        high = jnp.array([1.0, self.num_bits - 1.0] + [1.0] * self.num_bits)
        return spaces.Box(low[None, :], high[None, :], (1, self.num_bits + 2), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)
