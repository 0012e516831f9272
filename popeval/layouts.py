"""How the `(P, [M,] B)` episodes of a population are laid out for XLA.

- **Shared** (`over_episodes`): nested `vmap`s over members, env-param sets and episodes; a
  member's episodes share its parameters (batched matmuls, least memory). The fitness path
  steps the whole batch until every episode is done (`shared_fitness`).
- **Flat** (`flat_trajectories`, `compacted_fitness`): the episodes flattened to `N`, each
  with its own copy of its member's parameters. The fitness path gathers the still-running
  episodes into batches of N/4, N/16, ... as episodes end, so short episodes stop costing.

Each layout is bit-exact between its trajectory and fitness paths (the same `Episode` step
under the same vmaps). The two layouts are not bit-identical to each other on CPUs with FMA:
XLA contracts multiply-adds differently per layout, and chaotic episodes (a balancing
CartPole) amplify the last bit.

`varies` strings name, per argument, the levels it has an axis for, outermost first: `"PMB"`
per episode (keys, carries), `"P"` per member (parameters), `"M"` per env-param set, `""`
shared. Without an env-param batch (`meta=False`) the `M` level does not exist.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from popeval import keys as keys_lib
from popeval.episode import Carry, Episode

__all__ = ["over_episodes", "flat_episodes", "flat_trajectories", "shared_fitness", "compacted_fitness",
           "stage_sizes"]


def over_episodes(fn: Callable, meta: bool, varies: tuple[str, ...]) -> Callable:
    """`fn` vmapped over the episode grid `(P, [M,] B)` (see the module docstring)."""
    levels = "PMB" if meta else "PB"
    for level in reversed(levels):
        fn = jax.vmap(fn, in_axes=tuple(0 if level in v else None for v in varies))
    return fn


def flat_episodes(keys, env_params, meta: bool):
    """Flattens `(P, [M,] B)` episodes to `N`: `(batch_shape, keys (N,), member (N,),
    env_index (N,) or None)`; episode `n` plays member `member[n]`."""
    batch_shape = keys_lib.key_batch_shape(keys)
    if meta:
        m = jax.tree.leaves(env_params)[0].shape[0]
        batch_shape = (batch_shape[0], m, batch_shape[-1])
        keys = jnp.broadcast_to(keys[:, None], (keys.shape[0], m) + keys.shape[1:])
    n = 1
    for d in batch_shape:
        n *= d
    grid = jnp.indices(batch_shape).reshape(len(batch_shape), n)
    member, env_index = grid[0], (grid[1] if meta else None)
    keys = keys.reshape((n,) + keys.shape[len(batch_shape):])
    return batch_shape, keys, member, env_index


def flat_trajectories(single: Callable, keys, pop_params, env_params, obs_stats, meta: bool):
    """`single(key, params, env_params, obs_stats)` over the flat layout, reshaped to `(P, [M,] B, ...)`."""
    batch_shape, keys, member, env_index = flat_episodes(keys, env_params, meta)
    params = jax.tree.map(lambda x: x[member], pop_params)
    env_p = jax.tree.map(lambda x: x[env_index], env_params) if meta else env_params
    out = jax.vmap(single, in_axes=(0, 0, 0 if meta else None, None))(keys, params, env_p, obs_stats)
    return jax.tree.map(lambda x: x.reshape(batch_shape + x.shape[1:]), out)


def _fitness_step(episode: Episode):
    def step(t, key_episode, carry, policy_params, env_params, obs_stats):
        return episode.step(t, key_episode, carry, policy_params, env_params, obs_stats, False)[0]

    return step


def _run_while(num_steps: int, t, carry: Carry, step: Callable, size_next: int, *args):
    """Steps `carry` until `num_steps` steps or at most `size_next` episodes alive."""
    def cond(loop):
        t, c = loop
        return (t < num_steps) & (jnp.sum(c.alive) > size_next)

    def body(loop):
        t, c = loop
        key_episode, params, env_params, obs_stats = args
        return t + 1, step(t, key_episode, c, params, env_params, obs_stats)

    return jax.lax.while_loop(cond, body, (t, carry))


def shared_fitness(episode: Episode, num_steps: int, keys, pop_params, env_params, obs_stats, meta: bool) -> Carry:
    """The final `(P, [M,] B)` carries, stepping the shared layout until every episode is done."""
    carry, key_episode = over_episodes(episode.init, meta, ("PMB", "M"))(keys, env_params)
    step = over_episodes(_fitness_step(episode), meta, ("", "PMB", "PMB", "P", "M", ""))
    _, carry = _run_while(num_steps, jnp.int32(0), carry, step, 0, key_episode, pop_params, env_params, obs_stats)
    return carry


def stage_sizes(num_episodes: int) -> list[int]:
    """Batch sizes of the compaction stages: N, N/4, N/16, ... (not below 64)."""
    sizes = [num_episodes]
    while sizes[-1] // 4 >= 64:
        sizes.append(sizes[-1] // 4)
    return sizes


def compacted_fitness(episode: Episode, num_steps: int, keys, pop_params, env_params, obs_stats,
                      meta: bool) -> Carry:
    """The final `(P, [M,] B)` carries, running the live episodes in ever smaller batches.

    Once at most N/4 episodes are alive, the live ones (padded with finished ones) are
    gathered into a batch of N/4, and so on down to the last stage; results are scattered
    back. Every stage runs the same vmapped step, so results do not depend on the batch an
    episode is in.
    """
    batch_shape, keys, member, env_index = flat_episodes(keys, env_params, meta)
    n = keys.shape[0]
    env_axis = 0 if meta else None
    init = jax.vmap(episode.init, in_axes=(0, env_axis))
    step = jax.vmap(_fitness_step(episode), in_axes=(None, 0, 0, 0, env_axis, None))
    origin = jnp.arange(n)
    sizes = stage_sizes(n)
    t, result, key_flat = jnp.int32(0), None, None
    for j, size in enumerate(sizes):
        if j == 0:
            params = jax.tree.map(lambda x: x[member], pop_params)
            env_p = jax.tree.map(lambda x: x[env_index], env_params) if meta else env_params
            current, key_flat = init(keys, env_p)
            result = current
        else:
            # Live episodes first (stable), then finished ones as padding.
            order = jnp.argsort(~current.alive, stable=True)[:size]
            origin = origin[order]
            current = jax.tree.map(lambda x: x[order], current)
            params = jax.tree.map(lambda x: x[member[origin]], pop_params)
            env_p = jax.tree.map(lambda x: x[env_index[origin]], env_params) if meta else env_params
        size_next = sizes[j + 1] if j + 1 < len(sizes) else 0
        t, current = _run_while(num_steps, t, current, step, size_next, key_flat[origin], params, env_p, obs_stats)
        result = jax.tree.map(lambda r, c: r.at[origin].set(c), result, current)
    return jax.tree.map(lambda x: x.reshape(batch_shape + x.shape[1:]), result)
