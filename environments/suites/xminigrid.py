"""XLand-MiniGrid (`xminigrid`) environments as popeval environments.

    from popeval.environments.suites import xminigrid_env
    env = xminigrid_env("MiniGrid-Empty-5x5")      # also make("xminigrid/MiniGrid-Empty-5x5")
    obs, state = env.reset(jax.random.key(0))      # obs (7, 7, 2) uint8: each cell's tile and colour

Source: Nikulin et al., "XLand-MiniGrid: Scalable Meta-Reinforcement Learning Environments in
JAX" (NeurIPS 2024, Datasets and Benchmarks); reference implementation `xminigrid`, which
`tests/environments/test_suites.py` steps side by side with this adapter.

An xminigrid `TimeStep` carries the state, observation, reward, discount and step type.
Reaching the goal terminates (discount 0). xminigrid's `max_steps` truncates, and it is the
default `max_steps_in_episode`; the goal's reward shrinks with the steps taken over
`max_steps`, so that limit stays xminigrid's: pass `max_steps=` to change it (a larger
`max_steps_in_episode` still ends at it, as a truncation). The `MiniGrid-*` ids are complete;
the `XLand-MiniGrid-R*` ids play the rules of a benchmark, given as `ruleset=` (from
`xminigrid.load_benchmark`, which downloads it). xminigrid draws its randomness from a key in
its own state, so the step key is unused.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from popeval.environments import spaces
from popeval.environments.suites.base import SuiteEnv

__all__ = ["XMiniGridEnv", "env_names", "xminigrid_env"]


def env_names() -> list[str]:
    """The ids `xminigrid_env` takes (the ids `xminigrid/<id>`): xminigrid's registry."""
    import xminigrid

    return sorted(xminigrid.registered_environments())


class XMiniGridEnv(SuiteEnv):
    """An xminigrid environment for popeval; its `TimeStep` rides in `SuiteState.inner`.

    Args:
        env_id: an xminigrid id, e.g. `"MiniGrid-Empty-5x5"`.
        max_steps_in_episode: the default episode limit; default: xminigrid's `max_steps`.
        **make_kwargs: xminigrid's `EnvParams` fields for `xminigrid.make` (`max_steps=`,
            `view_size=`, `ruleset=`).
    """

    stochastic = False  # xminigrid's randomness rides in its own state's key

    def __init__(self, env_id: str, max_steps_in_episode: int | None = None, **make_kwargs: Any):
        import xminigrid
        from xminigrid.core.constants import NUM_COLORS, NUM_TILES

        self._name = env_id
        self._suite, self._suite_params = xminigrid.make(env_id, **make_kwargs)
        super().__init__(max_steps_in_episode or int(self._suite_params.max_steps))
        shape = self._suite.observation_shape(self._suite_params)
        high = jnp.broadcast_to(jnp.array([NUM_TILES - 1, NUM_COLORS - 1], jnp.uint8), shape)
        self._obs_space = spaces.Box(jnp.zeros(shape, jnp.uint8), high, shape, jnp.uint8)

    @property
    def name(self) -> str:
        return self._name

    def suite_reset(self, key):
        timestep = self._suite.reset(self._suite_params, key)
        return timestep, timestep.observation

    def suite_step(self, key, inner, action):
        timestep = self._suite.step(self._suite_params, inner, action)
        terminated = timestep.last() & (timestep.discount == 0)
        # xminigrid's own time limit (`max_steps`) may come first: a truncation too.
        return timestep, timestep.observation, timestep.reward, terminated, timestep.last()

    def observation_space(self, params=None) -> spaces.Box:
        return self._obs_space

    def action_space(self, params=None) -> spaces.Discrete:
        return spaces.Discrete(self._suite.num_actions(self._suite_params))


def xminigrid_env(env_id: str, max_steps_in_episode: int | None = None, **make_kwargs: Any) -> XMiniGridEnv:
    """An xminigrid environment as a popeval `Environment` (see `XMiniGridEnv`)."""
    return XMiniGridEnv(env_id, max_steps_in_episode, **make_kwargs)
