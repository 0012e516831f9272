"""Brax (`brax.envs`) environments as popeval `Environment`s.

    from popeval.environments.suites import brax_env
    env = brax_env("inverted_pendulum")       # "brax/inverted_pendulum", 1000-step episodes

Source: Freeman et al., "Brax - A Differentiable Physics Engine for Large Scale Rigid Body
Simulation" (2021); reference implementation `brax.envs` (tests/environments/test_suite_brax.py steps
both with the same keys and actions). Brax's step takes no key, `state.done` is
termination (brax's own `EpisodeWrapper` time limit is replaced by popeval's
`max_steps_in_episode`), and actions lie in `[-1, 1]`, which brax scales to the actuators.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from brax import envs as brax_envs

from popeval.environments import spaces
from popeval.environments.hints import did_you_mean
from popeval.environments.suites.base import SuiteEnv

__all__ = ["BraxEnv", "brax_env", "env_names"]

# The fastest pipeline on a CPU where it matters. brax's own vmapped step in a lax.scan (as
# python -m experiments.benchmarks brax_throughput --backends times it), 2 cores, 64 episodes x 100 steps:
# ant 13.6k steps/s with "mjx", 8.9k "spring", 2.5k "generalized", 2.3k "positional", at
# similar compile times (24-36 s; positional 64 s). On the cheap inverted_pendulum "spring"
# steps fastest (100k vs 58k generalized, 48k mjx), where any pipeline is fast. mjx is also
# MuJoCo's own dynamics, the others brax's approximations of it: the default follows ant.
DEFAULT_BACKEND = "mjx"


def env_names() -> list[str] | None:
    """The names `brax_env` takes (the ids `brax/<name>`): `brax.envs`'s table, or None where
    brax keeps none."""
    known = getattr(brax_envs, "_envs", None)  # brax lists its environments nowhere public
    return None if known is None else sorted(known)


class BraxEnv(SuiteEnv):
    """A `brax.envs` environment behind popeval's `Environment` API.

    Args:
        env_name: a `brax.envs` name, e.g. `"inverted_pendulum"`, `"ant"`.
        backend: brax's physics pipeline (`generalized`, `positional`, `spring`, `mjx`).
        max_steps_in_episode: the default episode limit (brax's usual `episode_length`).
        **kwargs: the brax environment's own constructor arguments.
    """

    stochastic = False  # only the reset is random: brax's step takes no key

    def __init__(self, env_name: str, backend: str = DEFAULT_BACKEND, max_steps_in_episode: int = 1000,
                 **kwargs):
        super().__init__(max_steps_in_episode)
        known = env_names()
        if known is not None and env_name not in known:
            raise ValueError(f"unknown brax environment {env_name!r}{did_you_mean(env_name, known)}; "
                             f"brax has {', '.join(sorted(known))}")
        self.env_name, self.backend = env_name, backend
        self.brax = brax_envs.get_environment(env_name, backend=backend, **kwargs)
        # brax's `observation_size` runs an eager reset; shapes alone are enough here.
        self._obs_size = jax.eval_shape(self.brax.reset, jax.random.key(0)).obs.shape[-1]

    @property
    def name(self) -> str:
        return f"brax/{self.env_name}"

    def suite_reset(self, key):
        state = self.brax.reset(key)
        return state, state.obs

    def suite_step(self, key, inner, action):
        state = self.brax.step(inner, action)
        return state, state.obs, state.reward, state.done > 0  # brax's done is a float 0/1

    def observation_space(self, params=None) -> spaces.Box:
        return spaces.Box(-jnp.inf, jnp.inf, (self._obs_size,), jnp.float32)

    def action_space(self, params=None) -> spaces.Box:
        return spaces.Box(-1.0, 1.0, (self.brax.action_size,), jnp.float32)


def brax_env(env_name: str, backend: str = DEFAULT_BACKEND, max_steps_in_episode: int = 1000,
             **kwargs) -> BraxEnv:
    """Builds a brax environment as a popeval `Environment` (see `BraxEnv`).

    Returns:
        The environment; its `default_params` carry `max_steps_in_episode`.
    """
    return BraxEnv(env_name, backend=backend, max_steps_in_episode=max_steps_in_episode, **kwargs)
