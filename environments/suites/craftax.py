"""Craftax-Classic (symbolic observations) as a popeval environment.

    from popeval.environments.suites import craftax_classic
    env = craftax_classic()                       # max_steps_in_episode = craftax's 10000
    obs, state = env.reset(jax.random.key(0))     # obs (1345,) float32 in [0, 1]

Source: Matthews et al., "Craftax: A Lightning-Fast Benchmark for Open-Ended Reinforcement
Learning" (ICML 2024); reference implementation `craftax` (`Craftax-Classic-Symbolic-v1`),
which `tests/test_suites.py` steps side by side with this adapter.

Craftax ends an episode on death, on lava, and when `state.timestep` reaches its
`EnvParams.max_timesteps`, all three as a terminal step. Here the last one is a time limit:
craftax's own `max_timesteps` becomes the default `max_steps_in_episode`, and the adapter
steps craftax with that limit switched off, so popeval reports the end of time as
`truncated` (gymnasium's `TimeLimit`) and only death or lava as `terminated`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from popeval.environments import spaces
from popeval.environments.suites.base import SuiteEnv

__all__ = ["CraftaxClassic", "craftax_classic"]

#: Craftax's `max_timesteps` while the adapter steps it: never reached (`timestep` is int32).
_NO_LIMIT = int(np.iinfo(np.int32).max)


class CraftaxClassic(SuiteEnv):
    """Craftax-Classic with symbolic observations, reset and time limit under popeval's control.

    Args:
        craftax_params: craftax's own `EnvParams` (day length, mob spawn rates, ...); its
            `max_timesteps` becomes the default `max_steps_in_episode`. Default: craftax's.
        static_params: craftax's `StaticEnvParams` (map size, mob counts). Default: craftax's.
    """

    def __init__(self, craftax_params: Any = None, static_params: Any = None):
        from craftax.craftax_env import make_craftax_env_from_name

        # No auto-reset: popeval's `step` resets, and rollouts use the raw `step_env`.
        suite = make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=False)
        if static_params is not None:
            suite = type(suite)(static_params)
        craftax_params = suite.default_params if craftax_params is None else craftax_params
        super().__init__(max_steps_in_episode=int(craftax_params.max_timesteps))
        self._suite = suite
        self._craftax_params = craftax_params.replace(max_timesteps=_NO_LIMIT)
        self._obs_size = int(suite.observation_space(craftax_params).shape[0])

    @property
    def name(self) -> str:
        return "Craftax-Classic-Symbolic-v1"

    def suite_reset(self, key):
        obs, inner = self._suite.reset_env(key, self._craftax_params)
        return inner, obs

    def suite_step(self, key, inner, action):
        obs, inner, reward, done, _ = self._suite.step_env(key, inner, action, self._craftax_params)
        return inner, obs, reward, done  # with the limit off, `done` is death or lava

    def observation_space(self, params=None) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (self._obs_size,), jnp.float32)

    def action_space(self, params=None) -> spaces.Discrete:
        return spaces.Discrete(self._suite.num_actions)


def craftax_classic(craftax_params: Any = None, static_params: Any = None) -> CraftaxClassic:
    """Craftax-Classic-Symbolic-v1 as a popeval `Environment` (see `CraftaxClassic`)."""
    return CraftaxClassic(craftax_params, static_params)
