"""How the `(P, [M,] B)` episodes of a population are laid out for XLA.

Members run in **chunks** of a fixed shape: `C` members with all their episodes, `C` chosen
from the episodes per member (`chunk_members`: about `Layout.chunk_episodes` episodes per
chunk) and, for a population smaller than that, the power of two that holds its members (on
this device), so a small population or an evaluation of two policies is not padded to a full
chunk. The `Layout` depends on the device (`for_platform`): on a CPU chunks of about 256
episodes that stay in cache, the exit condition checked after every step; on a GPU or TPU the
device's whole population in one chunk, the condition checked every 8 steps.
Inside a chunk, nested `vmap`s over members, env-param sets and episodes (`over_episodes`)
let a member's episodes share its parameters: its policy runs as one batched matmul per
layer, and no parameters are copied per episode.
The population is padded to a multiple of `C` (padding members are finished from the start).

Every step of every episode is computed by the same code on shapes that differ only in the
number of members side by side, so an episode's result does not depend on the other members
or on where a member sits in the population, and the trajectory path (`trajectories`: each
chunk scans `T` steps) equals the fitness path (`fitness`) to the bit. That XLA:CPU rounds an
episode the same at every chunk width it runs at (from `MIN_WIDTH` members up, each width a
multiple of `LANES` episodes), whatever the population size, is measured, not promised by XLA:
`tests/engine/test_rollout.py` checks it on every registered environment (README, Exactness).

The fitness path runs in passes. A pass orders the members that still have a running
episode first (compaction), those that have taken the fewest steps first, so that members
which run long finish together rather than one after another in a mostly empty chunk. It
steps each chunk of them in a `lax.while_loop` until an eighth of its members are done (a
single chunk: until its survivors fit the next width), then the next pass packs the
survivors again; once they fit in half a chunk they run in a chunk of that width (`widths`)
until done, so finished members stop costing (a chunk checks whether it may stop every
`Layout.steps_per_check` steps; finished episodes ride along masked, so steps past the
check's point change nothing). Parameters and episode keys are only read: a
chunk gathers its members' rows once and steps them many times, and writes back their
carries and step counts (each member carries its own step count).

`varies` strings name, per argument, the levels it has an axis for, outermost first: `"PMB"`
per episode (keys, carries), `"P"` per member (parameters), `"M"` per env-param set, `""`
shared. Without an env-param batch (`meta=False`) the `M` level does not exist. An argument's
`varies` may also be a pytree of strings, a prefix of the argument's.

`Members` says what a chunk makes of its members' rows of `pop_params` (each leaf with the
member axis first) once it has gathered them: explicit parameters are read as they are; a
low-rank population's rows are its factors or member indices, from which the chunk draws its
members (`popeval.low_rank.members`: nothing the size of the whole population's perturbations
exists) into parameters whose mean has no member axis (`Members.varies`, a pytree of strings),
so every episode of the chunk reads the same mean and `vmap` computes a layer's product with it
for all of them at once; there every width holds at least `SHARED_EPISODES` episodes (the
product's rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from popeval import keys as keys_lib
from popeval.episode import Carry, Episode

__all__ = ["Layout", "CPU", "ACCELERATOR", "for_platform", "over_episodes", "episode_keys", "chunk_members",
           "trajectories", "fitness", "CHUNK_EPISODES", "Members", "EXPLICIT"]


class Layout(NamedTuple):
    """How one device steps its members' episodes (`for_platform` picks it)."""

    chunk_episodes: int | None  # about this many episodes per chunk; None: all members in one chunk
    # (of the power of two members that holds them, like a population smaller than a chunk)
    steps_per_check: int  # steps a chunk takes between two checks of whether it may stop


#: About this many episodes run side by side in one chunk on a CPU: enough for the step's fixed
#: costs to be small next to its work, few enough that the members which run long end up in
#: narrow chunks (experiments/README.md, "Chunk width").
CHUNK_EPISODES = 256
#: XLA:CPU compiles a chunk's step for its shape, and not every shape rounds alike; widths that
#: hold a multiple of `LANES` episodes (one vector register of float32s) agreed at every width
#: tried (experiments/README.md, "Chunk width").
LANES = 16
#: CPUs: cache-sized chunks, and a check after every step (a reduction on the same core,
#: cheap next to the step).
CPU = Layout(CHUNK_EPISODES, 1)
#: GPUs and TPUs: one chunk (wide kernels, no chunk after chunk), and a check every 8 steps:
#: the host reads a dynamic loop's exit condition back at each iteration, which costs more
#: than a step (experiments/README.md, "Chunk width").
ACCELERATOR = Layout(None, 8)


def for_platform(platform: str) -> Layout:
    """The layout for devices of `platform` (`jax.Device.platform`: "cpu", "gpu", "tpu"...)."""
    return CPU if platform == "cpu" else ACCELERATOR


def over_episodes(fn: Callable, meta: bool, varies: tuple[Any, ...]) -> Callable:
    """`fn` vmapped over the episode grid `(P, [M,] B)` (see the module docstring)."""
    levels = "PMB" if meta else "PB"
    for level in reversed(levels):
        fn = jax.vmap(fn, in_axes=tuple(jax.tree.map(lambda s, lv=level: 0 if lv in s else None, v) for v in varies))
    return fn


def _as_they_are(rows: Any) -> Any:
    return rows


class Members(NamedTuple):
    """How a chunk reads its members (see the module docstring): `of(rows)` turns the chunk's
    rows of `pop_params` into the parameters its step reads, whose parts vary as `varies`."""

    of: Callable = _as_they_are
    varies: Any = "P"


#: Explicit parameters, every leaf per member.
EXPLICIT = Members()


def episode_keys(keys, env_params, meta: bool):
    """The `(P, B)` episode keys on the grid `(P, [M,] B)`: every env-param set plays the same
    `B` episodes."""
    if not meta:
        return keys
    m = jax.tree.leaves(env_params)[0].shape[0]
    return jnp.broadcast_to(keys[:, None], (keys.shape[0], m) + keys.shape[1:])


def chunk_members(episodes_per_member: int, num_members: int | None = None,
                  chunk_episodes: int | None = CHUNK_EPISODES, min_episodes: int = 0) -> int:
    """Members per chunk for `num_members` members with `episodes_per_member` episodes
    (`M x B`) each: `chunk_episodes // episodes_per_member`, or, for a smaller population,
    the power of two that holds it (so a small population is not padded to a full chunk,
    and population sizes share few chunk shapes). `chunk_episodes=None`: no cap, the power of
    two that holds all `num_members` (one chunk). Every width holds a multiple of `LANES`
    episodes (3 episodes a member: 16 members at least), and at least `min_episodes`
    (`SHARED_EPISODES` for a low-rank population)."""
    size = None if chunk_episodes is None else max(1, chunk_episodes // episodes_per_member)
    if num_members is not None and (size is None or num_members < size):
        size = 1 << max(0, num_members - 1).bit_length()
    elif size is None:
        raise ValueError("chunk_episodes=None (one chunk) needs num_members")
    unit = LANES // math.gcd(episodes_per_member, LANES)  # members whose episodes fill whole vectors
    size = max(unit, size - size % unit, -(-min_members(episodes_per_member, min_episodes) // unit) * unit)
    if size // 2 >= narrowest(episodes_per_member, min_episodes) and (size // 2) % unit:  # the half width too
        size = max(2 * unit, size - size % (2 * unit))
    return size


def min_members(episodes_per_member: int, min_episodes: int) -> int:
    """The fewest members whose episodes make `min_episodes`."""
    return -(-min_episodes // episodes_per_member)


def narrowest(episodes_per_member: int, min_episodes: int = 0) -> int:
    """The narrowest chunk width (members) the fitness path narrows down to (`widths`):
    `MIN_WIDTH`, or more to hold `min_episodes`."""
    return max(MIN_WIDTH, min_members(episodes_per_member, min_episodes))


def _min_episodes(members: Members) -> int:
    """The episodes a chunk must hold: `SHARED_EPISODES` where parameters are shared by its
    members (a low-rank population's mean), else no minimum."""
    return SHARED_EPISODES if any("P" not in v for v in jax.tree.leaves(members.varies)) else 0


def _chunked(keys, pop_params, layout: Layout, members: Members = EXPLICIT):
    """`(C, num_chunks, keys, pop_params)`: `C = chunk_members(...)` for the `(P, ...)` episodes
    of `keys` (typed or raw), both padded to `num_chunks * C` members (repeating the last)."""
    num_members = keys.shape[0]
    size = chunk_members(math.prod(keys_lib.key_batch_shape(keys)[1:]), num_members, layout.chunk_episodes,
                         _min_episodes(members))
    num_chunks = -(-num_members // size)
    pad = num_chunks * size - num_members
    if pad:
        keys, pop_params = jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]),
                                        (keys, pop_params))
    return size, num_chunks, keys, pop_params


def trajectories(single: Callable, keys, pop_params, env_params, obs_stats, meta: bool, layout: Layout = CPU,
                 members: Members = EXPLICIT):
    """`single(key, params, env_params, obs_stats)` over `(P, [M,] B)`, chunk by chunk
    (`members`: how a chunk reads its rows of `pop_params`, see the module docstring)."""
    keys = episode_keys(keys, env_params, meta)
    num_members = keys.shape[0]
    size, num_chunks, keys, pop_params = _chunked(keys, pop_params, layout, members)
    fn = over_episodes(single, meta, ("PMB", members.varies, "M", ""))
    split = lambda x: x.reshape((num_chunks, size) + x.shape[1:])  # noqa: E731
    out = jax.lax.map(lambda c: fn(c[0], members.of(c[1]), env_params, obs_stats),
                      jax.tree.map(split, (keys, pop_params)))
    return jax.tree.map(lambda x: x.reshape((num_chunks * size,) + x.shape[2:])[:num_members], out)


def _running(alive: jax.Array) -> jax.Array:
    """`(P,)`: whether each member still has a running episode."""
    return jnp.any(alive.reshape(alive.shape[0], -1), axis=1)


#: The narrowest chunk (members) the fitness path narrows down to. XLA:CPU computes an episode
#: to the same bits at every width from 8 members up; below, the matmuls of small policies
#: can round differently (CartPole with 8 hidden units at 4 members, `tests/engine/test_rollout.py`).
MIN_WIDTH = 8


#: The fewest episodes in a chunk of a low-rank population. Its layers multiply the shared mean
#: with all of a chunk's episodes at once, and XLA:CPU rounds a row of a matrix product the same
#: at every row count from 64 up but not below (another kernel): measured, checked by
#: `tests/engine/test_low_rank.py`.
SHARED_EPISODES = 64


def widths(size: int, compaction: bool = True, narrowest_width: int = MIN_WIDTH) -> tuple[int, ...]:
    """The chunk widths (members) the fitness path steps: `size`, and with compaction
    `size // 2` (if at least `narrowest_width`, `narrowest`), so the last running members do
    not ride in a full chunk. Each width compiles its own copy of the step, hence two."""
    return (size, size // 2) if compaction and size // 2 >= narrowest_width else (size,)


class _Passes(NamedTuple):
    """What the passes of one `fitness` call read: the chunk layout, and the step with its
    read-only inputs (each chunk gathers its members' rows of these)."""

    step: Callable  # one step of a chunk's episodes: `over_episodes` of `Episode.step`
    key_episode: Any  # (P', [M,] B) episode keys, P' = num_chunks * size
    pop_params: Any  # (P', ...) the members' rows
    members: Members  # what a chunk makes of its rows
    env_params: Any
    num_steps: int
    steps_per_check: int
    size: int  # members in a full chunk
    num_chunks: int
    ladder: tuple[int, ...]  # `widths(size, compaction)`
    compaction: bool


def fitness(episode: Episode, num_steps: int, keys, pop_params, env_params, obs_stats, meta: bool,
            compaction: bool = True, layout: Layout = CPU, members: Members = EXPLICIT) -> Carry:
    """The final `(P, [M,] B)` carries, each episode stepped until done or `num_steps`
    (`members`: how a chunk reads its rows of `pop_params`, see the module docstring)."""
    compaction = compaction and num_steps > 1  # one-step episodes cannot end early: no passes
    keys = episode_keys(keys, env_params, meta)
    num_members = keys.shape[0]
    size, num_chunks, keys, pop_params = _chunked(keys, pop_params, layout, members)
    init = over_episodes(episode.init, meta, ("PMB", "M"))
    # Every member's reset in one vmap, not chunk by chunk: a `lax.map` of one chunk is inlined
    # and XLA:CPU contracted the reset's multiply-adds (Acrobot's uniform draws) differently
    # than in a loop of several, so a member's episode depended on the population size.
    carry, key_episode = init(keys, env_params)
    padding = jnp.arange(num_chunks * size) >= num_members
    carry = carry._replace(alive=carry.alive & ~padding.reshape((-1,) + (1,) * (carry.alive.ndim - 1)))
    step = over_episodes(partial(_step_unfrozen, episode, obs_stats), meta, ("P", "PMB", "PMB", members.varies, "M"))
    ladder = widths(size, compaction, narrowest(math.prod(keys_lib.key_batch_shape(keys)[1:]),
                                                _min_episodes(members)))
    passes = _Passes(step, key_episode, pop_params, members, env_params, num_steps, layout.steps_per_check,
                     size, num_chunks, ladder, compaction)
    order = jnp.arange(num_chunks * size, dtype=jnp.int32)
    t = jnp.zeros(num_chunks * size, jnp.int32)
    _, _, carry = jax.lax.while_loop(lambda s: jnp.any(_live(passes, s[1], s[2])), partial(_one_pass, passes),
                                     (order, t, carry))
    return jax.tree.map(lambda x: x[:num_members], carry)


def _step_unfrozen(episode: Episode, obs_stats, t, key_episode, c, params, env_params) -> Carry:
    """One step of one episode on the fitness path (nothing stored, so no freezing)."""
    return episode.step(t, key_episode, c, params, env_params, obs_stats, False)[0]


def _live(passes: _Passes, t, carry) -> jax.Array:
    """`(P',)`: whether each member still has a running episode within its `num_steps`."""
    return _running(carry.alive) & (t < passes.num_steps)


def _one_pass(passes: _Passes, state):
    """Runs one pass over the members (see the module docstring); `state` is `(order, t, carry)`."""
    order, t, carry = state
    if not passes.compaction:  # every chunk in place, until it is done
        return jax.lax.fori_loop(0, passes.num_chunks, partial(_run_chunk, passes, passes.size, 0), state)
    running = _live(passes, t, carry)
    # Running members first, fewest steps taken first, then population order (no sort
    # while that is the population order, as in the first pass).
    steps = jnp.where(running, t, jnp.iinfo(jnp.int32).max)
    order = jax.lax.cond(jnp.all(steps[:-1] <= steps[1:]), lambda s: jnp.arange(s.shape[0], dtype=jnp.int32),
                         lambda s: jnp.argsort(s, stable=True).astype(jnp.int32), steps)
    count = jnp.sum(running)
    # The narrowest width that holds every running member (or full chunks).
    level = jnp.sum(jnp.asarray(passes.ladder[1:]) >= count)
    branches = [partial(_pass_at_width, passes, k, count) for k in range(len(passes.ladder))]
    return jax.lax.switch(level, branches, (order, t, carry))


def _pass_at_width(passes: _Passes, k: int, count, state):
    """A pass in chunks of width `ladder[k]` over the `count` running members: several chunks
    each run until an eighth of their members are done, a single chunk until its survivors fit
    the next width (the next pass packs them into it), the narrowest until done."""
    width = passes.ladder[k]
    last = k == len(passes.ladder) - 1
    chunks = -(-count // width)
    floor = jnp.where(chunks <= 1, 0 if last else passes.ladder[k + 1], (7 * width) // 8)
    return jax.lax.fori_loop(0, chunks, partial(_run_chunk, passes, width, floor), state)


def _run_chunk(passes: _Passes, width: int, floor, i, state):
    """Steps the members `order[i * width:(i + 1) * width]` until at most `floor` of them run.
    Parameters and keys are only read (gathered per chunk, the parameters made from their rows
    once per chunk, `Members.of`); the members' step counts and carries are gathered and
    written back."""
    order, t, carry = state
    idx = jax.lax.dynamic_slice_in_dim(order, i * width, width)
    take = lambda x: x[idx]  # noqa: E731
    c_t, c_carry, c_keys = jax.tree.map(take, (t, carry, passes.key_episode))
    c_params = passes.members.of(jax.tree.map(take, passes.pop_params))

    def cond(loop):
        return jnp.sum(_live(passes, *loop)) > floor

    advance = partial(_advance, passes, c_keys, c_params)

    def body(loop):  # finished episodes ride along masked, so extra steps change nothing
        if passes.steps_per_check == 1:
            return advance(loop)
        return jax.lax.fori_loop(0, passes.steps_per_check, lambda _, loop: advance(loop), loop)

    c_t, c_carry = jax.lax.while_loop(cond, body, (c_t, c_carry))
    put = lambda buf, x: buf.at[idx].set(x, unique_indices=True)  # noqa: E731
    return order, put(t, c_t), jax.tree.map(put, carry, c_carry)


def _advance(passes: _Passes, c_keys, c_params, loop):
    """One step of a chunk: `(t, carry) -> (t + 1, carry)`."""
    t, c = loop
    # A member that has taken its num_steps steps rides along (its slot is in the chunk) but
    # stops counting: its episodes are over.
    within = (t < passes.num_steps).reshape((-1,) + (1,) * (c.alive.ndim - 1))
    return t + 1, passes.step(t, c_keys, c._replace(alive=c.alive & within), c_params, passes.env_params)
