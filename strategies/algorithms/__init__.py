"""The evolution strategies: one module of maths per family behind one interface.

    base.py             the `Strategy` interface, the shared hyperparameters and their checks
    shaping.py          fitness shaping (centred ranks, z-scores) and non-finite fitness
    evosax_adapter.py   evosax's algorithms (OpenAI-ES, CMA-ES, SNES, ...) as `Strategy`s
    member_sampling.py  the per-member ask and tell of evosax's Gaussian strategies
    eggroll.py          EGGROLL over low-rank populations (popeval.low_rank), popeval's own

`make_strategy(name, ...)` finds a strategy by name in `FAMILIES`.
"""

from __future__ import annotations

from typing import Any

from popeval.environments.hints import did_you_mean

from . import eggroll as eggroll_family
from . import evosax_adapter
from .base import Strategy, StrategyState
from .eggroll import eggroll
from .evosax_adapter import cma_es, openai_es

__all__ = ["FAMILIES", "Strategy", "StrategyState", "make_strategy", "strategy_names", "openai_es", "cma_es", "eggroll"]


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


#: `make_strategy`'s own keyword defaults: the ones an EGGROLL call left as they are.
_MAKE_DEFAULTS = dict(learning_rate=None, lr_decay=1.0, lr_min=0.0, optimizer="adam", std_init=None, std_decay=1.0,
                      std_min=0.0, member_chunk=None)


def _eggroll(name: str, pop_size: int, solution: Any, fitness_shaping: str, **given: Any) -> Strategy:
    """`make_strategy("eggroll", ...)`: `eggroll` with the hyperparameters given, others refused."""
    chosen = {k: v for k, v in given.items()
              if not (k in _MAKE_DEFAULTS and type(v) is type(_MAKE_DEFAULTS[k]) and v == _MAKE_DEFAULTS[k])}
    unknown = sorted(set(chosen) - set(eggroll_family.HYPERPARAMETERS))
    if unknown:
        raise ValueError(f"{eggroll_family.NAME}: unknown hyperparameter(s) {unknown}; it takes "
                         f"{', '.join(eggroll_family.HYPERPARAMETERS)} (sigma is its std)")
    return eggroll(pop_size, solution, fitness_shaping=fitness_shaping, **chosen)


def _evosax(name: str, pop_size: int, solution: Any, fitness_shaping: str, **kwargs: Any) -> Strategy:
    canonical = {_key(k): k for k in evosax_adapter.names()}[_key(name)]
    return evosax_adapter.evosax_strategy(canonical, pop_size, solution, fitness_shaping, **kwargs)


#: Strategy families by name (case, `-` and `_` ignored): `factory(name, pop_size, solution,
#: fitness_shaping, **hyperparameters) -> Strategy`.
FAMILIES = {**{_key(k): _evosax for k in evosax_adapter.names()}, "eggroll": _eggroll}


def strategy_names() -> list[str]:
    """Names accepted by `make_strategy` (evosax's single-mean algorithms, their aliases, eggroll)."""
    return sorted([*evosax_adapter.supported(), "eggroll"])


def make_strategy(
    name: str,
    pop_size: int,
    solution: Any,
    fitness_shaping: str = "centered_rank",
    *,
    learning_rate: float | None = None,
    lr_decay: float = 1.0,
    lr_min: float = 0.0,
    optimizer: str = "adam",
    std_init: float | None = None,
    std_decay: float = 1.0,
    std_min: float = 0.0,
    member_chunk: int | None = None,
    **kwargs: Any,
) -> Strategy:
    """A strategy by name: any evosax algorithm, or popeval's EGGROLL.

    Args:
        name: an evosax algorithm (`"CMA_ES"`, `"Open_ES"`, `"SNES"`, `"SimpleGA"`, ...), an
            alias (`"openai_es"`, `"cma_es"`, ...) or `"eggroll"`; case, `-` and `_` are ignored.
        pop_size: population size (>= 2; even for antithetic sampling).
        solution: a parameter pytree with the shape of one solution.
        fitness_shaping: `"centered_rank"`, `"z_score"` or `"none"`, applied to the
            (maximised) fitness before the strategy sees it.
        learning_rate: the learning rate of a gradient-based algorithm (`None`: the
            algorithm's default).
        lr_decay: the learning rate's per-generation decay factor.
        lr_min: the learning rate's floor.
        optimizer: the optax optimizer of a gradient-based algorithm, by name (e.g. "adam" or
            "sgd").
        std_init: the initial search std (`None`: the algorithm's default).
        std_decay: the search std's per-generation decay factor.
        std_min: the search std's floor.
        member_chunk: members regenerated at a time by `Strategy.members.tell`; default
            `max(1, min(pop_size, 2**20 // num_dims))`.
        **kwargs: further constructor arguments or `Params` fields of the evosax algorithm.

    `"eggroll"` is popeval's own EGGROLL (`popeval.strategies.algorithms.eggroll`): it takes
    `learning_rate`, `lr_decay`, `lr_min`, `optimizer`, `member_chunk` and, in `kwargs`, `rank`
    and `sigma`; anything else is refused.
    """
    factory = FAMILIES.get(_key(name))
    if factory is None:
        raise ValueError(f"Unknown strategy {name!r}{did_you_mean(name, strategy_names())}. "
                         f"Known: {', '.join(strategy_names())}")
    hyper = dict(learning_rate=learning_rate, lr_decay=lr_decay, lr_min=lr_min, optimizer=optimizer,
                 std_init=std_init, std_decay=std_decay, std_min=std_min, member_chunk=member_chunk)
    return factory(name, pop_size, solution, fitness_shaping, **hyper, **kwargs)
