"""Craftax (symbolic observations): the full game and Craftax-Classic, as popeval environments.

    from popeval.environments.suites import craftax_classic, craftax_env
    env = craftax_classic()                       # max_steps_in_episode = craftax's 10000
    obs, state = env.reset(jax.random.key(0))     # obs (1345,) float32 in [0, 1]
    full = craftax_env("Craftax-Symbolic-v1")     # the full game, also make("craftax/Craftax-Symbolic-v1")

Source: Matthews et al., "Craftax: A Lightning-Fast Benchmark for Open-Ended Reinforcement
Learning" (ICML 2024); reference implementation `craftax` (`Craftax-Classic-Symbolic-v1`,
`Craftax-Symbolic-v1`), which `tests/environments/test_suites.py` steps side by side with this adapter.

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

__all__ = ["CraftaxClassic", "CraftaxEnv", "craftax_classic", "craftax_env", "env_names"]

#: Craftax's `max_timesteps` while the adapter steps it: never reached (`timestep` is int32).
_NO_LIMIT = int(np.iinfo(np.int32).max)

#: The craftax games the adapter takes (craftax's names): symbolic observations only.
ENV_NAMES = ("Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1")


def env_names() -> list[str]:
    """The names `craftax_env` takes (the ids `craftax/<name>`)."""
    return list(ENV_NAMES)


class CraftaxEnv(SuiteEnv):
    """A Craftax game with symbolic observations, reset and time limit under popeval's control.

    Args:
        env_name: `"Craftax-Symbolic-v1"` (the full game) or `"Craftax-Classic-Symbolic-v1"`.
        craftax_params: craftax's own `EnvParams` (day length, mob spawn rates, ...); its
            `max_timesteps` becomes the default `max_steps_in_episode`. Default: craftax's.
        static_params: craftax's `StaticEnvParams` (map size, mob counts). Default: craftax's.
    """

    def __init__(self, env_name: str = "Craftax-Symbolic-v1", craftax_params: Any = None,
                 static_params: Any = None):
        if env_name not in ENV_NAMES:
            raise ValueError(f"craftax_env: {env_name!r} is not one of {', '.join(ENV_NAMES)}")
        from craftax.craftax_env import make_craftax_env_from_name

        # No auto-reset: popeval's `step` resets, and rollouts use the raw `step_env`.
        suite = make_craftax_env_from_name(env_name, auto_reset=False)
        if static_params is not None:
            suite = type(suite)(static_params)
        craftax_params = suite.default_params if craftax_params is None else craftax_params
        super().__init__(max_steps_in_episode=int(craftax_params.max_timesteps))
        self.env_name = env_name
        self._suite = suite
        self._craftax_params = craftax_params.replace(max_timesteps=_NO_LIMIT)
        space = suite.observation_space(craftax_params)
        self._obs_space = spaces.Box(space.low, space.high, tuple(space.shape), jnp.float32)

    @property
    def name(self) -> str:
        return self.env_name

    def suite_reset(self, key):
        obs, inner = self._suite.reset_env(key, self._craftax_params)
        return inner, obs

    def suite_step(self, key, inner, action):
        obs, inner, reward, done, _ = self._suite.step_env(key, inner, action, self._craftax_params)
        return inner, obs, reward, done  # with the limit off, `done` is death or lava

    def observation_space(self, params=None) -> spaces.Box:
        return self._obs_space

    def action_space(self, params=None) -> spaces.Discrete:
        return spaces.Discrete(self._suite.num_actions)


class CraftaxClassic(CraftaxEnv):
    """Craftax-Classic with symbolic observations (see `CraftaxEnv`)."""

    def __init__(self, craftax_params: Any = None, static_params: Any = None):
        super().__init__("Craftax-Classic-Symbolic-v1", craftax_params, static_params)


def craftax_env(env_name: str = "Craftax-Symbolic-v1", craftax_params: Any = None,
                static_params: Any = None) -> CraftaxEnv:
    """A Craftax game (`"Craftax-Symbolic-v1"`, the full one, or `"Craftax-Classic-Symbolic-v1"`)
    as a popeval `Environment` (see `CraftaxEnv`)."""
    return CraftaxEnv(env_name, craftax_params, static_params)


def craftax_classic(craftax_params: Any = None, static_params: Any = None) -> CraftaxClassic:
    """Craftax-Classic-Symbolic-v1 as a popeval `Environment` (see `CraftaxEnv`)."""
    return CraftaxClassic(craftax_params, static_params)
