"""Fitness shaping, on maximised fitness (higher is better), and non-finite fitness.

Salimans et al. (2017) rank-transform returns (centred ranks) to make OpenAI-ES invariant to
their scale; `z_score` standardises them; `none` passes them on. `sanitize_fitness` ranks a
diverging policy's NaN/inf worst, so it never reaches a strategy's state.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = ["FITNESS_SHAPING", "centered_rank", "z_score", "identity", "sanitize_fitness"]


def centered_rank(fitness: jax.Array) -> jax.Array:
    """Ranks mapped to [-0.5, 0.5] (best is 0.5); ties share their average rank."""
    n = fitness.shape[-1]
    if n <= 4096:
        # Pairwise counts: the same ranks as `rankdata` (exact small integers in float32),
        # and a program XLA:CPU compiles in a fraction of a sort's time.
        less = jnp.sum(fitness[None, :] < fitness[:, None], axis=-1)
        equal = jnp.sum(fitness[None, :] == fitness[:, None], axis=-1)
        ranks = less + (equal - 1) * 0.5
    else:
        ranks = jax.scipy.stats.rankdata(fitness) - 1.0
    return ranks / jnp.maximum(n - 1, 1) - 0.5


def z_score(fitness: jax.Array) -> jax.Array:
    """`(f - mean) / std`."""
    return (fitness - fitness.mean()) / (fitness.std() + 1e-8)


def identity(fitness: jax.Array) -> jax.Array:
    """No shaping."""
    return fitness


FITNESS_SHAPING: dict[str, Callable[[jax.Array], jax.Array]] = {
    "centered_rank": centered_rank,
    "z_score": z_score,
    "none": identity,
}


def sanitize_fitness(fitness: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Replaces NaN/inf by a value below every finite fitness; returns `(fitness, count)`.

    A diverging policy is thus ranked worst and never puts a NaN into the strategy state.
    """
    finite = jnp.isfinite(fitness)
    lo = jnp.min(jnp.where(finite, fitness, jnp.inf))
    hi = jnp.max(jnp.where(finite, fitness, -jnp.inf))
    worst = jnp.where(jnp.any(finite), lo - (hi - lo) - 1.0, 0.0)
    return jnp.where(finite, fitness, worst), jnp.sum(~finite)
