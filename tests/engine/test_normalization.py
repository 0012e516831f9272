"""Running observation statistics: Welford updates, exact merges, normalisation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from popeval.normalization import ObsStats, init, merge, merge_stacked, normalize, update


@jax.jit
def stats_of(obs, mask):
    """Statistics of `obs` (N, ...) where `mask` (N,), by N sequential `update`s."""
    stats = init(obs.shape[1:])
    return jax.lax.scan(lambda s, x: (update(s, *x), None), stats, (obs, mask))[0]


def data(seed, n, shape=(3, 2), offset=0.0):
    rng = np.random.default_rng(seed)
    return (offset + rng.normal(size=(n,) + shape) * rng.uniform(0.1, 3.0, size=shape)).astype(np.float32)


def assert_stats_close(stats, samples, rtol=1e-5):
    samples = np.asarray(samples, np.float64)
    np.testing.assert_allclose(stats.count, len(samples))
    np.testing.assert_allclose(stats.mean, samples.mean(0), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(stats.var, samples.var(0), rtol=rtol, atol=rtol)


def test_update_matches_numpy_and_is_stable():
    x = data(0, 301)
    assert_stats_close(stats_of(x, np.ones(301, bool)), x)
    # A large offset with a small spread: naive sum-of-squares in float32 would return
    # garbage here; Welford's update keeps the variance.
    far = data(1, 301, offset=1e4)
    assert_stats_close(stats_of(far, np.ones(301, bool)), far, rtol=2e-3)


def test_masked_updates_are_skipped():
    x = data(2, 40)
    mask = np.arange(40) % 3 == 0
    masked = stats_of(x, mask)
    assert_stats_close(masked, x[mask])
    none = stats_of(x, np.zeros(40, bool))
    assert float(none.count) == 0 and not np.any(none.mean) and not np.any(none.m2)


def test_merge_of_halves_is_stats_of_union():
    x = data(3, 100)
    a, b = stats_of(x[:37], np.ones(37, bool)), stats_of(x[37:], np.ones(63, bool))
    assert_stats_close(merge(a, b), x)
    assert_stats_close(merge(b, a), x)
    # Empty statistics are the identity, exactly, on either side (padding members).
    empty = init((3, 2))
    for merged in (merge(a, empty), merge(empty, a)):
        jax.tree.map(np.testing.assert_array_equal, merged, a)
    both_empty = merge(empty, empty)
    assert float(both_empty.count) == 0 and np.all(np.isfinite(both_empty.mean))


def test_merge_stacked_folds_a_stack():
    sizes = [5, 1, 17, 0, 9, 30]
    x = data(4, sum(sizes))
    chunks = np.split(x, np.cumsum(sizes)[:-1])
    parts = [stats_of(c, np.ones(len(c), bool)) if len(c) else init((3, 2)) for c in chunks]
    stack = jax.tree.map(lambda *s: jnp.stack(s), *parts)
    total = merge_stacked(stack)
    assert_stats_close(total, x)
    # A left fold in index order.
    folded = functools.reduce(merge, parts, init((3, 2)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), total, folded)
    # Splitting the stack into chunks first (e.g. per device) gives the same statistics.
    halves = merge(merge_stacked(jax.tree.map(lambda s: s[:2], stack)),
                   merge_stacked(jax.tree.map(lambda s: s[2:], stack)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), halves, total)
    # Empty entries appended (padding) leave the result unchanged, to the bit.
    padded = jax.tree.map(lambda s, e: jnp.concatenate([s, jnp.stack([e, e])]), stack, init((3, 2)))
    jax.tree.map(np.testing.assert_array_equal, merge_stacked(padded), total)
    # init_stats: a running total that the stack is folded into.
    prior = stats_of(data(5, 12), np.ones(12, bool))
    assert_stats_close(merge_stacked(stack, prior), np.concatenate([data(5, 12), x]))


def test_normalize():
    obs = jnp.asarray([[1.0, -2.0], [3.0, 40.0]], jnp.float32)
    empty = init((2, 2))
    np.testing.assert_array_equal(normalize(empty, obs), obs)  # count 0: identity
    one = update(empty, obs)
    assert float(one.count) == 1
    np.testing.assert_array_equal(normalize(one, obs + 5.0), obs + 5.0)  # count 1: identity
    np.testing.assert_array_equal(one.var, 1.0)
    ints = jnp.asarray([[1, 0], [1, 1]], jnp.int32)
    out = normalize(empty, ints)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, ints.astype(np.float32))

    stats = ObsStats(count=jnp.float32(4.0), mean=jnp.full((2, 2), 1.0), m2=jnp.full((2, 2), 16.0))  # std 2
    np.testing.assert_allclose(normalize(stats, obs), [[0.0, -1.5], [1.0, 10.0]])  # 19.5 clipped to 10
    np.testing.assert_allclose(normalize(stats, obs, clip=1.0), [[0.0, -1.0], [1.0, 1.0]])
    constant = ObsStats(count=jnp.float32(4.0), mean=jnp.zeros((2, 2)), m2=jnp.zeros((2, 2)))
    z = normalize(constant, obs)  # zero variance: floored std, clipped, finite
    assert np.all(np.isfinite(z)) and np.all(np.abs(z) == 10.0)
