"""Every PRNG key popeval derives, in one place.

    key = run_key(seed, GENERATION)              # a named stream of a run
    keys = member_keys(episode_keys, members, common=True)   # (P, B): one key per episode
    key_reset, key_episode = split_episode(key)              # one episode's two keys
    key_policy, key_env = step_keys(key_episode, t)          # step t of an episode

Streams. A run's randomness comes from `jax.random.key(seed)` folded with a stream number,
so that drawing more from one stream never shifts another: the policy's initial
parameters use the seed's key itself, the strategy's initial state the `INIT` stream,
generation `g` the `GENERATION` stream folded with `g`, evaluation `i` the `EVALUATION`
stream folded with `i`, and the run's final evaluation `EVALUATION` folded with
`FINAL_EVALUATION`. The numbers are part of every saved run's results: never change them.

Episodes. An episode key splits into a reset key and an episode key; step `t` folds `t`
into the episode key and splits the result into a policy key and an environment key, so
per-step keys cost nothing when nothing uses them (XLA drops the dead derivations).

Common random numbers. With `common=True` every member plays the same `B` episodes
(`keys[b]`); otherwise member `p` (its global index in the population, never its place on
a device) plays `fold_in(keys[b], p)`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from popeval.environments import prng
from popeval.environments.prng import from_raw, is_typed_key, to_raw

__all__ = [
    "INIT",
    "GENERATION",
    "EVALUATION",
    "FINAL_EVALUATION",
    "run_key",
    "generation_keys",
    "evaluation_keys",
    "member_keys",
    "split_episode",
    "step_keys",
    "key_batch_shape",
    "is_typed_key",
    "to_raw",
    "from_raw",
]

#: Stream of the strategy's initial state (the policy's initial parameters use the seed's key).
INIT = 1
#: Stream of the generations: generation `g` folds `g` into it.
GENERATION = 2
#: Stream of the evaluations of the mean and best policies: evaluation `i` folds `i` into it.
EVALUATION = 3
#: The evaluation index of a run's final evaluation (after its last generation).
FINAL_EVALUATION = 10**6


def run_key(seed: jax.Array | int, stream: int | None = None) -> jax.Array:
    """The key of a run (`stream=None`) or of one of its named streams."""
    key = jax.random.key(seed)
    return key if stream is None else jax.random.fold_in(key, stream)


def generation_keys(seed: jax.Array | int, generation: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """`(key_ask, key_eval)` of one generation."""
    key = jax.random.fold_in(run_key(seed, GENERATION), generation)
    key_ask, key_eval = jax.random.split(key)
    return key_ask, key_eval


def evaluation_keys(seed: jax.Array | int, index: jax.Array | int, num_episodes: int) -> jax.Array:
    """The `(num_episodes,)` episode keys of evaluation `index` (`FINAL_EVALUATION` at the end)."""
    return jax.random.split(jax.random.fold_in(run_key(seed, EVALUATION), index), num_episodes)


def member_keys(keys: jax.Array, members: jax.Array, common: bool) -> jax.Array:
    """`(P, B)` episode keys for the members `members` (global indices, `(P,)`) from `(B,)` keys."""
    if common:
        return jnp.broadcast_to(keys, members.shape + keys.shape)
    return jax.vmap(lambda p: jax.vmap(lambda k: jax.random.fold_in(k, p))(keys))(members)


def split_episode(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(key_reset, key_episode)` of one episode."""
    key_reset, key_episode = jax.random.split(key)
    return key_reset, key_episode


def step_keys(key_episode: jax.Array, t: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """`(key_policy, key_env)` of step `t` of an episode: `jax.random.split(jax.random.fold_in(
    key_episode, t))`, derived with `popeval.environments.prng` (the same keys, fused by XLA
    instead of run as loops on CPUs)."""
    key_policy, key_env = prng.split(prng.fold_in(key_episode, t))
    return key_policy, key_env


def key_batch_shape(keys: Any, what: str = "keys") -> tuple[int, ...]:
    """The batch shape of an array of keys (typed `jax.random.key`s or raw `PRNGKey`s)."""
    keys = jnp.asarray(keys) if not isinstance(keys, jax.Array) else keys
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        return tuple(keys.shape)
    if keys.dtype == jnp.uint32 and keys.ndim >= 1 and keys.shape[-1] == 2:
        return tuple(keys.shape[:-1])
    raise ValueError(
        f"{what}: expected PRNG keys (jax.random.key or PRNGKey arrays), got an array of "
        f"shape {keys.shape} and dtype {keys.dtype}"
    )
