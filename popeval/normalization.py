"""Running observation statistics (mean / variance) that merge exactly across shards.

The statistics are a pytree `ObsStats(count, mean, m2)` (Welford's running moments;
`m2` is the sum of squared deviations from the mean). Two sets of statistics merge with
Chan et al.'s parallel formula, which gives the statistics of the union of both samples.
`merge_stacked` folds a stack of statistics in a fixed order (the leading index), so the
result does not depend on how members were laid out over devices or hosts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["ObsStats", "init", "check", "update", "merge", "merge_stacked", "normalize"]


@struct.dataclass
class ObsStats:
    count: jax.Array  # ()  number of observations seen
    mean: jax.Array  # obs shape
    m2: jax.Array  # obs shape, sum of squared deviations from the mean

    @property
    def var(self) -> jax.Array:
        return jnp.where(self.count > 1, self.m2 / jnp.maximum(self.count, 1.0), 1.0)

    @property
    def std(self) -> jax.Array:
        return jnp.sqrt(self.var)


def init(obs_shape: tuple[int, ...]) -> ObsStats:
    """Empty statistics (count 0) for observations of `obs_shape`."""
    zeros = jnp.zeros(obs_shape, jnp.float32)
    return ObsStats(count=jnp.zeros((), jnp.float32), mean=zeros, m2=zeros)


def check(stats: Any, obs_shape: tuple[int, ...]) -> ObsStats:
    """Returns `stats` if it is an `ObsStats` for observations of `obs_shape`; concrete
    statistics (not traced) must also be finite with a count and `m2` >= 0.

    Raises:
        ValueError naming the expected structure, or the bad values.
    """
    expected = f"ObsStats(count (), mean {tuple(obs_shape)}, m2 {tuple(obs_shape)}) (normalization.init(obs_shape))"
    if not isinstance(stats, ObsStats):
        raise ValueError(f"obs_stats: expected {expected}, got {type(stats).__name__} {stats!r:.80}")
    got = tuple(jnp.shape(x) for x in (stats.count, stats.mean, stats.m2))
    if got != ((), tuple(obs_shape), tuple(obs_shape)):
        raise ValueError(f"obs_stats: expected {expected}, got shapes count {got[0]}, mean {got[1]}, m2 {got[2]}")
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(stats)):
        return stats  # values are checked where they are concrete
    count, mean, m2 = (np.asarray(x, np.float64) for x in (stats.count, stats.mean, stats.m2))
    problems = [f"count {count:g}"] if not (np.isfinite(count) and count >= 0) else []
    problems += ["a non-finite mean"] if not np.isfinite(mean).all() else []
    problems += ["a non-finite or negative m2"] if not (np.isfinite(m2).all() and (m2 >= 0).all()) else []
    if problems:
        raise ValueError(f"obs_stats: {', '.join(problems)}; count and m2 must be finite and >= 0, mean finite")
    return stats


def _exact(x: jax.Array) -> jax.Array:
    """Rounds a product before it is added: XLA on CPU otherwise fuses some multiply-adds
    into FMAs depending on the surrounding program, and the statistics would then differ
    in the last bit between device layouts."""
    return jax.lax.optimization_barrier(x)


def update(stats: ObsStats, obs: jax.Array, mask: Any = True) -> ObsStats:
    """Adds one observation (only where `mask` is true) with Welford's update."""
    mask = jnp.asarray(mask, jnp.bool_)
    obs = obs.astype(jnp.float32)
    count = stats.count + mask.astype(jnp.float32)
    delta = obs - stats.mean
    mean = jnp.where(mask, stats.mean + delta / jnp.maximum(count, 1.0), stats.mean)
    m2 = jnp.where(mask, stats.m2 + _exact(delta * (obs - mean)), stats.m2)
    return ObsStats(count=count, mean=mean, m2=m2)


def merge(a: ObsStats, b: ObsStats) -> ObsStats:
    """Statistics of the union of the samples behind `a` and `b` (Chan et al., 1979)."""
    count = a.count + b.count
    safe = jnp.maximum(count, 1.0)
    delta = b.mean - a.mean
    mean = a.mean + _exact(delta * (b.count / safe))
    m2 = a.m2 + b.m2 + _exact(delta**2 * (a.count * b.count / safe))
    return ObsStats(count=count, mean=mean, m2=m2)


def merge_stacked(stats: ObsStats, init_stats: ObsStats | None = None) -> ObsStats:
    """Folds statistics with a leading axis into one, in index order (layout-independent)."""
    if init_stats is None:
        init_stats = jax.tree.map(lambda x: jnp.zeros_like(x[0]), stats)
    out, _ = jax.lax.scan(lambda acc, s: (merge(acc, s), None), init_stats, stats)
    return out


def normalize(stats: ObsStats, obs: jax.Array, clip: float = 10.0) -> jax.Array:
    """`(obs - mean) / std` as float32, clipped to [-clip, clip]; identity until 2 obs are seen."""
    obs = obs.astype(jnp.float32)
    z = (obs - stats.mean) / jnp.maximum(stats.std, 1e-8)
    return jnp.where(stats.count > 1, jnp.clip(z, -clip, clip), obs)
