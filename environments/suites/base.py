"""`SuiteEnv`: the shared base of the adapters to other JAX environment suites."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from popeval.environments.checks import bounded, params_dataclass
from popeval.environments.environment import Environment

__all__ = ["SuiteEnv", "SuiteParams", "SuiteState"]


@struct.dataclass
class SuiteState:
    inner: Any  # the suite's own state (a brax State, a jumanji (state, timestep), ...)
    obs: Any  # the observation that came with it
    time: jax.Array  # () int32, steps taken in this episode
    cut: jax.Array  # () bool, the suite ended the episode without terminating it (its time limit)


@params_dataclass
class SuiteParams:
    max_steps_in_episode: int = bounded(1000, 1)


class SuiteEnv(Environment):
    """A popeval `Environment` around another suite's environment.

    A subclass sets `name` and implements three methods over the suite's own objects:

        suite_reset(key) -> (inner, obs)
        suite_step(key, inner, action) -> (inner, obs, reward, terminated[, truncated])
        observation_space(params) / action_space(params)  -> popeval spaces

    `truncated` (optional, default false) says the suite ended the episode without
    terminating it (its own time limit); `step_env` then reports `done` with
    `info["truncated"]`, as it does at `max_steps_in_episode`.

    Args:
        max_steps_in_episode: the default episode limit (the suite's own, where it has one).
    """

    def __init__(self, max_steps_in_episode: int = 1000):
        self._max_steps = int(max_steps_in_episode)

    @property
    def default_params(self) -> SuiteParams:
        return SuiteParams(max_steps_in_episode=self._max_steps)

    def suite_reset(self, key: jax.Array):
        raise NotImplementedError

    def suite_step(self, key: jax.Array, inner: Any, action: Any):
        raise NotImplementedError

    def reset_state(self, key, params):
        inner, obs = self.suite_reset(key)
        return SuiteState(inner=inner, obs=obs, time=jnp.int32(0), cut=jnp.bool_(False))

    def transition(self, key, state, action, params):
        inner, obs, reward, terminated, *truncated = self.suite_step(key, state.inner, action)
        cut = jnp.asarray(truncated[0] if truncated else False, jnp.bool_)
        return state.replace(inner=inner, obs=obs, cut=cut), jnp.asarray(reward, jnp.float32), terminated

    def _step_env(self, key, state, action, params):
        obs, state, reward, done, info = super()._step_env(key, state, action, params)
        cut = state.cut & ~info["terminated"]
        return obs, state, reward, done | cut, {**info, "truncated": info["truncated"] | cut}

    def get_obs(self, state, params=None, key=None):
        return state.obs

