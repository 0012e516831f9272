"""Navix (MiniGrid in JAX) environments as popeval environments.

    from popeval.environments.suites import navix_env
    env = navix_env("Navix-Empty-5x5-v0")          # max_steps_in_episode = navix's max_steps
    obs, state = env.reset(jax.random.key(0))      # obs (5, 5, 3) uint8, symbolic

Source: Pignatelli et al., "NAVIX: Scaling MiniGrid Environments with JAX" (2024); reference
implementation `navix`, which `tests/environments/test_suites.py` steps side by side with this adapter.

A navix `Timestep` carries the observation, reward and `step_type` (0 transition,
1 truncation, 2 termination). Termination is `terminated`; navix's truncation is its
`max_steps`, which becomes the default `max_steps_in_episode`. With a larger
`max_steps_in_episode` the episode still ends at navix's `max_steps` (reported as truncated);
pass `max_steps=` to lengthen it. Navix draws its randomness from a key in its own state, so
the step key is unused.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from popeval.environments import spaces
from popeval.environments.suites.base import SuiteEnv

__all__ = ["NavixEnv", "env_names", "navix_env"]

_TERMINATION = 2  # navix's StepType.TERMINATION (1 is TRUNCATION, 0 TRANSITION)


def env_names() -> list[str]:
    """The ids `navix_env` takes (the ids `navix/<id>`): navix's registry."""
    import navix

    return sorted(navix.registry())


def _space(space: Any) -> spaces.Space:
    """A navix space as a popeval one: scalar `Discrete` stays discrete, the rest are boxes."""
    from navix.spaces import Discrete

    if isinstance(space, Discrete) and space.shape == ():
        return spaces.Discrete(int(space.maximum) + 1, space.dtype)
    return spaces.Box(space.minimum, space.maximum, space.shape, space.dtype)


class NavixEnv(SuiteEnv):
    """A navix environment for popeval; its `Timestep` rides in `SuiteState.inner`.

    Args:
        env: a navix environment, or its registered id (`navix.make(env, **make_kwargs)`).
        max_steps_in_episode: the default episode limit; default: navix's `max_steps`.
        **make_kwargs: arguments for `navix.make` (e.g. `max_steps=`, `observation_fn=`).
    """

    stochastic = False  # navix's randomness rides in its own state's key

    def __init__(self, env: Any, max_steps_in_episode: int | None = None, **make_kwargs: Any):
        if isinstance(env, str):
            import navix

            self._name = env
            env = navix.make(env, **make_kwargs)
        else:
            if make_kwargs:
                raise ValueError("make_kwargs need an environment id, not an environment object")
            self._name = type(env).__name__
        super().__init__(max_steps_in_episode or int(env.max_steps))
        self._env = env

    @property
    def name(self) -> str:
        return self._name

    def suite_reset(self, key):
        timestep = self._env.reset(key)
        return timestep, timestep.observation

    def suite_step(self, key, inner, action):
        # `_step` is navix's raw step: its public `step` auto-resets through a `lax.cond`,
        # which under `vmap` computes a reset on every step.
        timestep = self._env._step(inner, action)
        terminated = timestep.step_type == _TERMINATION
        # Navix's own time limit may come before `max_steps_in_episode`: a truncation too.
        return timestep, timestep.observation, timestep.reward, terminated, timestep.is_truncation()

    def observation_space(self, params=None) -> spaces.Space:
        space = self._env.observation_space
        if jnp.issubdtype(space.dtype, jnp.integer):
            # Navix's declared maxima are not what it emits (symbolic declares 9 values, and
            # the agent's tag is 10): integer observations span their dtype.
            info = jnp.iinfo(space.dtype)
            return spaces.Box(info.min, info.max, space.shape, space.dtype)
        return _space(space)

    def action_space(self, params=None) -> spaces.Space:
        return _space(self._env.action_space)


def navix_env(env: Any, max_steps_in_episode: int | None = None, **make_kwargs: Any) -> NavixEnv:
    """A navix environment (or registered id) as a popeval `Environment` (see `NavixEnv`)."""
    return NavixEnv(env, max_steps_in_episode, **make_kwargs)
