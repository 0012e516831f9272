"""gymnax 1.x's six-value step API over a popeval environment, and gymnax's space classes.

popeval's `step` returns five values, `(obs, state, reward, done, info)`, with `terminated`
and `truncated` in `info`. gymnax 1.x code, and gymnax's own wrappers (`LogWrapper`,
`FlattenObservationWrapper`, `StickyActionWrapper`, `GymnaxToGymWrapper`,
`GymnaxToVectorGymWrapper`, `GymnaxToDmEnvWrapper`), unpack six:

    from popeval.environments import make
    from popeval.environments.wrappers import SixValueStep

    env, env_params = make("CartPole-v1", compat="gymnax")
    env = SixValueStep(env)
    obs, state = env.reset(key, env_params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, env_params)
    info["final_observation"]   # the observation before the auto-reset

gymnax's wrappers and its Gym conversion test `isinstance(space, gymnax...spaces.Box)`;
`SixValueStep(env, gymnax_spaces=True)` returns gymnax's space classes from
`observation_space` / `action_space` / `state_space` (gymnax is imported then, on the first
such call, never by popeval's import), so those wrappers accept it:

    from gymnax.wrappers import GymnaxToGymWrapper, LogWrapper
    gym_env = GymnaxToGymWrapper(SixValueStep(env, gymnax_spaces=True), env_params)
    log_env = LogWrapper(SixValueStep(env, gymnax_spaces=True))

The dynamics, key use and auto-reset are popeval's `step`'s: `SixValueStep(env).step` gives
the same observation, state and reward as `env.step` for the same arguments. Attributes not
defined here (`default_params`, `name`, `num_actions`, `get_obs`, `unwrapped`, ...) are the
wrapped environment's.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import spaces

__all__ = ["SixValueStep", "to_gymnax_space"]


def to_gymnax_space(space: spaces.Space) -> Any:
    """The gymnax space (`gymnax.environments.spaces`) equal to a popeval space.

    Args:
        space: a popeval `Discrete`, `Box`, `Dict` or `Tuple` (nested ones convert recursively),
            or `Key`, which gymnax lacks and which is returned as it is (a state space's
            key field; it has the `sample` / `contains` gymnax's `Dict` calls).

    Returns:
        gymnax's `Discrete`, `Box`, `Dict` or `Tuple` with the same size, bounds, shape and dtype.

    Raises:
        ImportError: gymnax is not installed.
        TypeError: `space` is not one of popeval's space classes.
    """
    try:
        from gymnax.environments import spaces as gymnax_spaces
    except ImportError as error:  # gymnax is a test extra, never a dependency
        raise ImportError("to_gymnax_space needs gymnax (pip install gymnax)") from error
    if isinstance(space, spaces.Discrete):
        return gymnax_spaces.Discrete(space.n, dtype=space.dtype)
    if isinstance(space, spaces.Box):
        return gymnax_spaces.Box(_bound(space.low), _bound(space.high), space.shape, space.dtype)
    if isinstance(space, spaces.Dict):
        return gymnax_spaces.Dict({k: to_gymnax_space(v) for k, v in space.spaces.items()})
    if isinstance(space, spaces.Tuple):
        return gymnax_spaces.Tuple([to_gymnax_space(s) for s in space.spaces])
    if isinstance(space, spaces.Key):
        return space
    raise TypeError(f"to_gymnax_space: {space!r} is not a popeval Discrete, Box, Dict, Tuple or Key space")


def _bound(bound: jax.Array) -> Any:
    """A Box bound as gymnax writes it: a scalar when it is the same everywhere (gymnax's
    Gym conversion calls `float()` on a one-element bound), else the array."""
    if isinstance(bound, jax.core.Tracer):
        return bound
    values = np.unique(np.asarray(bound))
    return values[0] if values.size == 1 else bound


class SixValueStep:
    """A popeval environment with gymnax 1.x's API (`step` returns six values).

    Args:
        env: a popeval `Environment` (from `make`, possibly with `compat="gymnax"`).
        gymnax_spaces: return gymnax's space classes (needs gymnax) instead of popeval's
            from the three space methods, for gymnax's wrappers.
    """

    def __init__(self, env: Any, gymnax_spaces: bool = False):
        self._env = env
        self.gymnax_spaces = bool(gymnax_spaces)

    def __getattr__(self, name: str) -> Any:
        env = self.__dict__.get("_env")  # absent while copy/pickle rebuild the object
        if env is None:
            raise AttributeError(name)
        return getattr(env, name)

    def __repr__(self) -> str:
        return f"SixValueStep({self._env!r})"

    def __copy__(self) -> SixValueStep:
        # Immutable, so a copy (gymnax's Gym wrappers deep-copy their environment) shares
        # the wrapped environment and its compiled functions rather than compiling them again.
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict) -> SixValueStep:
        return self.__copy__()

    def _space(self, space: spaces.Space) -> Any:
        return to_gymnax_space(space) if self.gymnax_spaces else space

    def observation_space(self, params: Any = None) -> Any:
        """The observation space (gymnax's class with `gymnax_spaces=True`)."""
        return self._space(self._env.observation_space(params))

    def action_space(self, params: Any = None) -> Any:
        """The action space (gymnax's class with `gymnax_spaces=True`)."""
        return self._space(self._env.action_space(params))

    def state_space(self, params: Any = None) -> Any:
        """The space of `EnvState`s (gymnax's `Dict` with `gymnax_spaces=True`)."""
        return self._space(self._env.state_space(params))

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, Any]:
        """Resets to a fresh episode: `(obs, state)`."""
        return self._env.reset(key, params)

    def reset_env(self, key: jax.Array, params: Any = None) -> tuple[Any, Any]:
        """Raw reset, as gymnax's `reset_env`: `(obs, state)`."""
        return self._env.reset_env(key, params)

    def step_env(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        """Raw step without auto-reset, as gymnax 1.x's `step_env`.

        Returns:
            `(obs, state, reward, terminated, info)`: `terminated` is the natural end of the
            episode only (the time limit is `is_truncated`); `info` holds `discount`
            (`1 - terminated`) and popeval's `terminated` / `truncated`.
        """
        obs, state, reward, _, info = self._env.step_env(key, state, action, params)
        return obs, state, reward, info["terminated"], info

    def is_truncated(self, state: Any, params: Any = None) -> jax.Array:
        """Whether `state` has reached the episode limit (gymnax 1.x's `is_truncated`)."""
        params = self.default_params if params is None else params
        return state.time >= params.max_steps_in_episode

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        """Steps and, when the episode ends, returns the first obs/state of a new one.

        Returns:
            `(obs, state, reward, terminated, truncated, info)`: popeval's `step` (the same
            keys, dynamics and auto-reset) with its `done` split in two; `info` has gymnax
            1.x's keys: `discount`, `terminated`, `truncated` and `final_observation` (the
            observation before the auto-reset; `obs` itself when the episode goes on).
        """
        obs, state, reward, _, info = self._env.step(key, state, action, params)
        return obs, state, reward, info["terminated"], info["truncated"], info
