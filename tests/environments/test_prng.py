"""`popeval.environments.prng` derives `jax.random`'s values, bit for bit, without loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import keys as keys_lib
from popeval.environments import prng

MAKERS = {"typed": jax.random.key, "raw": jax.random.PRNGKey}


def _data(key):
    return np.asarray(prng.to_raw(key))


@pytest.fixture(params=sorted(MAKERS))
def keys(request):
    return jax.vmap(MAKERS[request.param])(jnp.arange(500))


def test_fold_in_matches_jax_random(keys):
    data = jnp.asarray(np.random.RandomState(0).randint(0, 2**31 - 1, 500), jnp.int32)
    data = data.at[:3].set(jnp.array([0, 1, 2**31 - 1], jnp.int32))
    expected = jax.vmap(jax.random.fold_in)(keys, data)
    np.testing.assert_array_equal(_data(jax.jit(jax.vmap(prng.fold_in))(keys, data)), _data(expected))


@pytest.mark.parametrize("num", [2, 3])
def test_split_matches_jax_random(keys, num):
    expected = jax.vmap(lambda k: jax.random.split(k, num))(keys)
    got = jax.jit(jax.vmap(lambda k: prng.split(k, num)))(keys)
    assert len(got) == num
    for i in range(num):
        np.testing.assert_array_equal(_data(got[i]), _data(expected[:, i]))


@pytest.mark.parametrize("shape", [(), (3,), (2, 5)])
def test_bits_and_uniform_match_jax_random(keys, shape):
    np.testing.assert_array_equal(jax.jit(jax.vmap(lambda k: prng.bits(k, shape)))(keys),
                                  jax.vmap(lambda k: jax.random.bits(k, shape))(keys))
    for lo, hi in [(0.0, 1.0), (-2.0, 3.0)]:
        got = jax.jit(jax.vmap(lambda k: prng.uniform(k, shape, lo, hi)))(keys)
        expected = jax.vmap(lambda k: jax.random.uniform(k, shape, minval=lo, maxval=hi))(keys)
        assert got.dtype == jnp.float32 and got.shape == (500,) + shape
        np.testing.assert_array_equal(got, expected)


def test_step_keys_are_jax_randoms_split_of_fold_in(keys):
    ts = jnp.arange(500) * 7
    got = jax.vmap(keys_lib.step_keys)(keys, ts)
    expected = jax.vmap(lambda k, t: tuple(jax.random.split(jax.random.fold_in(k, t))))(keys, ts)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(_data(g), _data(e))


def test_other_key_implementations_go_to_jax_random():
    key = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(_data(prng.fold_in(key, 5)), _data(jax.random.fold_in(key, 5)))
    np.testing.assert_array_equal(_data(prng.split(key)[1]), _data(jax.random.split(key)[1]))
    np.testing.assert_array_equal(prng.uniform(key, (4,)), jax.random.uniform(key, (4,)))


def test_the_legacy_split_goes_to_jax_random():
    """Under `jax_threefry_partitionable=False` (here as JAX's context manager, which the
    module's check reads at each call) the module hands threefry keys to `jax.random`."""
    with jax.threefry_partitionable(False):
        key = jax.random.key(3)
        np.testing.assert_array_equal(jax.random.key_data(prng.split(key)[1]),
                                      jax.random.key_data(jax.random.split(key)[1]))
        np.testing.assert_array_equal(prng.uniform(key, (4,)), jax.random.uniform(key, (4,)))
        # The fused derivation would differ here: the legacy split hashes other counters.
        k0, k1 = jax.random.key_data(key)
        assert not np.array_equal(np.stack(prng.threefry2x32(k0, k1, np.uint32(0), np.uint32(1))),
                                  jax.random.key_data(jax.random.split(key)[1]))


def test_a_steps_key_chain_compiles_without_loops():
    """The reason the module exists: the step's keys and the sticky draw of a MinAtar step,
    vmapped, compile to fused arithmetic, where `jax.random` gives one `while` per hash on CPUs."""
    def chain(key, t):
        _, key_env = keys_lib.step_keys(key, t)
        key_sticky, _ = prng.split(key_env)
        return prng.uniform(key_sticky) < 0.1

    keys = jax.vmap(jax.random.key)(jnp.arange(64))
    hlo = jax.jit(jax.vmap(chain, in_axes=(0, None))).lower(keys, 3).compile().as_text()
    assert " while(" not in hlo
    assert " concatenate(" not in hlo  # the keys' words reach the draw without a key in memory
