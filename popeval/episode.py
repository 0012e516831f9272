"""One episode of one policy, written once: reset, per-step keys, act, step, mask, normalise.

    episode = Episode(env, model_forward, obs_shape=(4,), ...)   # static configuration only
    carry, key_episode = episode.init(key, env_params)
    carry, transition = episode.step(t, key_episode, carry, policy_params, env_params,
                                     obs_stats, freeze=True)
    obs, action, reward, next_obs, done, cum_return = episode.trajectory(key, ...)

`RolloutWrapper`'s trajectory path, its fitness path and drawing a policy's episode
(`popeval.visualize`) all run these functions, so they play the very same episodes.

Semantics. The episode key splits into a reset key and an episode key, step `t` into a
policy key and an environment key (`popeval.keys`). Rollouts use the raw `step_env` (no
auto-reset): once an episode is done its rewards are masked to 0, `done` stays true and
`length` stops counting. With `freeze=True` (trajectories) the state is frozen after the
end, so observations repeat the last one; the fitness path passes `freeze=False` (nothing
is stored, the state after the end is never read). With observation normalisation the
policy sees `normalize(obs_stats, obs)` and the carry collects this episode's statistics of
the observations it acted on. Policy parameters are the policy's own, or a member of a
low-rank population (`popeval.low_rank.Member`, its forward pass `low_rank.apply`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from popeval import keys as keys_lib
from popeval import low_rank, normalization

__all__ = ["Carry", "Episode", "reset_env", "check_env"]


class Carry(NamedTuple):
    """What one running episode carries from step to step."""

    obs: Any
    state: Any
    policy_carry: Any  # the recurrent policy's state, `()` for a feed-forward policy
    ret: jax.Array  # () float32, the return so far
    length: jax.Array  # () int32, steps taken before done
    alive: jax.Array  # () bool, not done yet
    stats: Any  # this episode's ObsStats, or None without normalisation


def reset_env(env: Any, key: jax.Array, env_params: Any) -> tuple[Any, Any]:
    """`(obs, state)` of `env`'s raw reset (`reset_env`, or `reset` for other suites)."""
    reset = getattr(env, "reset_env", None) or env.reset
    return reset(key, env_params)


def step_env(env: Any, key: jax.Array, state: Any, action: Any, env_params: Any) -> tuple[Any, Any, Any, Any]:
    """`(obs, state, reward, done)` of `env`'s raw transition (`step_env`, or `step` for other
    suites; 5- or 6-tuple steps such as gymnax 1.x's), as the environment returns them."""
    step = getattr(env, "step_env", None) or env.step
    out = step(key, state, action, env_params)
    if len(out) == 6:  # gymnax >= 1.0: (obs, state, reward, terminated, truncated, info)
        obs, state, reward, terminated, truncated, _ = out
        return obs, state, reward, jnp.logical_or(terminated, truncated)
    obs, state, reward, done, _ = out
    return obs, state, reward, done


def _spec(x: Any) -> str:
    return f"{x.dtype} {tuple(x.shape)}" if hasattr(x, "shape") else type(x).__name__


def _field_differences(step: Any, reset: Any, what: str) -> list[str]:
    """Where `step_env`'s output `what` (an observation or a state) differs from `reset_env`'s
    in structure, shape or dtype, one line per field."""
    path = lambda p: what + jax.tree_util.keystr(p)  # noqa: E731
    steps, step_tree = jax.tree_util.tree_flatten_with_path(step)
    resets, reset_tree = jax.tree_util.tree_flatten_with_path(reset)
    if reset_tree != step_tree:
        return [f"step_env returns a {what} of another structure than reset_env's ({step_tree} vs {reset_tree})"]
    return [f"step_env returns {path(p)} as {_spec(a)}, reset_env as {_spec(b)}"
            for (p, a), (_, b) in zip(steps, resets)
            if (tuple(a.shape), a.dtype) != (tuple(b.shape), b.dtype)]  # a PRNG key's dtype too


def check_env(env: Any, env_params: Any, env_name: str) -> None:
    """Refuses, in one line naming the method and the field, an environment whose reset and step
    disagree (observation or state of another shape or dtype), whose reset observation does not
    have its observation space's shape, or whose reward or done is not a scalar: what would
    otherwise fail deep inside a compiled episode. Traces once (`jax.eval_shape`), runs nothing.

    Raises:
        ValueError naming `env_name`, the method and the field.
    """
    key = jax.random.key(0)
    obs, state = jax.eval_shape(partial(reset_env, env), key, env_params)
    space = env.observation_space(env_params)
    problems = []
    if hasattr(obs, "shape") and isinstance(getattr(space, "shape", None), tuple) and obs.shape != space.shape:
        problems.append(f"reset_env returns an observation of shape {tuple(obs.shape)}, but observation_space "
                        f"has shape {space.shape}")
    try:
        action = jax.eval_shape(env.action_space(env_params).sample, key)
    except (NotImplementedError, AttributeError):  # no action space (gymnax allows it): nothing to step with
        action = None
    if action is not None:
        obs1, state1, reward, done = jax.eval_shape(partial(step_env, env), key, state, action, env_params)
        problems += [f"step_env returns a {name} of shape {tuple(x.shape)}, expected a scalar ()"
                     for name, x in (("reward", reward), ("done", done)) if jnp.shape(x) != ()]
        problems += _field_differences(obs1, obs, "observation") + _field_differences(state1, state, "state")
    if problems:
        raise ValueError(f"{env_name}: " + "; ".join(problems[:4]) + ("; ..." if len(problems) > 4 else ""))


def _is_discrete(space: Any) -> bool:
    """Discrete action spaces (popeval's or another suite's) sample integers."""
    return jnp.issubdtype(jnp.dtype(space.dtype), jnp.integer)


@dataclasses.dataclass(frozen=True, eq=False)
class Episode:
    """The static configuration of an episode and its pure step functions.

    Args:
        env: an environment with the popeval/gymnax API (`reset_env`/`step_env`, or
            `reset`/`step`; 5- or 6-tuple steps such as gymnax 1.x's).
        model_forward: `(params, obs, key) -> action`, or `(params, obs, carry, key) ->
            (action, carry)` when `init_carry` is given; `None` samples random actions.
        obs_shape: the shape of one observation (for the normalisation statistics).
        init_carry: the recurrent policy's initial state, or `None`.
        obs_normalization: normalise observations with `obs_stats` and collect statistics.
        env_name: used in error messages.
    """

    env: Any
    model_forward: Callable | None
    obs_shape: tuple[int, ...]
    init_carry: Any = None
    obs_normalization: bool = False
    env_name: str = ""

    @property
    def recurrent(self) -> bool:
        return self.init_carry is not None

    # ------------------------------------------------------------ environment adapter
    def reset(self, key, env_params):
        return reset_env(self.env, key, env_params)

    def env_step(self, key, state, action, env_params):
        """`(obs, state, reward float32, done bool)` of the raw transition."""
        obs, state, reward, done = step_env(self.env, key, state, action, env_params)
        # popeval's step_env already applies the time limit; this makes external
        # environments whose raw step does not (some gymnax versions) honour it as well.
        time = getattr(state, "time", None)
        if time is not None and hasattr(env_params, "max_steps_in_episode"):
            done = jnp.logical_or(done, time >= env_params.max_steps_in_episode)
        return obs, state, jnp.asarray(reward, jnp.float32), jnp.asarray(done, jnp.bool_)

    # ------------------------------------------------------------ policy adapter
    def act(self, policy_params, obs, policy_carry, key, env_params):
        """`(action, policy_carry)`; checks the action's shape against the action space."""
        space = self.env.action_space(env_params)
        if self.model_forward is None:
            return space.sample(key), policy_carry
        signature = "(params, obs, carry, key) -> (action, carry)" if self.recurrent else "(params, obs, key) -> action"
        forward = self.model_forward
        if isinstance(policy_params, low_rank.Member):  # a member of a low-rank population
            forward = partial(low_rank.apply, forward)
        try:
            out = (forward(policy_params, obs, policy_carry, key) if self.recurrent
                   else forward(policy_params, obs, key))
        except TypeError as e:
            raise TypeError(f"popeval calls model_forward{signature} (a flax Module whose __call__ takes "
                            f"(obs, key), applied with .apply); calling it raised: {e}") from e
        if self.recurrent:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(
                    f"a recurrent model_forward(params, obs, carry, key) must return "
                    f"(action, carry), got {type(out).__name__}"
                )
            action, policy_carry = out
        else:
            action = out
        self._check_action(action, space)
        return action, policy_carry

    def _check_action(self, action, space):
        if not hasattr(action, "shape") and not isinstance(action, (int, float, bool)):
            raise ValueError(
                f"model_forward(params, obs, key) must return an action for {self.env_name} "
                f"({space}), got {type(action).__name__}"
            )
        shape, dtype = jnp.shape(action), jnp.result_type(action)
        discrete = _is_discrete(space)
        if discrete:
            ok = shape in ((), (1,)) and (jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_)
        else:
            size = 1
            for s in space.shape:
                size *= s
            ok = shape == tuple(space.shape) or (len(shape) <= 1 and jnp.size(action) == size)
            ok = ok and not (dtype == jnp.bool_)
        if not ok:
            raise ValueError(
                f"model_forward returned an action of shape {shape} and dtype {dtype}, but "
                f"{self.env_name} expects {space} (shape {tuple(space.shape)}"
                f"{', an integer dtype' if discrete else ''})"
            )

    # ------------------------------------------------------------ the episode
    def init(self, key, env_params) -> tuple[Carry, jax.Array]:
        """`(carry, key_episode)` right after the reset."""
        key_reset, key_episode = keys_lib.split_episode(key)
        obs, state = self.reset(key_reset, env_params)
        carry = Carry(
            obs=obs,
            state=state,
            policy_carry=self.init_carry if self.recurrent else (),
            ret=jnp.zeros((), jnp.float32),
            length=jnp.zeros((), jnp.int32),
            alive=jnp.ones((), jnp.bool_),
            stats=normalization.init(self.obs_shape) if self.obs_normalization else None,
        )
        return carry, key_episode

    def step(self, t, key_episode, c: Carry, policy_params, env_params, obs_stats, freeze: bool):
        """Step `t`: `(carry, (obs, action, reward, next_obs, done, state))`."""
        key_policy, key_env = keys_lib.step_keys(key_episode, t)
        x = normalization.normalize(obs_stats, c.obs) if self.obs_normalization else c.obs
        action, policy_carry = self.act(policy_params, x, c.policy_carry, key_policy, env_params)
        obs, state, reward, done = self.env_step(key_env, c.state, action, env_params)
        alive = c.alive
        reward = jnp.where(alive, reward, 0.0)
        if freeze:
            keep = lambda new, old: jnp.where(alive, new, old)  # noqa: E731
            obs = jax.tree.map(keep, obs, c.obs)
            state = jax.tree.map(keep, state, c.state)
            policy_carry = jax.tree.map(keep, policy_carry, c.policy_carry)
        stats = normalization.update(c.stats, c.obs, alive) if self.obs_normalization else None
        new = Carry(
            obs=obs,
            state=state,
            policy_carry=policy_carry,
            ret=c.ret + reward,
            length=c.length + alive.astype(jnp.int32),
            alive=alive & ~done,
            stats=stats,
        )
        return new, (c.obs, action, reward, obs, done | ~alive, state)

    def scan(self, key, policy_params, env_params, obs_stats, num_steps: int):
        """`num_steps` steps in a `lax.scan`: `(first_state, final carry, transitions)`, the
        transitions `(obs, action, reward, next_obs, done, state)` each with a leading `T`."""
        carry, key_episode = self.init(key, env_params)
        first = carry.state

        def body(c, t):
            return self.step(t, key_episode, c, policy_params, env_params, obs_stats, True)

        carry, transitions = jax.lax.scan(body, carry, jnp.arange(num_steps))
        return first, carry, transitions

    def trajectory(self, key, policy_params, env_params, obs_stats, num_steps: int):
        """`(obs, action, reward, next_obs, done, cum_return)`, each `(T, ...)` but the return."""
        _, carry, (obs, action, reward, next_obs, done, _) = self.scan(
            key, policy_params, env_params, obs_stats, num_steps)
        return obs, action, reward, next_obs, done, carry.ret
