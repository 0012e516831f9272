"""What every strategy family shares: the `Strategy` interface, the hyperparameters popeval
names the same in every family (learning rate, optimizer, std and their schedules) with their
checks, and dtype hygiene for jitted loops."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from popeval.environments.hints import did_you_mean

from .shaping import FITNESS_SHAPING

__all__ = ["Strategy", "StrategyState", "Hyperparameters", "optimizer_names", "check_hyperparameters",
           "check_shaping", "optimizer", "std_schedule", "strong"]


@struct.dataclass
class StrategyState:
    evo_state: Any  # evosax's state (flat vectors, minimisation)
    evo_params: Any  # evosax's params
    key: jax.Array  # for evosax's tell, which takes a key


class Strategy(NamedTuple):
    """A strategy: pure functions over a `StrategyState` pytree."""

    init: Callable[[jax.Array, Any], StrategyState]
    ask: Callable[[jax.Array, StrategyState], tuple[Any, StrategyState]]
    tell: Callable[[StrategyState, Any, jax.Array], tuple[StrategyState, dict]]
    mean: Callable[[StrategyState], Any]  # the distribution mean (or best member), a pytree
    name: str
    pop_size: int
    num_dims: int
    members: Any = None  # `member_sampling.MemberSampling`: the per-member form (Open_ES, SNES, PGPE)


class Hyperparameters(NamedTuple):
    """`make_strategy`'s own hyperparameters, popeval's defaults applied."""

    learning_rate: float | None
    lr_decay: float
    lr_min: float
    optimizer: str
    std_init: float | None
    std_decay: float
    std_min: float


#: (hyperparameter, its rule, the rule in words) for `check_hyperparameters`.
RULES = (
    ("learning_rate", lambda v: v > 0, "> 0"),
    ("std_init", lambda v: v > 0, "> 0"),
    ("lr_decay", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("std_decay", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("lr_min", lambda v: v >= 0, ">= 0"),
    ("std_min", lambda v: v >= 0, ">= 0"),
)


@functools.cache
def optimizer_names() -> tuple[str, ...]:
    """The optax optimizers `make_strategy(optimizer=...)` takes: optax's functions whose
    first argument is the learning rate (`adam`, `sgd`, ...)."""
    names = []
    for name in dir(optax):
        fn = getattr(optax, name)
        # scale_by_* are building blocks, and L-BFGS's update needs the loss function.
        if name.startswith(("_", "scale_by_")) or name == "lbfgs" or not inspect.isfunction(fn):
            continue
        params = list(inspect.signature(fn).parameters)
        if params[:1] == ["learning_rate"]:
            names.append(name)
    return tuple(sorted(names))


def check_hyperparameters(algorithm: str, hyper: Hyperparameters) -> None:
    """Refuses a learning rate, std or decay out of its range (`RULES`) and an unknown optimizer."""
    for what, ok, rule in RULES:
        value = getattr(hyper, what)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or not ok(value)):
            raise ValueError(f"{algorithm}: {what} must be a finite number {rule}, got {value!r}")
    if hyper.optimizer not in optimizer_names():
        raise ValueError(f"{algorithm}: optimizer must be an optax optimizer name, got {hyper.optimizer!r}"
                         f"{did_you_mean(str(hyper.optimizer), optimizer_names())}; known: "
                         f"{', '.join(optimizer_names())}")


def check_shaping(fitness_shaping: str) -> None:
    if fitness_shaping not in FITNESS_SHAPING:
        raise ValueError(
            f"Unknown fitness_shaping {fitness_shaping!r}; choose from {sorted(FITNESS_SHAPING)}"
        )


def optimizer(hyper: Hyperparameters):
    """The optax optimizer of a gradient-based algorithm, its learning rate decayed if asked."""
    lr = 1e-2 if hyper.learning_rate is None else hyper.learning_rate
    if hyper.lr_decay != 1.0:
        lr = optax.exponential_decay(lr, transition_steps=1, decay_rate=hyper.lr_decay, end_value=hyper.lr_min)
    return getattr(optax, hyper.optimizer)(lr)


def std_schedule(hyper: Hyperparameters):
    """The search std by generation: `std_init`, decayed to `std_min` if asked."""
    std_init = 1.0 if hyper.std_init is None else hyper.std_init
    if hyper.std_decay == 1.0:
        return optax.constant_schedule(std_init)
    return lambda step: jnp.maximum(std_init * hyper.std_decay**step, hyper.std_min)


def strong(tree: Any, like: Any = None) -> Any:
    """Drops weak types (and matches `like`'s dtypes) so a jitted loop never recompiles."""
    if like is None:
        return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.result_type(x)), tree)
    return jax.tree.map(lambda x, y: jnp.asarray(x, dtype=jnp.result_type(y)), tree, like)
