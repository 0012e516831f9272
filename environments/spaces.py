"""Jittable observation and action spaces: `Discrete`, `Box`, `Dict` and `Tuple`.

Spaces are static descriptions (plain Python objects built from `EnvParams`); their
`sample` and `contains` methods are pure JAX functions that can be jitted and vmapped.
`check_action` is the trace-time guard that `Environment.step_env` uses to turn a wrong
action shape or dtype into a clear error instead of a silent broadcast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Space", "Discrete", "Box", "Dict", "Tuple", "Key", "as_mapping"]


def as_mapping(x: Any) -> Any:
    """`x` itself if it is a mapping, else its pytree leaves by path: `{"x": ..., "theta": ...}`
    for a flat `EnvState`, dotted paths (`"pipeline_state.q"`, `"b.0"`) for nested nodes.
    Static fields and None are no leaves, so they have no entry."""
    if isinstance(x, Mapping):
        return x
    leaves = jax.tree_util.tree_flatten_with_path(x)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="."): leaf for path, leaf in leaves}


class Space:
    """A set of values with a fixed shape and dtype."""

    shape: tuple[int, ...]
    dtype: Any

    def sample(self, key: jax.Array) -> Any:
        raise NotImplementedError

    def contains(self, x: Any) -> jax.Array:
        raise NotImplementedError

    def check_action(self, action: Any, env_name: str) -> jax.Array:
        """Validates an action's shape and dtype at trace time and returns it as an array.

        Raises:
            ValueError / TypeError naming the expected space.
        """
        raise NotImplementedError


class Discrete(Space):
    """Integers `0 .. n-1` (scalar, int32)."""

    def __init__(self, n: int, dtype: Any = jnp.int32):
        if int(n) < 1:
            raise ValueError(f"Discrete space needs n >= 1, got {n}")
        self.n = int(n)
        self.shape = ()
        self.dtype = jnp.dtype(dtype)

    @property
    def num_categories(self) -> int:
        """gymnax's name for `n`."""
        return self.n

    def __repr__(self) -> str:
        return f"Discrete({self.n})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Discrete) and other.n == self.n

    def __hash__(self) -> int:
        return hash(("Discrete", self.n))

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, self.shape, 0, self.n, dtype=self.dtype)

    def contains(self, x: Any) -> jax.Array:
        x = jnp.asarray(x)
        if x.shape != self.shape:
            return jnp.asarray(False)
        if not (jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
            return jnp.asarray(False)
        return (x >= 0) & (x < self.n)

    def check_action(self, action: Any, env_name: str) -> jax.Array:
        action = jnp.asarray(action)
        if action.shape != self.shape and action.shape != (1,):
            raise ValueError(
                f"{env_name}: action has shape {action.shape}, expected a scalar "
                f"integer in {self} (shape ())"
            )
        if not (jnp.issubdtype(action.dtype, jnp.integer) or action.dtype == jnp.bool_):
            raise TypeError(
                f"{env_name}: action has dtype {action.dtype}, expected an integer in "
                f"{self}; use jnp.argmax(logits) or .astype(jnp.int32)"
            )
        return action.reshape(()).astype(self.dtype)


class Box(Space):
    """A (possibly unbounded) box in R^shape."""

    def __init__(self, low: Any, high: Any, shape: tuple[int, ...], dtype: Any = jnp.float32):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = jnp.dtype(dtype)
        # Bounds may be traced (they are often computed from vmapped EnvParams).
        self.low = jnp.broadcast_to(jnp.asarray(low, dtype=self.dtype), self.shape)
        self.high = jnp.broadcast_to(jnp.asarray(high, dtype=self.dtype), self.shape)
        if not isinstance(self.low, jax.core.Tracer) and not isinstance(self.high, jax.core.Tracer):
            if bool(jnp.any(self.low > self.high)):
                raise ValueError(f"Box needs low <= high, got low={low}, high={high}")

    def __repr__(self) -> str:
        if isinstance(self.low, jax.core.Tracer) or isinstance(self.high, jax.core.Tracer):
            return f"Box(shape={self.shape}, dtype={self.dtype.name})"  # bounds known only when run

        def fmt(x):
            u = np.unique(np.asarray(x))
            return f"{u[0]:g}" if u.size == 1 else "[" + ", ".join(f"{v:g}" for v in np.asarray(x).ravel()) + "]"

        return f"Box({fmt(self.low)}, {fmt(self.high)}, shape={self.shape}, dtype={self.dtype.name})"

    def sample(self, key: jax.Array) -> jax.Array:
        if jnp.issubdtype(self.dtype, jnp.integer) or self.dtype == jnp.bool_:
            lo, hi = self.low.astype(jnp.int32), self.high.astype(jnp.int32) + 1
            return jax.random.randint(key, self.shape, lo, hi).astype(self.dtype)
        # Unbounded dimensions are sampled from a standard normal, as gymnasium does.
        low, high = self.low, self.high
        finite = jnp.isfinite(low) & jnp.isfinite(high)
        k1, k2 = jax.random.split(key)
        u = jax.random.uniform(k1, self.shape, self.dtype)
        # A convex combination: `high - low` overflows to inf for bounds near float32 max.
        lo, hi = jnp.where(finite, low, 0.0), jnp.where(finite, high, 0.0)
        bounded = jnp.clip(lo * (1 - u) + hi * u, lo, hi)
        normal = jax.random.normal(k2, self.shape, self.dtype)
        return jnp.where(finite, bounded, normal).astype(self.dtype)

    def contains(self, x: Any) -> jax.Array:
        """Whether `x` has this shape, a dtype of the same kind or a narrower one (a float
        is not in an integer box), and lies within the bounds."""
        x = jnp.asarray(x)
        if x.shape != self.shape or not np.can_cast(x.dtype, self.dtype, casting="same_kind"):
            return jnp.asarray(False)
        return jnp.all((x >= self.low) & (x <= self.high))

    def check_action(self, action: Any, env_name: str) -> jax.Array:
        action = jnp.asarray(action)
        size = int(np.prod(self.shape))
        if action.shape != self.shape and not (action.size == size and action.ndim <= 1):
            raise ValueError(f"{env_name}: action has shape {action.shape}, expected {self}")
        if not (jnp.issubdtype(action.dtype, jnp.floating) or jnp.issubdtype(action.dtype, jnp.integer)):
            raise TypeError(f"{env_name}: action has dtype {action.dtype}, expected {self}")
        return action.reshape(self.shape).astype(self.dtype)


class Key(Space):
    """Typed PRNG keys (`jax.random.key`) of a shape: a state may carry its own key."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = None

    def __repr__(self) -> str:
        return f"Key(shape={self.shape})"

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.split(key, self.shape) if self.shape else jax.random.split(key)[0]

    def contains(self, x: Any) -> jax.Array:
        ok = hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key) and x.shape == self.shape
        return jnp.asarray(ok)


class Dict(Space):
    """A dictionary of named sub-spaces."""

    def __init__(self, spaces: Mapping[str, Space]):
        self.spaces = dict(spaces)
        self.shape = ()
        self.dtype = None

    def __repr__(self) -> str:
        return "Dict(" + ", ".join(f"{k}: {v}" for k, v in self.spaces.items()) + ")"

    def sample(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, len(self.spaces))
        return {k: s.sample(kk) for (k, s), kk in zip(self.spaces.items(), keys)}

    def contains(self, x: Any) -> jax.Array:
        """Whether `x` (a mapping, or a pytree such as an `EnvState`, read by `as_mapping`)
        has exactly these keys and every value lies in its space."""
        if not isinstance(x, Mapping) and not isinstance(x, (jax.Array, np.ndarray)):
            x = as_mapping(x)
        if not isinstance(x, Mapping) or set(x) != set(self.spaces):
            return jnp.asarray(False)
        ok = jnp.asarray(True)
        for k, s in self.spaces.items():
            ok = ok & s.contains(x[k])
        return ok

    def check_action(self, action: Any, env_name: str) -> dict:
        if not isinstance(action, Mapping) or set(action) != set(self.spaces):
            raise ValueError(f"{env_name}: action must be a dict with keys {sorted(self.spaces)}")
        return {k: s.check_action(action[k], env_name) for k, s in self.spaces.items()}


class Tuple(Space):
    """A fixed-length tuple of sub-spaces (gymnax's `Tuple`): values are tuples, one per space."""

    def __init__(self, spaces: Sequence[Space]):
        self.spaces = tuple(spaces)
        self.shape = ()
        self.dtype = None

    def __repr__(self) -> str:
        return "Tuple(" + ", ".join(repr(s) for s in self.spaces) + ")"

    def __len__(self) -> int:
        return len(self.spaces)

    def sample(self, key: jax.Array) -> tuple:
        keys = jax.random.split(key, len(self.spaces))
        return tuple(s.sample(k) for s, k in zip(self.spaces, keys))

    def contains(self, x: Any) -> jax.Array:
        """Whether `x` is a tuple or list of this length whose items lie in their spaces."""
        if not isinstance(x, (tuple, list)) or len(x) != len(self.spaces):
            return jnp.asarray(False)
        ok = jnp.asarray(True)
        for s, item in zip(self.spaces, x):
            ok = ok & s.contains(item)
        return ok

    def check_action(self, action: Any, env_name: str) -> tuple:
        if not isinstance(action, (tuple, list)) or len(action) != len(self.spaces):
            raise ValueError(f"{env_name}: action must be a tuple of {len(self.spaces)} values, one per space of "
                             f"{self!r}")
        return tuple(s.check_action(a, env_name) for s, a in zip(self.spaces, action))
