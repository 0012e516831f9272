"""Checks that environments share: constructor arguments and range-checked `EnvParams`.

Shape-defining constructor arguments are checked with `check_int`.

Every environment's `EnvParams` is a `params_dataclass`: a flax struct dataclass whose
`replace` checks every field declared with `bounded(...)` (a number, or an array of numbers,
in a range; NaN and infinities are always refused) or `flag(...)` (a bool), and then calls the class's
`check_values()`, if any (cross-field rules). `make` builds the default params and
`replace`s the overrides, so `make("CartPole-v1", masspole=-1.0)` and
`params.replace(masspole=-1.0)` raise a `ValueError` naming the environment, the field and
the allowed range.

The check runs on concrete values only: traced values inside `jit`/`vmap` are skipped, and
so is a params object with a `None` field, which is an `in_axes`/`out_axes` spec (e.g.
`jax.tree.map(lambda _: None, params).replace(masspole=0)`), not parameters. It runs only in
`replace`: JAX rebuilds pytrees through `__init__` with arbitrary leaves (tracers, `in_axes`
specs such as 0 or None), so `__init__` must not validate; batches built by `jax.tree.map`
or `vmap` therefore pass through, and a batch's `replace` checks every member.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["bounded", "check_default_params", "check_int", "check_params", "flag", "params_dataclass", "params_name"]


def check_int(owner: str, name: str, value: Any, minimum: int) -> int:
    """Returns `value` as an int, or raises a ValueError naming `owner` and the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_default_params(params: Any, owner: str) -> Any:
    """Returns `params` when it is an instance of a dataclass (an `EnvParams`); otherwise
    raises a TypeError naming `owner`: a dict or None has no fields to override or vmap."""
    if not dataclasses.is_dataclass(params) or isinstance(params, type):
        raise TypeError(f"{owner}: default_params must return an EnvParams instance (a flax struct dataclass, "
                        f"e.g. `@struct.dataclass class MyParams(EnvParams)`), got {type(params).__name__} "
                        f"{str(params)[:60]}")
    return params


def bounded(
    default: Any = dataclasses.MISSING,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    open_low: bool = False,
    default_factory: Any = dataclasses.MISSING,
):
    """An `EnvParams` field whose values must lie in `[low, high]` (`(low, high]` if `open_low`).

    With the default bounds only NaN and infinities are refused. `default` may be left out for a required
    (array) field, or replaced by `default_factory`.
    """
    return struct.field(
        default=default, default_factory=default_factory, metadata={"bounds": (low, high, open_low)}
    )


def flag(default: bool):
    """An `EnvParams` field that must hold bools (Python, numpy or JAX)."""
    return struct.field(default=default, metadata={"flag": True})


def _env_id(params_cls: type) -> str | None:
    """The id of the environment class whose `default_params` is annotated `params_cls`: a class
    with its own `env_id` in the module that defines `params_cls` (one environment per file)."""
    module = sys.modules.get(params_cls.__module__)
    for cls in list(vars(module).values()) if module else ():
        env_id = vars(cls).get("env_id") if isinstance(cls, type) else None
        fget = getattr(getattr(cls, "default_params", None), "fget", None)
        if env_id is None or fget is None:
            continue
        try:
            hints = typing.get_type_hints(fget)
        except (NameError, TypeError):  # an annotation that does not resolve: not this one
            continue
        if hints.get("return") is params_cls:
            return env_id
    return None


def params_name(params: Any) -> str:
    """`"CartPole-v1 (cartpole.EnvParams)"`: how error messages name a params object."""
    cls = type(params)
    short = f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__qualname__}"
    env_id = _env_id(cls)
    return f"{env_id} ({short})" if env_id else short


def _dtype(leaf: Any) -> np.dtype:
    return leaf.dtype if isinstance(leaf, jax.Array) else np.asarray(leaf).dtype


def _extremes(leaf: Any) -> tuple[float, float, bool] | None:
    """(min, max, any NaN) of a concrete leaf; None if empty. JAX arrays reduce on device."""
    xp, x = (jnp, leaf) if isinstance(leaf, jax.Array) else (np, np.asarray(leaf))
    if x.size == 0:
        return None
    if x.dtype == np.bool_:
        x = x.astype(np.int32)
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise TypeError(f"dtype {x.dtype}")
    nan = np.issubdtype(x.dtype, np.floating) and bool(xp.any(xp.isnan(x)))
    return float(xp.min(x)), float(xp.max(x)), nan


#: int32's range: an integer field becomes an int32 array in jitted code.
_INT32 = (-(2**31), 2**31 - 1)


def _is_int_field(f: dataclasses.Field) -> bool:
    """Whether the field is annotated `int` or a tuple of ints (`tuple[int, int]`)."""
    hint = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return hint == "int" or (hint.startswith("tuple[int") and "float" not in hint)


def _number(x: float) -> str:
    """A bound as written: `2147483647`, not `2.14748e+09`."""
    return str(int(x)) if math.isfinite(x) and x == int(x) and abs(x) >= 1e6 else f"{x:g}"


def _integral(leaf: Any) -> bool:
    """Whether every value of a concrete numeric leaf is a whole number."""
    x = np.asarray(leaf)
    return not np.issubdtype(x.dtype, np.floating) or bool(np.all(np.isfinite(x) & (x == np.round(x))))


def _check_bounded(params: Any, f: dataclasses.Field, value: Any, leaves: list) -> None:
    """Raises `ValueError` if a concrete `bounded` field is not a number (an integer for an
    `int` field) in its range."""
    low, high, open_low = f.metadata["bounds"]
    integer = _is_int_field(f)
    if integer:
        low, high = max(low, _INT32[0]), min(high, _INT32[1])
    opening, closing = "(" if open_low or math.isinf(low) else "[", ")" if math.isinf(high) else "]"
    interval = f"{opening}{_number(low)}, {_number(high)}{closing}"
    kind = "an integer" if integer else "a number"
    for leaf in leaves:
        try:
            extremes = _extremes(leaf)
        except (TypeError, ValueError):
            raise ValueError(
                f"{params_name(params)}: {f.name}={value!r} must be {kind} (or an array "
                f"of them) in {interval}"
            ) from None
        if extremes is None:
            continue
        lo, hi, nan = extremes
        wrong = "NaN" if nan else "infinite" if math.isinf(lo) or math.isinf(hi) else None
        if wrong or not ((lo > low if open_low else lo >= low) and hi <= high):
            expected = kind if integer else "finite values" if wrong == "infinite" else "values"
            raise ValueError(
                f"{params_name(params)}: {f.name}={value!r} is {wrong or 'out of range'}, "
                f"expected {expected} in {interval}"
            )
        if integer and not _integral(leaf):
            raise ValueError(f"{params_name(params)}: {f.name}={value!r} must be an integer in {interval}")


def check_params(params: Any) -> Any:
    """Raises `ValueError` if a concrete `bounded` or `flag` field of `params` is invalid
    (out of its range, NaN, or for an `int` field not a whole number in int32's range).

    Returns:
        `params`, unchanged.
    """
    fields = dataclasses.fields(params)
    values = {f.name: getattr(params, f.name) for f in fields}
    if any(v is None for v in values.values()):
        return params  # an in_axes / out_axes spec, not parameters
    for f in fields:
        if "bounds" not in f.metadata and "flag" not in f.metadata:
            continue
        value = values[f.name]
        leaves = jax.tree.leaves(value)
        if not leaves or any(isinstance(v, jax.core.Tracer) for v in leaves):
            continue
        if "flag" in f.metadata:
            if not all(_dtype(v) == np.bool_ for v in leaves):
                raise ValueError(f"{params_name(params)}: {f.name}={value!r} must be a bool (True or False)")
            continue
        _check_bounded(params, f, value, leaves)
    if hasattr(params, "check_values") and not any(
        isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(params)
    ):
        params.check_values()  # cross-field checks of concrete params
    return params


def params_dataclass(cls):
    """`flax.struct.dataclass` whose `replace` checks the `bounded` and `flag` fields."""
    cls = struct.dataclass(cls)

    def replace(self, **updates):
        return check_params(dataclasses.replace(self, **updates))

    cls.replace = replace
    return cls
