"""How the `(P, [M,] B)` episodes of a population are laid out for XLA.

One layout: nested `vmap`s over members, env-param sets and episodes (`over_episodes`), so a
member's episodes share its parameters (its policy runs as one batched matmul per layer,
and no parameters are copied per episode). The trajectory path scans `T` steps of it.

The fitness path (`fitness`) steps the batch in a `lax.while_loop` until every episode is
done. With compaction, it also shrinks the batch as members finish: once at most half of the
members in the batch still have a running episode, those members (their parameters, carries
and keys) are gathered into a batch half the size, down to about 64 episodes; results are
scattered back at the end. A stage that finds nothing alive is skipped (`lax.cond`), so
fixed-length episodes pay nothing for it. Compaction never runs more steps than the plain
loop, and every stage runs the same vmapped step on the same per-member shapes.

`varies` strings name, per argument, the levels it has an axis for, outermost first: `"PMB"`
per episode (keys, carries), `"P"` per member (parameters), `"M"` per env-param set, `""`
shared. Without an env-param batch (`meta=False`) the `M` level does not exist.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from popeval.episode import Carry, Episode

__all__ = ["over_episodes", "episode_keys", "fitness", "member_stages", "MIN_STAGE_EPISODES"]

#: Compaction stops halving the batch below this many episodes: smaller batches save
#: nothing per step on a CPU (the step's fixed costs dominate).
MIN_STAGE_EPISODES = 64


def over_episodes(fn: Callable, meta: bool, varies: tuple[str, ...]) -> Callable:
    """`fn` vmapped over the episode grid `(P, [M,] B)` (see the module docstring)."""
    levels = "PMB" if meta else "PB"
    for level in reversed(levels):
        fn = jax.vmap(fn, in_axes=tuple(0 if level in v else None for v in varies))
    return fn


def episode_keys(keys, env_params, meta: bool):
    """The `(P, B)` episode keys on the grid `(P, [M,] B)`: every env-param set plays the same
    `B` episodes."""
    if not meta:
        return keys
    m = jax.tree.leaves(env_params)[0].shape[0]
    return jnp.broadcast_to(keys[:, None], (keys.shape[0], m) + keys.shape[1:])


def member_stages(num_members: int, episodes_per_member: int) -> list[int]:
    """Members per compaction stage: P, P/2, P/4, ... while a stage keeps at least
    `MIN_STAGE_EPISODES` episodes (and one member)."""
    sizes = [num_members]
    while sizes[-1] // 2 >= 1 and (sizes[-1] // 2) * episodes_per_member >= MIN_STAGE_EPISODES:
        sizes.append(sizes[-1] // 2)
    return sizes


def _running(alive: jax.Array) -> jax.Array:
    """`(P,)`: whether each member still has a running episode."""
    return jnp.any(alive.reshape(alive.shape[0], -1), axis=1)


def fitness(episode: Episode, num_steps: int, keys, pop_params, env_params, obs_stats, meta: bool,
            compaction: bool = True) -> Carry:
    """The final `(P, [M,] B)` carries, stepping until every episode is done or `num_steps`."""
    carry, key_episode = over_episodes(episode.init, meta, ("PMB", "M"))(episode_keys(keys, env_params, meta),
                                                                      env_params)

    def step(t, key_episode, c, params, env_params):
        return episode.step(t, key_episode, c, params, env_params, obs_stats, False)[0]

    step = over_episodes(step, meta, ("", "PMB", "PMB", "P", "M"))
    num_members = carry.alive.shape[0]
    sizes = member_stages(num_members, carry.alive.size // num_members) if compaction else [num_members]

    def run(t, c, key_episode, params, size_next):
        def cond(loop):
            t, c = loop
            return (t < num_steps) & (jnp.sum(_running(c.alive)) > size_next)

        def body(loop):
            t, c = loop
            return t + 1, step(t, key_episode, c, params, env_params)

        return jax.lax.while_loop(cond, body, (t, c))

    t, current = run(jnp.int32(0), carry, key_episode, pop_params, sizes[1] if len(sizes) > 1 else 0)
    result, origin = current, jnp.arange(num_members)
    for j, size in enumerate(sizes[1:], start=1):
        size_next = sizes[j + 1] if j + 1 < len(sizes) else 0

        def stage(operands, size=size, size_next=size_next):
            t, current, origin, result = operands
            # Members with a running episode first (stable), then finished ones as padding.
            order = jnp.argsort(~_running(current.alive), stable=True)[:size]
            origin = origin[order]
            current = jax.tree.map(lambda x: x[order], current)
            params = jax.tree.map(lambda x: x[origin], pop_params)
            t, current = run(t, current, key_episode[origin], params, size_next)
            return t, current, origin, jax.tree.map(lambda r, c: r.at[origin].set(c), result, current)

        def skip(operands, size=size):
            t, current, origin, result = operands
            # Same shapes as `stage`: the first `size` slots (all finished, nothing to do).
            return t, jax.tree.map(lambda x: x[:size], current), origin[:size], result

        pending = (t < num_steps) & jnp.any(current.alive)
        t, current, origin, result = jax.lax.cond(pending, stage, skip, (t, current, origin, result))
    return result
