"""Ask and tell without the whole population: the per-member form of evosax's Gaussian
strategies (`Strategy.members`, built by `make_strategy`).

For distributed evolution no device should hold the whole population (P x D floats); the
Gaussian strategies (Open_ES, SNES, PGPE) need not:

    solutions = strategy.members.sample(state, key, members)   # only these members' solutions
    state, metrics = strategy.members.tell(state, key, fitness)  # fitness: all P members

Member i's perturbation depends only on (key, i): `normal(fold_in(key, i), (D,))`. With
antithetic sampling (Open_ES's default, always in PGPE) member i + P/2 mirrors member i (it is
`-z_i`), evosax's `[z, -z]` layout. `sample` draws `chunk` members at a time into its output
(memory: the output and one chunk's random bits). `tell` regenerates the perturbations `chunk`
members at a time (whole pairs: one draw serves both) and accumulates only the sums the update
needs, and the generation's best member for evosax's archive (memory O(chunk x D + P)); it equals
`Strategy.tell(state, sample(state, key, arange(P)), fitness)` to float32 rounding (the
summation order differs). `chunk` defaults to `max(1, min(P, 2**20 // D))` (4 MiB of noise per
chunk), a function of (P, D) only, so results do not depend on the device layout.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from .shaping import sanitize_fitness

__all__ = ["MemberSampling", "member_sampling"]


class MemberSampling(NamedTuple):
    """Ask and tell without the whole population (see the module docstring)."""

    #: (state, key, members (m,) int32 in [0, P)) -> those members' solutions, leading axis m
    sample: Callable[[Any, jax.Array, jax.Array], Any]
    #: (state, key, fitness (P,)) -> (state, metrics): `Strategy.tell` on `sample(.., arange(P))`
    tell: Callable[[Any, jax.Array, jax.Array], tuple[Any, dict]]
    chunk: int  # members regenerated at a time inside tell (whole antithetic pairs, at least one)


def member_sampling(algo: Any, shaping_fn: Callable, unravel: Callable, chunk: int | None,
                    strong: Callable) -> MemberSampling | None:
    """`Strategy.members` for evosax's Open_ES, SNES and PGPE (whose ask leaves the state as
    it is); None for other algorithms. The updates are evosax's `_tell`s, written over sums.
    `chunk=None`: the default, `max(1, min(P, 2**20 // D))`."""
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"member_chunk must be an int >= 1, got {chunk!r}")
    algorithm = _ALGORITHMS.get(type(algo).__name__)
    if algorithm is None:
        return None
    chunk = chunk or max(1, min(algo.population_size, 2**20 // algo.num_dims))
    pop_size, num_dims, half = algo.population_size, algo.num_dims, algo.population_size // 2
    paired = algorithm.paired(algo)
    sizes = _Sizes(pop_size, num_dims, half, paired, half if paired else pop_size, chunk)
    tell = partial(_tell, sizes, algo, algorithm.rules, shaping_fn, strong)
    return MemberSampling(partial(_sample, sizes, unravel), tell, chunk)


class _Sizes(NamedTuple):
    """The static sizes of an algorithm's per-member form."""

    pop_size: int
    num_dims: int
    half: int  # pop_size // 2
    paired: bool  # member i + P/2 mirrors member i (antithetic sampling)
    num_draws: int  # noise vectors per generation: `half` when paired, else `pop_size`
    chunk: int  # members regenerated at a time inside tell


def _noise(num_dims: int, key: jax.Array, draws: jax.Array) -> jax.Array:
    """The perturbations `(m, num_dims)` of draws `(m,)`: draw i is `normal(fold_in(key, i))`."""
    z = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), (num_dims,)))(draws)
    # Unfused from the affine map that follows: XLA:CPU fused them into code whose rounding
    # depended on the number of members asked; this way a member's bits never do.
    return jax.lax.optimization_barrier(z)


def _solutions(es: Any, z: jax.Array) -> jax.Array:
    """`mean + std * z`, the product rounded on its own: XLA may fuse a product and a sum into
    one multiply-add, in one program and not in another (JAX 0.11 did, in tell and not in sample)."""
    return es.mean + jax.lax.optimization_barrier(es.std * z)


def _sample(sizes: _Sizes, unravel: Callable, state: Any, key: jax.Array, members: jax.Array) -> Any:
    """`MemberSampling.sample`: the solutions of `members`, `chunk` members at a time."""
    members = jnp.asarray(members, jnp.int32)
    es, num = state.evo_state, members.shape[0]
    size = min(sizes.chunk, num)
    block = partial(_sample_block, sizes, unravel, es, key)
    if size == num:
        return block(members)
    # `size` members at a time, written into the output in place: the random bits and their
    # intermediates exist for one block only. The last block overlaps the one before it.
    shapes = jax.eval_shape(block, members[:size])
    out = jax.tree.map(lambda x: jnp.zeros((num,) + x.shape[1:], x.dtype), shapes)
    return jax.lax.fori_loop(0, -(-num // size), partial(_sample_into, block, members, size), out)


def _sample_block(sizes: _Sizes, unravel: Callable, es: Any, key: jax.Array, ids: jax.Array) -> Any:
    """The solutions (a pytree, leading axis m) of the members `ids` (m,)."""
    draws, sign = ids, 1.0
    if sizes.paired:  # member i + P/2 mirrors member i
        draws, sign = ids % sizes.half, jnp.where(ids < sizes.half, 1.0, -1.0)[:, None]
    return jax.vmap(unravel)(_solutions(es, sign * _noise(sizes.num_dims, key, draws)))


def _sample_into(block: Callable, members: jax.Array, size: int, k, out):
    """Writes block `k` of `members` (`size` of them) into `out`."""
    num = members.shape[0]
    start = jnp.minimum(k * size, num - size)
    part = block(jax.lax.dynamic_slice(members, (start,), (size,)))
    return jax.tree.map(lambda o, x: jax.lax.dynamic_update_slice_in_dim(o, x, start, 0), out, part)


def _tell(sizes: _Sizes, algo: Any, rules: Callable, shaping_fn: Callable, strong: Callable, state: Any,
          key: jax.Array, fitness: jax.Array):
    """`MemberSampling.tell`: evosax's tell of `algo` over sums of regenerated members."""
    fitness, nonfinite = sanitize_fitness(jnp.asarray(fitness, jnp.float32))
    next_key, _ = jax.random.split(state.key)  # as `Strategy.tell` (evosax's tell key is unused)
    evo_fitness = -fitness  # evosax minimises; popeval maximises returns.
    es, params = state.evo_state, state.evo_params
    # popeval's shaping reads neither the population nor the archive: shape before regenerating.
    w = shaping_fn(None, evo_fitness, es, params)
    best = jnp.argmin(evo_fitness)  # evosax's archive (no NaN after sanitising)
    better = evo_fitness[best] < es.best_fitness
    stats, update = rules(sizes, algo, es, params, w)
    best_solution, sums = _regenerate(sizes, es, key, w, best, stats)
    es = update(sums).replace(best_solution=jnp.where(better, best_solution, es.best_solution),
                              best_fitness=jnp.where(better, evo_fitness[best], es.best_fitness),
                              generation_counter=es.generation_counter + 1)
    return strong(state.replace(evo_state=es, key=next_key), like=state), {"nonfinite/count": nonfinite}


def _regenerate(sizes: _Sizes, es: Any, key: jax.Array, w: jax.Array, best: jax.Array, stats: Callable):
    """(best member's solution, sum of `stats` over all members), `chunk` members at a time.

    `stats(weights, solutions)` gets the shaped fitness and solutions of a chunk's members:
    one (m,) and (m, num_dims) array each, or two (members i, then i + P/2) when paired."""
    size = min(max(1, sizes.chunk // 2) if sizes.paired else sizes.chunk, sizes.num_draws)  # draws per chunk
    one_chunk = partial(_regenerate_chunk, sizes, es, key, w, best, stats, size)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(one_chunk, 0))
    return jax.lax.scan(partial(_accumulate, one_chunk), zeros, jnp.arange(0, sizes.num_draws, size))[0]


def _accumulate(one_chunk: Callable, acc, start):
    return jax.tree.map(jnp.add, acc, one_chunk(start)), None


def _regenerate_chunk(sizes: _Sizes, es: Any, key: jax.Array, w: jax.Array, best: jax.Array, stats: Callable,
                      size: int, start):
    """One chunk of `_regenerate`: the draws `start + arange(size)` (the last chunk padded)."""
    draws = start + jnp.arange(size)
    valid = draws < sizes.num_draws  # the last chunk is padded
    draws = jnp.where(valid, draws, 0)
    z = _noise(sizes.num_dims, key, draws)
    offsets, xs = [0], [_solutions(es, z)]
    if sizes.paired:
        offsets, xs = [0, sizes.half], [xs[0], _solutions(es, -z)]
    picked = jnp.zeros(sizes.num_dims, xs[0].dtype)
    for offset, x in zip(offsets, xs):  # the best member, if it is one of these
        local = best - offset - start  # its row in x
        hit = (local >= 0) & (local < size) & (best - offset < sizes.num_draws)
        picked += jnp.where(hit, x[jnp.clip(local, 0, size - 1)], 0.0)
    return picked, stats([jnp.where(valid, w[draws + offset], 0.0) for offset in offsets], xs)


def _optax_step(algo: Any, es: Any, grad: jax.Array) -> Any:
    """evosax's optax step on the mean."""
    updates, opt_state = algo.optimizer.update(grad, es.opt_state, es.mean)
    return es.replace(mean=optax.apply_updates(es.mean, updates), opt_state=opt_state)


# evosax's `_tell` of each algorithm in two parts: `stats(ws, xs)`, the per-member sums, and
# `update(sums)`, the state from them; `rules(sizes, algo, es, params, w) -> (stats, update)`.


def _open_es_stats(es, ws, xs):
    # z from the solutions, as evosax computes it: the same rounding.
    return sum(wi @ ((x - es.mean) / es.std) for wi, x in zip(ws, xs))


def _open_es_update(sizes, algo, es, sums):
    return _optax_step(algo, es, sums / (sizes.pop_size * es.std)).replace(std=algo.std_schedule(es.generation_counter))


def _open_es_rules(sizes, algo, es, params, w):
    return partial(_open_es_stats, es), partial(_open_es_update, sizes, algo, es)


def _snes_stats(es, ws, xs):
    z = (xs[0] - es.mean) / es.std
    return ws[0] @ z, ws[0] @ (z**2 - 1)


def _snes_update(algo, es, sums):
    return _optax_step(algo, es, -es.std * sums[0]).replace(std=es.std * jnp.exp(0.5 * es.lr_std * sums[1]))


def _snes_rules(sizes, algo, es, params, w):
    return partial(_snes_stats, es), partial(_snes_update, algo, es)


def _pgpe_stats(es, baseline, ws, xs):  # over the pairs (i, i + P/2)
    z_scaled, (plus, minus) = xs[0] - es.mean, ws
    grad_std = (plus + minus - 2 * baseline) @ ((z_scaled**2 - es.std**2) / es.std)
    return (plus - minus) @ z_scaled, grad_std


def _pgpe_update(sizes, algo, es, params, sums):
    max_change = params.std_max_change * es.std
    std = jnp.clip(es.std - params.std_lr * (sums[1] / sizes.pop_size), min=es.std - max_change,
                   max=es.std + max_change)
    return _optax_step(algo, es, sums[0] / sizes.pop_size).replace(std=std)


def _pgpe_rules(sizes, algo, es, params, w):
    baseline = jnp.mean(w)
    return partial(_pgpe_stats, es, baseline), partial(_pgpe_update, sizes, algo, es, params)


class _Algorithm(NamedTuple):
    """How `member_sampling` handles one evosax algorithm."""

    paired: Callable[[Any], bool]  # algo -> whether member i + P/2 mirrors member i
    rules: Callable  # (sizes, algo, es, params, w) -> (stats, update)


_ALGORITHMS = {
    "Open_ES": _Algorithm(lambda algo: bool(algo.use_antithetic_sampling), _open_es_rules),
    "SNES": _Algorithm(lambda algo: False, _snes_rules),
    "PGPE": _Algorithm(lambda algo: True, _pgpe_rules),  # always antithetic
}
