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
`time` itself), is adapted when the class is created: popeval's public methods wrap those two
(its own or a mixin's), so it gets the same `reset` / `step`, time limit, `info`,
`state_space` and eager dispatch as one written the first way, and `super().step_env(...)`
inside them reaches the parent's public method, as in gymnax. gymnax's helpers (`observe`,
`is_terminated`, `is_terminal`, `discount`) mean what they mean there. `Environment[S, P]`
names the state and params types, as gymnax's generic base does. `EnvState` and `EnvParams`
below are bases a user-defined environment may subclass (every built-in one defines its own
flax struct dataclasses with the same two fields). This base class adds, once for all
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

import dataclasses
import functools
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


def _public(method):
    """Marks one of popeval's public raw methods (`__init_subclass__` wraps any other)."""
    method._popeval_public = True
    return method


def _describe(x: Any) -> str:
    if x is None:
        return "None"
    return f"a {type(x).__module__}.{type(x).__qualname__}"


def _difference(given: Any, expected: Any, path: str = "state") -> str:
    """Where pytree `given` first departs from the structure of `expected`, in words."""
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(expected)) and expected is not None:
        return f"{path} is {_describe(given)}, expected an array"
    if type(given) is not type(expected):
        return f"{path} is {_describe(given)}, expected {_describe(expected)}"
    if dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            mine, theirs = getattr(given, field.name), getattr(expected, field.name)
            if jax.tree.structure(mine) != jax.tree.structure(theirs):
                return _difference(mine, theirs, f"{path}.{field.name}")
    return f"{path} is {jax.tree.structure(given)}, expected {jax.tree.structure(expected)}"


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

    #: The id `make` knows this class by (`"CartPole-v1"`), set in each environment's own class;
    #: `registry.register` sets it on a user's class that has none. `name` reads it.
    env_id: str | None = None

    def __init_subclass__(cls, **kwargs: Any):
        """Adapts a subclass whose `reset_env` / `step_env` are gymnax's raw methods (its own,
        or a mixin's): each is wrapped once, in the class that brings it, by popeval's public
        method (parameter defaults, the state check, the eager dispatch, the action rule, the time
        limit and `info`). The wrapper calls that raw method itself, so `super().step_env(...)`
        inside it reaches the parent's public method, as in gymnax."""
        super().__init_subclass__(**kwargs)
        for name, adapt in (("reset_env", _public_reset_env), ("step_env", _public_step_env)):
            method = getattr(cls, name)
            if not getattr(method, "_popeval_public", False):
                setattr(cls, name, adapt(method))

    # ----------------------------------------------------------------- to implement
    @property
    def default_params(self) -> Any:
        """The environment's default `EnvParams`; gymnax's base gives `EnvParams()` too."""
        return EnvParams()

    def reset_state(self, key: jax.Array, params: Any) -> Any:
        if _overrides(type(self), "reset_env"):
            return self.reset_env(key, params)[1]
        raise NotImplementedError(f"{type(self).__name__} defines neither reset_state nor reset_env")

    def transition(self, key: jax.Array, state: Any, action: Any, params: Any):
        """One raw step: returns `(next_state, reward, terminated)`; `time` is handled here."""
        raise NotImplementedError(f"{type(self).__name__} defines neither transition nor step_env")

    def get_obs(self, state: Any, params: Any = None, key: jax.Array | None = None) -> Any:
        raise NotImplementedError

    def observation_space(self, params: Any = None) -> spaces.Space:
        raise NotImplementedError

    def action_space(self, params: Any = None) -> spaces.Space:
        raise NotImplementedError

    # ----------------------------------------------------------------- gymnax's helpers
    def observe(self, key: jax.Array, state: Any, action: Any, params: Any) -> Any:
        """The observation of `state` (gymnax 1.0's keyed hook): `get_obs(state, params, key)`."""
        del action
        return self.get_obs(state, params=params, key=key)

    def is_terminated(self, state: Any, params: Any) -> jax.Array:
        """Whether `state` ends the episode naturally (time limits aside); a subclass defines it."""
        raise NotImplementedError(f"{type(self).__name__} does not define is_terminated")

    def is_terminal(self, state: Any, params: Any) -> jax.Array:
        """gymnax's older name for the natural end of an episode: `is_terminated`."""
        return self.is_terminated(state, params)

    def discount(self, state: Any, params: Any) -> jax.Array:
        """0.0 in a terminal state, else 1.0 (gymnax's helper, from `is_terminal`)."""
        return jax.lax.select(jnp.asarray(self.is_terminal(state, params), jnp.bool_), 0.0, 1.0)

    def is_truncated(self, state: Any, params: Any) -> jax.Array:
        """Whether `state` has reached the episode limit (the step that reaches it truncates)."""
        return state.time >= params.max_steps_in_episode

    # ----------------------------------------------------------------- shared API
    @property
    def name(self) -> str:
        """The class's own `env_id` (a subclass does not inherit it), else the class name."""
        return vars(type(self)).get("env_id") or type(self).__name__

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

    def _jitted(self, name: Any, fn: Any = None):
        """`jax.jit` of `fn` (default: the method `name`), built once per environment object."""
        cache = self.__dict__.setdefault("_jit_cache", {})
        if name not in cache:
            cache[name] = jax.jit(getattr(self, name) if fn is None else fn)
        return cache[name]

    def _params(self, params: Any) -> Any:
        default = self.default_params
        if params is None:
            return default
        if _overrides(type(self), "default_params") and type(params) is not type(default):
            raise TypeError(
                f"{self.name}: params is a {type(params).__module__}.{type(params).__qualname__}, "
                f"expected this environment's {type(default).__qualname__} "
                f"(from {type(default).__module__}); get it from make({self.name!r})"
            )
        return params

    def _check_state(self, state: Any, params: Any) -> None:
        """Refuses a state that is not this environment's (another environment's, `None`, one
        with a field missing): its pytree structure must be a reset state's. Runs at trace time
        (structure only) and names the first field that differs."""
        cache = self.__dict__.setdefault("_jit_cache", {})
        if "reset state" not in cache:
            cache["reset state"] = jax.eval_shape(lambda k, p: self.reset_env(k, p)[1], jax.random.key(0), params)
        expected = cache["reset state"]
        if jax.tree.structure(state) != jax.tree.structure(expected):
            raise TypeError(f"{self.name}: {_difference(state, expected)}; a state must have the structure "
                            f"of what this environment's reset or step returned")

    @_public
    def reset_env(self, key: jax.Array, params: Any = None):
        """Raw reset: `(obs, state)` of a fresh episode."""
        params = self._params(params)
        if not _traced((key, params)):
            return self._jitted("_reset_env")(key, params)
        return self._reset_env(key, params)

    @_public
    def step_env(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        """Raw step without auto-reset: `(obs, state, reward, done, info)`."""
        params = self._params(params)
        self._check_state(state, params)
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
        self._check_state(state, params)
        if not _traced((key, state, action, params)):
            return self._jitted("_step")(key, state, action, params)
        return self._step(key, state, action, params)

    # ----------------------------------------------------------------- traced bodies
    def _reset_env(self, key: jax.Array, params: Any):
        if not _overrides(type(self), "reset_state"):
            raise NotImplementedError(f"{type(self).__name__} defines neither reset_state nor reset_env")
        state = self.reset_state(key, params)
        return self.get_obs(state, params, key), state

    def _step_env(self, key: jax.Array, state: Any, action: Any, params: Any):
        next_state, reward, terminated = self.transition(key, state, self._action(action, params), params)
        next_state = next_state.replace(time=state.time + 1)
        return self._finish_step(self.get_obs(next_state, params, key), next_state, reward, terminated, {}, params)

    def _action(self, action: Any, params: Any) -> Any:
        """`action` checked against the action space and, for `Discrete`, clipped into it (the
        module docstring's rule); unchecked where the class defines no action space, as in gymnax."""
        try:
            space = self.action_space(params)
        except NotImplementedError:
            return action
        action = space.check_action(action, self.name)
        if self.clip_discrete_actions and isinstance(space, spaces.Discrete):
            action = jnp.clip(action, 0, space.n - 1)
        return action

    def _finish_step(self, obs: Any, next_state: Any, reward: Any, done: Any, info: dict, params: Any):
        """popeval's `(obs, state, reward, done, info)` from a raw step's. `done` is terminal
        unless `info` (a parent's `step_env`, reached through `super()`) says it is truncated;
        the time limit truncates."""
        done = jnp.asarray(done, dtype=jnp.bool_)
        natural = jnp.asarray(info.get("terminated", True), jnp.bool_) | ~jnp.asarray(info.get("truncated", False))
        terminated = done & natural
        truncated = jnp.asarray(self.is_truncated(next_state, params), dtype=jnp.bool_) | (done & ~terminated)
        info = {
            **info,
            "terminated": terminated,
            "truncated": truncated,
            "discount": 1.0 - terminated.astype(jnp.float32),
        }
        return obs, next_state, jnp.asarray(reward, jnp.float32), terminated | truncated, info

    def _step(self, key: jax.Array, state: Any, action: Any, params: Any):
        key_step, key_reset = jax.random.split(key)
        obs_st, state_st, reward, done, info = self.step_env(key_step, state, action, params)
        obs_re, state_re = self.reset_env(key_reset, params)
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), state_re, state_st)
        obs = jax.tree.map(lambda r, s: jnp.where(done, r, s), obs_re, obs_st)
        return obs, state, reward, done, {**info, "final_observation": obs_st}


def _overrides(cls: type, name: str) -> bool:
    """Whether `cls` replaces `Environment`'s attribute `name` (its own, a parent's or a mixin's)."""
    return getattr(cls, name) is not getattr(Environment, name)


def _public_reset_env(raw):
    """popeval's public `reset_env` around a gymnax-way raw `reset_env` (see `__init_subclass__`)."""

    @functools.wraps(raw)
    def reset_env(self, key: jax.Array, params: Any = None):
        params = self._params(params)
        body = functools.partial(raw, self)
        if not _traced((key, params)):
            return self._jitted(("reset_env", raw), body)(key, params)
        return body(key, params)

    return _public(reset_env)


def _public_step_env(raw):
    """popeval's public `step_env` around a gymnax-way raw `step_env` (see `__init_subclass__`)."""

    def body(self, key, state, action, params):
        obs, next_state, reward, done, info = raw(self, key, state, self._action(action, params), params)
        return self._finish_step(obs, next_state, reward, done, dict(info), params)

    @functools.wraps(raw)
    def step_env(self, key: jax.Array, state: Any, action: Any, params: Any = None):
        params = self._params(params)
        self._check_state(state, params)
        if not _traced((key, state, action, params)):
            return self._jitted(("step_env", raw), functools.partial(body, self))(key, state, action, params)
        return body(self, key, state, action, params)

    return _public(step_env)
