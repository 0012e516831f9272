"""EGGROLL (Sarkar et al., "Evolution Strategies at the Hyperscale", arXiv 2511.16652) as an
optax-style `Strategy` over low-rank populations (`popeval.low_rank`).

```python
strategy = eggroll(pop_size=256, solution=params, rank=1, sigma=0.1, learning_rate=0.05)
state = strategy.init(key, params)
population, state = strategy.ask(key, state)   # a LowRankPopulation: the mean, a key, the generation
fitness = manager.population_fitness(keys, population).returns.mean(axis=-1)
state, metrics = strategy.tell(state, population, fitness)   # higher fitness is better
```

Member `i` perturbs every weight matrix `M` by `sigma E_i`, `E_i = A_i B_i^T / sqrt(r)` with
Gaussian `A_i` (`m x r`) and `B_i` (`n x r`), and every other parameter `v` by `sigma e_i`,
`e_i` full Gaussian noise; members `2k` and `2k + 1` are antithetic. popeval stores a kernel as
`(n_in, n_out)`, the paper's `M^T`, so `E_i` is `B_i A_i^T / sqrt(r)` there
(`popeval.low_rank`'s `Factors`). The update is the paper's Gaussian ES estimate of the
gradient of the expected fitness, on the shaped fitness `s_i` (centred ranks or z-scores):

```text
g = 1 / (N sigma) * sum_i s_i E_i        (and sum_i s_i e_i for the other parameters)
```

given to an optax optimizer as the gradient of a loss to minimise, `-g`: with `sgd` the mean
moves by `learning_rate * g`. The paper's reference code (github.com/ESHyperscale/HyperscaleES,
`noiser/eggroll.py`) scales the same sum `sum_i s_i E_i` by `sigma / sqrt(N)` rather than
`1 / (N sigma)`: a constant factor, which the learning rate absorbs (and Adam ignores).

Memory. `ask` returns a descriptor, not a population: each device draws the factors of the
members it evaluates inside the evaluation (O(P_device r (m + n)) a matrix), and `tell` redraws
them `chunk` members at a time (`gradient`: O(chunk r (m + n) + m n)), so no `(P, m, n)` array
and no member's parameters exist. `chunk` is a function of `P` and the parameter shapes only,
so the update rounds alike on any device layout.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from popeval.low_rank import Factors, LowRankPopulation, draw_factors, is_matrix

from . import base
from .base import Hyperparameters, Strategy, check_hyperparameters, check_shaping, strong
from .shaping import FITNESS_SHAPING, sanitize_fitness

__all__ = ["EggrollState", "eggroll", "gradient", "NAME", "HYPERPARAMETERS"]

NAME = "EGGROLL"
#: `eggroll`'s hyperparameters (`strategy_kwargs` of `strategy: eggroll`).
HYPERPARAMETERS = ("rank", "sigma", "learning_rate", "optimizer", "lr_decay", "lr_min", "member_chunk")


@struct.dataclass
class EggrollState:
    mean: Any  # one policy's parameters
    opt_state: Any  # the optax optimizer's state
    generation: jax.Array  # () int32: tells so far, folded into the draws' key


def eggroll(pop_size: int, solution: Any, *, rank: int = 1, sigma: float = 0.1, learning_rate: float = 0.05,
            optimizer: str = "adam", lr_decay: float = 1.0, lr_min: float = 0.0,
            fitness_shaping: str = "centered_rank", member_chunk: int | None = None) -> Strategy:
    """EGGROLL over low-rank populations (see the module docstring).

    Args:
        pop_size: population size `N` (even: antithetic pairs).
        solution: a parameter pytree with the shape of one solution.
        rank: `r`, the rank of every matrix perturbation.
        sigma: the perturbations' scale.
        learning_rate: the optimizer's learning rate.
        optimizer: the optax optimizer, by name (e.g. `adam` or `sgd`).
        lr_decay: the learning rate's per-generation decay factor.
        lr_min: the learning rate's floor.
        fitness_shaping: `"centered_rank"`, `"z_score"` or `"none"`.
        member_chunk: members redrawn at a time by `tell`; default `max(1, min(N, 2**20 // d))`,
            `d` the numbers one member draws.
    """
    hyper = Hyperparameters(learning_rate=learning_rate, lr_decay=lr_decay, lr_min=lr_min, optimizer=optimizer,
                             std_init=sigma, std_decay=1.0, std_min=0.0)
    _check(hyper, rank, pop_size, fitness_shaping, member_chunk)
    opt = base.optimizer(hyper)
    shape = FITNESS_SHAPING[fitness_shaping]
    pop_size, rank, sigma = int(pop_size), int(rank), float(sigma)
    chunk = member_chunk or default_chunk(solution, rank, pop_size)

    def init(key: jax.Array, mean_params: Any) -> EggrollState:
        del key  # the draws take the key of each ask
        mean_params = jax.tree.map(jnp.asarray, mean_params)
        return strong(EggrollState(mean=mean_params, opt_state=opt.init(mean_params), generation=jnp.int32(0)))

    def ask(key: jax.Array, state: EggrollState) -> tuple[LowRankPopulation, EggrollState]:
        population = LowRankPopulation.from_key(state.mean, key, sigma, rank, pop_size=pop_size,
                                                generation=state.generation)
        return population, state

    def tell(state: EggrollState, population: LowRankPopulation, fitness: jax.Array):
        fitness, nonfinite = sanitize_fitness(jnp.asarray(fitness, jnp.float32))
        ascent = gradient(population, shape(fitness), chunk)
        # optax minimises a loss; popeval maximises fitness.
        updates, opt_state = opt.update(jax.tree.map(jnp.negative, ascent), state.opt_state, state.mean)
        new = EggrollState(mean=optax.apply_updates(state.mean, updates), opt_state=opt_state,
                           generation=state.generation + 1)
        return strong(new, like=state), {"nonfinite/count": nonfinite}

    def mean(state: EggrollState) -> Any:
        return state.mean

    num_dims = sum(math.prod(jnp.shape(x)) for x in jax.tree.leaves(solution))
    return Strategy(init, ask, tell, mean, NAME, pop_size, int(num_dims))


def _check(hyper: Hyperparameters, rank: Any, pop_size: Any, fitness_shaping: str, member_chunk: Any) -> None:
    """Refuses bad hyperparameters, in one line naming them and the allowed values."""
    check_hyperparameters(NAME, hyper._replace(std_init=None))
    check_shaping(fitness_shaping)
    sigma = hyper.std_init
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"{NAME}: sigma must be a finite number > 0, got {sigma!r}")
    _check_count("rank", rank)
    if member_chunk is not None:
        _check_count("member_chunk", member_chunk)
    if isinstance(pop_size, bool) or not isinstance(pop_size, numbers.Integral) or pop_size < 2 or pop_size % 2:
        raise ValueError(f"{NAME} samples antithetic pairs: pop_size must be an even integer >= 2, got {pop_size!r}")


def _check_count(what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{NAME}: {what} must be an integer >= 1, got {value!r}")


def default_chunk(solution: Any, rank: int, pop_size: int) -> int:
    """Members `tell` redraws at a time: `max(1, min(pop_size, 2**20 // d))`, `d` the numbers
    one member draws (4 MiB of draws a chunk)."""
    draws = 0
    for leaf in jax.tree.leaves(solution):
        shape = jnp.shape(leaf)
        draws += rank * (math.prod(shape[:-1]) + shape[-1]) if is_matrix(leaf) else math.prod(shape)
    return max(1, min(pop_size, 2**20 // max(draws, 1)))


def gradient(population: LowRankPopulation, weights: jax.Array, chunk: int | None = None) -> Any:
    """EGGROLL's estimate of the gradient of the expected fitness at `population.mean`:
    `1 / (P sigma) * sum_i w_i E_i`, `E_i` member `i`'s perturbation over `sigma` (`B_i A_i^T /
    sqrt(r)` for a matrix, the noise for another parameter), a pytree like the mean.

    Args:
        population: a `LowRankPopulation` (`sigma > 0`); drawn factors are redrawn `chunk`
            members at a time, explicit ones used as they are.
        weights: `(P,)` the members' shaped fitness, in the population's member order.
        chunk: members redrawn at a time (default `default_chunk`).
    """
    weights = jnp.asarray(weights, jnp.float32)
    num = population.pop_size
    scale = 1.0 / (num * population.sigma)
    if population.factors is not None:
        total = _weighted_sum(population.mean, population.factors, weights, population.rank)
    else:
        size = chunk or default_chunk(population.mean, population.rank, num)
        total = _redrawn_sum(population, weights, min(int(size), num))
    return jax.tree.map(lambda g, m: (scale * g).astype(jnp.result_type(m)), total, population.mean)


def _weighted_sum(mean: Any, factors: Any, weights: jax.Array, rank: int) -> Any:
    """`sum_i w_i E_i` over the members of `factors`."""
    def leaf(m, f):
        if isinstance(f, Factors):  # sum_i w_i B_i A_i^T as one contraction: no member's matrix
            total = jnp.einsum("p,pir,por->io", weights, f.b.astype(jnp.float32), f.a.astype(jnp.float32))
            return total.reshape(jnp.shape(m)) / jnp.sqrt(jnp.float32(rank))
        return jnp.tensordot(weights, f.astype(jnp.float32), axes=1)

    return jax.tree.map(leaf, mean, factors, is_leaf=lambda x: isinstance(x, Factors))


def _redrawn_sum(population: LowRankPopulation, weights: jax.Array, size: int) -> Any:
    """`_weighted_sum` over drawn factors, `size` members at a time (the last chunk padded with
    weight 0)."""
    members = jnp.asarray(population.members, jnp.int32)
    count = -(-members.shape[0] // size)
    pad = count * size - members.shape[0]
    members = jnp.concatenate([members, jnp.zeros((pad,), jnp.int32)]).reshape(count, size)
    weights = jnp.concatenate([weights, jnp.zeros((pad,), jnp.float32)]).reshape(count, size)
    add = _chunk_sum(population)
    zeros = jax.tree.map(lambda m: jnp.zeros(jnp.shape(m), jnp.float32), population.mean)
    return jax.lax.scan(add, zeros, (members, weights))[0]


def _chunk_sum(population: LowRankPopulation) -> Callable:
    """The scan body of `_redrawn_sum`: adds one chunk's weighted perturbations."""
    def add(total, chunk):
        ids, w = chunk
        factors = draw_factors(population.mean, population.key, ids, population.rank, population.generation,
                               population.antithetic)
        return jax.tree.map(jnp.add, total, _weighted_sum(population.mean, factors, w, population.rank)), None

    return add
