"""`jax.random`'s threefry key derivations written as integer arithmetic that XLA fuses.

    key = prng.fold_in(key, t)              # == jax.random.fold_in(key, t)
    key_a, key_b = prng.split(key)          # == tuple(jax.random.split(key))
    u = prng.uniform(key, (3,))             # == jax.random.uniform(key, (3,))

The values are `jax.random`'s, bit for bit, for threefry keys (typed `jax.random.key`s
or raw `uint32[2]` PRNGKeys) under `jax_threefry_partitionable` (JAX's default since
0.5); `tests/environments/test_prng.py` checks it. Any other key, or the legacy non-partitionable
mode, is passed to `jax.random` itself.

Why: on CPUs JAX lowers every threefry hash to a `while` loop of five iterations, a dozen
small kernels each, and keys derived one from another run as loops one after another. A
MinAtar step derives three (the step's key, the environment's key, the sticky-action
draw), which cost a fraction of that as fused arithmetic (experiments/README.md, "Threefry
keys"). Threefry-2x32 (Salmon et al. 2011, "Parallel
random numbers: as easy as 1, 2, 3") hashes a counter pair with a key pair in 20 rounds of
add, rotate and xor; `split` and `fold_in` hash the counters `(0, i)` and `(0, data)`.

A key is assembled from its two words with `lax.concatenate` on the last axis: `jnp.stack`
becomes a stack and a transpose under `vmap`, which XLA cannot see through to the words,
so each consumer of the key recomputed both hashes in unvectorised code.

Fused arithmetic has a cost where its value is read many times: XLA may fuse the hash into
each consumer and recompute it per element (Breakout's reset drawing its ball's side, which
decides 400 observation cells). popeval uses it where it was faster on every registered
environment, with the same returns: the step's keys (`popeval.keys.step_keys`) and MinAtar's key split and
sticky-action draw; a game's own draws and every reset use `jax.random`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["threefry2x32", "fold_in", "split", "bits", "uniform", "is_typed_key", "to_raw", "from_raw"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k0, k1, x0, x1):
    """The Threefry-2x32 hash (20 rounds) of counter words `(x0, x1)` under key words
    `(k0, k1)`, all `uint32` (broadcast together): `(y0, y1)`."""
    ks = (k0, k1, k0 ^ k1 ^ _KEY_PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = x0 ^ ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r)))
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def is_typed_key(x: Any) -> bool:
    """Whether `x` is an array of typed keys (`jax.random.key`), which host code cannot hold."""
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_raw(x: Any) -> Any:
    """Typed keys -> their raw `uint32` data (for numpy, files, device copies); others as given."""
    return jax.random.key_data(x) if is_typed_key(x) else x


def from_raw(raw: Any, like: Any) -> Any:
    """The inverse of `to_raw`: `raw` wrapped as keys of `like`'s implementation when `like`
    is a typed key array; otherwise `raw` as given."""
    return jax.random.wrap_key_data(raw, impl=jax.random.key_impl(like)) if is_typed_key(like) else raw


def _threefry(key) -> bool:
    """Whether `key` holds threefry keys that this module derives like `jax.random`."""
    if not jax.config.jax_threefry_partitionable:
        return False
    if is_typed_key(key):
        return str(jax.random.key_impl(key)) == "threefry2x32"
    return (key.dtype == jnp.uint32 and key.ndim >= 1 and key.shape[-1] == 2
            and jax.config.jax_default_prng_impl == "threefry2x32")


def _as_key(key) -> tuple[Any, bool]:
    """`(key as an array, whether this module derives it like jax.random)`."""
    key = key if isinstance(key, jax.Array) else jnp.asarray(key)
    return key, _threefry(key)


def _words(key):
    raw = to_raw(key)
    return raw[..., 0], raw[..., 1]


def _key(like, w0, w1):
    """The key (typed like `like`, or raw) with words `(w0, w1)`."""
    return from_raw(jax.lax.concatenate([w0[..., None], w1[..., None]], w0.ndim), like)


def fold_in(key, data):
    """`jax.random.fold_in(key, data)` for one key (`data` a scalar integer)."""
    key, fast = _as_key(key)
    if not fast:
        return jax.random.fold_in(key, data)
    k0, k1 = _words(key)
    return _key(key, *threefry2x32(k0, k1, np.uint32(0), jnp.asarray(data).astype(jnp.uint32)))


def split(key, num: int = 2) -> tuple:
    """`tuple(jax.random.split(key, num))` for one key."""
    key, fast = _as_key(key)
    if not fast:
        return tuple(jax.random.split(key, num))
    k0, k1 = _words(key)
    return tuple(_key(key, *threefry2x32(k0, k1, np.uint32(0), np.uint32(i))) for i in range(num))


def bits(key, shape: Sequence[int] = ()) -> jax.Array:
    """`jax.random.bits(key, shape)` (`uint32`) for one key."""
    key, fast = _as_key(key)
    shape = tuple(shape)
    if not fast:
        return jax.random.bits(key, shape)
    if int(np.prod(shape)) >= 2**32:
        raise ValueError(f"bits: {shape} holds more values than 32-bit counters number")
    k0, k1 = _words(key)
    counters = np.arange(int(np.prod(shape)), dtype=np.uint32).reshape(shape)
    y0, y1 = threefry2x32(k0, k1, np.uint32(0), counters)
    return y0 ^ y1


def uniform(key, shape: Sequence[int] = (), minval=0.0, maxval=1.0) -> jax.Array:
    """`jax.random.uniform(key, shape, jnp.float32, minval, maxval)` for one key."""
    key, fast = _as_key(key)
    if not fast:
        return jax.random.uniform(key, tuple(shape), jnp.float32, minval, maxval)
    # 23 random mantissa bits under the exponent of 1.0: a float in [1, 2), shifted to [0, 1).
    one = bits(key, shape) >> np.uint32(32 - 23) | np.array(1.0, np.float32).view(np.uint32)
    floats = jax.lax.bitcast_convert_type(one, jnp.float32) - jnp.float32(1.0)
    minval, maxval = jnp.asarray(minval, jnp.float32), jnp.asarray(maxval, jnp.float32)
    return jnp.maximum(minval, floats * (maxval - minval) + minval)
