"""The functional environment base class shared by every popeval environment.

An environment object holds only static configuration (shape-defining constructor
arguments). Everything that changes or may be randomised lives in two immutable pytrees:
`EnvState` (must carry an integer `time` field) and `EnvParams` (must carry
`max_steps_in_episode`). A subclass writes four small pure functions:

    default_params              -> EnvParams
    reset_state(key, params)    -> EnvState
    transition(key, state, action, params) -> (EnvState, reward, terminated)
    get_obs(state, params, key) -> observation

plus `observation_space(params)` / `action_space(params)`. A subclass written to gymnax's
contract instead, with its own raw `reset_env(key, params) -> (obs, state)` and
`step_env(key, state, action, params) -> (obs, state, reward, terminated, info)` (it counts
`time` itself), is adapted when the class is created: those two become the bodies behind
popeval's public methods, so it gets the same `reset` / `step`, time limit, `info`,
`state_space` and eager dispatch as one written the first way. `Environment[S, P]` names the
state and params types, as gymnax's generic base does. `EnvState` and `EnvParams` below
are bases a user-defined environment may subclass (every built-in one defines its own flax
struct dataclasses with the same two fields). This base class adds, once for all
environments, the public API:

    obs, state = env.reset(key, params)
    obs, state, reward, done, info = env.step(key, state, action, params)   # auto-resets
    obs, state = env.reset_env(key, params)                                 # raw
    obs, state, reward, done, info = env.step_env(key, state, action, params)  # raw

    env.state_space(params)                                                 # a spaces.Dict

Called eagerly (concrete arguments, a Python loop), the four functions run through `jax.jit`
functions built once per environment object (objects are immutable), so a Python loop
costs one dispatch per call and gives exactly `jax.jit(env.step)`'s results; called inside
`jit`/`vmap`/`scan` (traced arguments) they are traced inline.

`done = terminated | truncated`; `truncated` is the time limit (`is_truncated`:
`state.time >= params.max_steps_in_episode`, as gymnasium's `TimeLimit`);
`info = {"terminated", "truncated", "discount"}` with `discount = 1 - terminated`.

Out-of-range discrete actions: for a `Discrete(n)` action space, `step_env` (and so `step`)
clips an integer action into `[0, n - 1]` before the subclass's `transition` sees it, so
`n + 3` acts as `n - 1` and `-2` as `0` in every environment. The one exception is the
MinAtar games (`clip_discrete_actions = False`), which keep the reference's rule of
indexing their action list (see `minatar/common.py`): values `>= n` act as the last action,
`-n .. -1` count from the end as in Python, and values below `-n` act as the first.

Parameters are checked when built with `make` or `replace`, not inside `jit`/`vmap`: see
`checks.py` (`bounded`, `flag`, `params_dataclass`).
"""

from __future__ import annotations

import math
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from . import spaces
from .checks import bounded, params_dataclass

__all__ = ["EnvParams", "EnvState", "Environment"]

TEnvState = TypeVar("TEnvState")
TEnvParams = TypeVar("TEnvParams")


@struct.dataclass
class EnvState:
    """Base of an environment's state: `time` counts the steps of the current episode."""

    time: jax.Array


@params_dataclass
class EnvParams:
    """Base of an environment's parameters: the episode limit (gymnasium's `TimeLimit`).

    Subclasses add fields with defaults, e.g. `gravity: float = bounded(9.8, 0.0)`.
    """

    max_steps_in_episode: int = bounded(1000, 1)


def _traced(tree: Any) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def _leaf_space(leaf: jax.ShapeDtypeStruct) -> spaces.Space:
    """The widest space of one state leaf: its dtype's whole range (floats unbounded)."""
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return spaces.Key(leaf.shape)
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype))  # int64 is int32 without x64
    if dtype == np.bool_:
        return spaces.Box(0, 1, leaf.shape, jnp.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return spaces.Box(info.min, info.max, leaf.shape, dtype)
    return spaces.Box(-jnp.inf, jnp.inf, leaf.shape, dtype)


def _tree_space(tree: Any) -> spaces.Dict:
    """One space per pytree leaf, named by its path (`spaces.as_mapping`)."""
    return spaces.Dict({name: _leaf_space(leaf) for name, leaf in spaces.as_mapping(tree).items()})


class Environment(Generic[TEnvState, TEnvParams]):
    """Base class of all popeval environments (pure functions over pytrees)."""

    #: Whether `transition`/`reset_state`/`get_obs` use their key during a step. Rollouts
    #: do not need this flag to be right (unused keys are dead code that XLA removes); it
    #: documents the environment and lets tests check it.
    stochastic: bool = True

    #: Whether `step_env` clips a `Discrete` action into `[0, n - 1]` (the module docstring's
    #: rule). Only an environment whose reference defines another rule turns this off.
    clip_discrete_actions: bool = True

    #: Steps the rollout tools (`RolloutWrapper`, `evolve`) run by default when
    #: `max_steps_in_episode` is unbounded (MinAtar's reference has no time limit); `None`
    #: for environments whose limit is practical.
    default_rollout_steps: int | None = None

    #: A gymnax-contract subclass's own raw `reset_env` / `step_env` (see `__init_subclass__`).
    _gymnax_reset_env = None
    _gymnax_step_env = None

    def __init_subclass__(cls, **kwargs: Any):
        """Adapts a subclass that defines gymnax's raw `reset_env` / `step_env`: they become
        the bodies behind popeval's public `reset_env` / `step_env` (which add the parameter
        defaults, the eager dispatch, the action rule, the time limit and `info`)."""
        super().__init_subclass__(**kwargs)
        for public, body in (("reset_env", "_gymnax_reset_env"), ("step_env", "_gymnax_step_env")):
            if public in cls.__dict__:
                setattr(cls, body, cls.__dict__[public])
                delattr(cls, public)

    # ----------------------------------------------------------------- to implement
    @property
    def default_params(self) -> Any:
        raise NotImplementedError

    def reset_state(self, key: jax.Array, params: Any) -> Any:
        if self._gymnax_reset_env is not None:
            return self._gymnax_reset_env(key, params)[1]
        raise NotImplementedError

    def transition(self, key: jax.Array, state: Any, action: Any, params: Any):
        """One raw step: returns `(next_state, reward, terminated)`; `time` is handled here."""
        raise NotImplementedError

    def get_obs(self, state: Any, params: Any = None, key: jax.Array | None = None) -> Any:
        raise NotImplementedError

    def observation_space(self, params: Any = None) -> spaces.Space:
        raise NotImplementedError

    def action_space(self, params: Any = None) -> spaces.Space:
        raise NotImplementedError

    def is_truncated(self, state: Any, params: Any) -> jax.Array:
        """Whether `state` has reached the episode limit (the step that reaches it truncates)."""
        return state.time >= params.max_steps_in_episode

    # ----------------------------------------------------------------- shared API
    @property
    def name(self) -> str:
        """The id this class is registered under (`make`'s table), else the class name."""
        from .registry import REGISTRY  # the table imports every environment module

        return next((env_id for env_id, cls in REGISTRY.items() if cls is type(self)), type(self).__name__)

    @property
    def num_actions(self) -> int:
        """Number of discrete actions, or the size of a continuous action vector."""
        space = self.action_space(self.default_params)
        if isinstance(space, spaces.Discrete):
            return space.n
        return math.prod(space.shape)

    @property
    def unwrapped(self) -> Environment:
        """The environment itself; a view such as `compat.ObservationView` returns its base."""
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def state_space(self, params: Any = None) -> spaces.Dict:
        """The space of `EnvState`s: a `spaces.Dict` with one space per field (per leaf of a
        nested state, named by its dotted path), from the shapes and dtypes of a reset state. Floats
        are unbounded and integers span their dtype, so `contains` checks structure, shape
        and dtype; an environment with tighter invariants may override it."""
        params = self._params(params)
        state = jax.eval_shape(self.reset_state, jax.random.key(0), params)
        return _tree_space(state)

    def _jitted(self, name: str):
        """`jax.jit` of the raw method `name`, built once per environment object."""
        cache = self.__dict__.setdefault("_jit_cache", {})
        if name not in cache:
            cache[name] = jax.jit(getattr(self, name))
        return cache[name]

    def _params(self, params: Any) -> Any:
        default = self.default_params
        if params is None:
            return default
        if type(params) is not type(default):
            raise TypeError(
                f"{self.name}: params is a {type(params).__module__}.{type(params).__qualname__}, "
                f"expected this environment's {type(default).__qualname__} "
                f"(from {type(default).__module__}); get it from make({self.name!r})"
            )
        return params

    def _check_state(self, state: Any) -> None:
        """Refuses a state that is not this environment's (another environment's, `None`): its
        pytree structure must be a reset state's. Runs at trace time (structure only)."""
        cache = self.__dict__.setdefault("_jit_cache", {})
        if "state structure" not in cache:
            reset = jax.eval_shape(lambda k: self.reset_env(k, self.default_params)[1], jax.random.key(0))
            cache["state structure"] = jax.tree.structure(reset), type(reset)
        structure, cls = cache["state structure"]
        given = jax.tree.structure(state)
        if given != structure:
            name = lambda c: f"{c.__module__}.{c.__qualname__}"  # noqa: E731
            got = "None" if state is None else f"a {name(type(state))} with {given.num_leaves} leaves"
            raise TypeError(f"{self.name}: state is {got}, expected this environment's {name(cls)} with "
                            f"{structure.num_leaves} leaves (what its reset or step returned)")

    def reset_env(self, key: jax.Array, params: Any = None):
        """Raw reset: `(obs, state)` of a fresh episode."""
        params = self._params(params)
        if not _traced((key, params)):
            return self._jitted("_reset_env")(key, params)
        return self._reset_env(key, params)

    def step_env(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        """Raw step without auto-reset: `(obs, state, reward, done, info)`."""
        params = self._params(params)
        self._check_state(state)
        if not _traced((key, state, action, params)):
            return self._jitted("_step_env")(key, state, action, params)
        return self._step_env(key, state, action, params)

    def reset(self, key: jax.Array, params: Any = None):
        """Resets to a fresh episode: `(obs, state)`."""
        return self.reset_env(key, params)

    def step(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        """Steps and, when the episode ends, returns the first obs/state of a new one.

        `reward`, `done` and `info` describe the transition that ended the episode;
        `info["final_observation"]` is its last observation (`obs` is then the new episode's).
        """
        params = self._params(params)
        self._check_state(state)
        if not _traced((key, state, action, params)):
            return self._jitted("_step")(key, state, action, params)
        return self._step(key, state, action, params)

    # ----------------------------------------------------------------- traced bodies
    def _reset_env(self, key: jax.Array, params: Any):
        if self._gymnax_reset_env is not None:
            return self._gymnax_reset_env(key, params)
        state = self.reset_state(key, params)
        return self.get_obs(state, params, key), state

    def _step_env(self, key: jax.Array, state: Any, action: Any, params: Any):
        space = self.action_space(params)
        action = space.check_action(action, self.name)
        if self.clip_discrete_actions and isinstance(space, spaces.Discrete):
            action = jnp.clip(action, 0, space.n - 1)  # the documented out-of-range rule
        if self._gymnax_step_env is not None:
            obs, next_state, reward, terminated, info = self._gymnax_step_env(key, state, action, params)
        else:
            next_state, reward, terminated = self.transition(key, state, action, params)
            next_state = next_state.replace(time=state.time + 1)
            obs, info = self.get_obs(next_state, params, key), {}
        terminated = jnp.asarray(terminated, dtype=jnp.bool_)
        truncated = jnp.asarray(self.is_truncated(next_state, params), dtype=jnp.bool_)
        info = {
            **info,
            "terminated": terminated,
            "truncated": truncated,
            "discount": 1.0 - terminated.astype(jnp.float32),
        }
        return obs, next_state, jnp.asarray(reward, jnp.float32), terminated | truncated, info

    def _step(self, key: jax.Array, state: Any, action: Any, params: Any):
        key_step, key_reset = jax.random.split(key)
        obs_st, state_st, reward, done, info = self._step_env(key_step, state, action, params)
        obs_re, state_re = self._reset_env(key_reset, params)
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), state_re, state_st)
        obs = jax.tree.map(lambda r, s: jnp.where(done, r, s), obs_re, obs_st)
        return obs, state, reward, done, {**info, "final_observation": obs_st}
