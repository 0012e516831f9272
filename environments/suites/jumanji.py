"""Any single-agent Jumanji environment as a popeval environment.

    from popeval.environments.suites import jumanji_env
    env = jumanji_env("Snake-v1")                  # max_steps_in_episode = Snake's time_limit
    obs, state = env.reset(jax.random.key(0))      # obs (725,) float32: the fields, flattened

Source: Bonnet et al., "Jumanji: a Diverse Suite of Scalable Reinforcement Learning
Environments in JAX" (ICLR 2024); reference implementation `jumanji`, whose `reset(key) ->
(state, timestep)` / `step(state, action) -> (state, timestep)` the adapter calls and
`tests/environments/test_suites.py` steps side by side with it.

Observations. Jumanji observations are structured (a NamedTuple of arrays, e.g. Snake's
`grid`, `step_count`, `action_mask`). With `flatten=True` (the default, what popeval's
policies and `RolloutWrapper` take) the policy sees one float32 vector: every field of the
observation spec, in the spec's order, raveled and concatenated, and `observation_space` is
the `Box` of the spec's bounds. With `flatten=False` it sees the fields as a nested `dict`,
and `observation_space` is the matching `spaces.Dict`.

Episode ends. A `LAST` timestep with discount 0 is `terminated`, one with discount > 0
`truncated`. Jumanji ends its own time limit (a `time_limit` attribute, e.g. Snake's 4000)
with discount 0 as well; here that limit is popeval's: it is the default
`max_steps_in_episode`, and an episode that ends on the step reaching it counts as
truncated (a snake that dies on that very step too, which jumanji does not tell apart).
With a larger `max_steps_in_episode` the episode still ends at jumanji's `time_limit`
(truncated); pass `time_limit=` to lengthen it. Environments without one default to 1000.
Jumanji draws its randomness from a key in its own state, so the step key is unused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popeval.environments import spaces
from popeval.environments.suites.base import SuiteEnv

__all__ = ["JumanjiEnv", "env_names", "jumanji_env"]


def env_names() -> list[str]:
    """The ids `jumanji_env` takes (the ids `jumanji/<id>`): jumanji's registry. Only its
    single-agent environments with a scalar reward can be adapted."""
    import jumanji

    return sorted(jumanji.registered_environments())


def _leaf_space(spec: Any) -> spaces.Space:
    """The popeval space of one jumanji array spec."""
    from jumanji import specs

    dtype = np.dtype(spec.dtype)
    if isinstance(spec, specs.DiscreteArray):
        return spaces.Discrete(spec.num_values, dtype)
    if isinstance(spec, specs.BoundedArray):  # MultiDiscreteArray too: [0, num_values - 1]
        return spaces.Box(spec.minimum, spec.maximum, spec.shape, dtype)
    if dtype == np.bool_:
        return spaces.Box(0, 1, spec.shape, dtype)
    if np.issubdtype(dtype, np.integer):
        return spaces.Box(np.iinfo(dtype).min, np.iinfo(dtype).max, spec.shape, dtype)
    return spaces.Box(-jnp.inf, jnp.inf, spec.shape, dtype)


def spec_to_space(spec: Any) -> spaces.Space:
    """A jumanji spec as a popeval space: a nested spec (one child spec per field) becomes a
    `spaces.Dict` in the spec's field order, an array spec a `Discrete` or `Box`."""
    from jumanji import specs

    if isinstance(spec, specs.Array):
        return _leaf_space(spec)
    return spaces.Dict({k: spec_to_space(v) for k, v in vars(spec).items() if isinstance(v, specs.Spec)})


def _as_dict(space: spaces.Space, value: Any) -> Any:
    """The fields of a jumanji observation (NamedTuple, dataclass or mapping) as nested dicts."""
    if not isinstance(space, spaces.Dict):
        return value
    get = value.__getitem__ if isinstance(value, Mapping) else lambda k: getattr(value, k)
    return {k: _as_dict(s, get(k)) for k, s in space.spaces.items()}


def _leaves(space: spaces.Space, tree: Any) -> list:
    """`tree`'s leaves (or `space`'s leaf spaces, when `tree` is None) in `space`'s order."""
    if isinstance(space, spaces.Dict):
        return [x for k, s in space.spaces.items() for x in _leaves(s, None if tree is None else tree[k])]
    return [space if tree is None else tree]


def _bounds(space: spaces.Space) -> tuple[jax.Array, jax.Array]:
    """The flat float32 `(low, high)` of every leaf space, concatenated."""
    lows, highs = [], []
    for s in _leaves(space, None):
        if isinstance(s, spaces.Discrete):
            lows.append(jnp.zeros((1,), jnp.float32))
            highs.append(jnp.full((1,), s.n - 1, jnp.float32))
        else:
            lows.append(jnp.ravel(s.low).astype(jnp.float32))
            highs.append(jnp.ravel(s.high).astype(jnp.float32))
    return jnp.concatenate(lows), jnp.concatenate(highs)


class JumanjiEnv(SuiteEnv):
    """A single-agent jumanji `Environment` (scalar reward and discount) for popeval.

    Args:
        env: a jumanji environment, or its registered id (`jumanji.make(env, **make_kwargs)`).
        flatten: give the policy one float32 vector (default) instead of a dict of fields.
        max_steps_in_episode: the default episode limit; default: the environment's
            `time_limit`, else 1000.
        **make_kwargs: constructor arguments for `jumanji.make` (e.g. `time_limit=`).
    """

    stochastic = False  # jumanji's randomness rides in its own state's key

    def __init__(self, env: Any, flatten: bool = True, max_steps_in_episode: int | None = None,
                 **make_kwargs: Any):
        if isinstance(env, str):
            import jumanji

            self._name = env
            env = jumanji.make(env, **make_kwargs)
        else:
            if make_kwargs:
                raise ValueError("make_kwargs need an environment id, not an environment object")
            self._name = type(env.unwrapped).__name__
        limit = getattr(env.unwrapped, "time_limit", None)
        self._time_limit = int(limit) if isinstance(limit, (int, np.integer)) else None
        super().__init__(max_steps_in_episode or self._time_limit or 1000)
        self._env = env
        self._flatten = bool(flatten)
        self._fields = spec_to_space(env.observation_spec)
        self._action_space = spec_to_space(env.action_spec)

    @property
    def name(self) -> str:
        return self._name

    def _observe(self, observation: Any) -> Any:
        fields = _as_dict(self._fields, observation)
        if not self._flatten:
            return fields
        return jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in _leaves(self._fields, fields)])

    def suite_reset(self, key):
        state, timestep = self._env.reset(key)
        return (state, timestep), self._observe(timestep.observation)

    def suite_step(self, key, inner, action):
        state, timestep = self._env.step(inner[0], action)
        terminated = timestep.last() & (timestep.discount == 0)
        # A LAST timestep that does not terminate (discount > 0), or jumanji's time limit
        # (see `transition`), ends the episode as a truncation, even before `max_steps_in_episode`.
        return ((state, timestep), self._observe(timestep.observation), timestep.reward, terminated,
                timestep.last())

    def transition(self, key, state, action, params):
        next_state, reward, terminated = super().transition(key, state, action, params)
        if self._time_limit is not None:  # jumanji's time limit is popeval's: a truncation
            terminated = terminated & (state.time + 1 < self._time_limit)
        return next_state, reward, terminated

    def observation_space(self, params=None) -> spaces.Space:
        if not self._flatten:
            return self._fields
        low, high = _bounds(self._fields)
        return spaces.Box(low, high, low.shape, jnp.float32)

    def action_space(self, params=None) -> spaces.Space:
        return self._action_space


def jumanji_env(env: Any, flatten: bool = True, max_steps_in_episode: int | None = None,
                **make_kwargs: Any) -> JumanjiEnv:
    """A jumanji environment (or registered id) as a popeval `Environment` (see `JumanjiEnv`)."""
    return JumanjiEnv(env, flatten, max_steps_in_episode, **make_kwargs)
