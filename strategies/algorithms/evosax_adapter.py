"""evosax's algorithms as popeval `Strategy`s: optax-style pure functions.

    strategy = openai_es(pop_size=256, solution=params, learning_rate=0.05, std_init=0.1)
    state = strategy.init(key, params)
    population, state = strategy.ask(key, state)       # pytree, leading axis pop_size
    state, metrics = strategy.tell(state, population, fitness)   # higher fitness is better

The maths is evosax's (Salimans et al. 2017, OpenAI-ES; Hansen 2016, CMA-ES; and every other
algorithm in `evosax.algorithms`); this module only adapts the interface: pytree solutions,
fitness shaping chosen by name, non-finite fitness ranked worst, and the one sign flip from
popeval's maximisation to evosax's minimisation. The per-member form of the Gaussian
strategies (`Strategy.members`): `member_sampling`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from evosax import algorithms as evosax_algorithms
from evosax.core import fitness_shaping as evosax_shaping
from jax.flatten_util import ravel_pytree

from . import base
from .base import Hyperparameters, Strategy, StrategyState, check_hyperparameters, check_shaping, strong
from .member_sampling import member_sampling
from .shaping import FITNESS_SHAPING, sanitize_fitness

__all__ = ["evosax_strategy", "names", "supported", "openai_es", "cma_es"]


def names() -> dict[str, str]:
    """`{name or alias: evosax algorithm}` of every evosax algorithm (popeval runs the `supported` ones)."""
    return {**{k: k for k in evosax_algorithms.algorithms}, **ALIASES}


def supported() -> list[str]:
    """The evosax algorithms and aliases popeval runs (single-mean algorithms)."""
    return sorted(k for k, v in names().items() if v in _CONSTRUCTOR)


ALIASES = {"openai_es": "Open_ES", "cma_es": "CMA_ES", "snes": "SNES", "pgpe": "PGPE",
            "ars": "ARS", "sep_cma_es": "Sep_CMA_ES", "simple_ga": "SimpleGA"}


# What evosax's constructors take beyond (population_size, solution, fitness_shaping_fn,
# metrics_fn). evosax's public API does not say which algorithm takes an optax optimizer, a
# std schedule or antithetic sampling, nor which ones weight ranks themselves, so this table
# does (tests/strategies/test_strategies.py checks it against the installed evosax). Weighted: the
# default fitness shaping is evosax's recombination weights (CMA-ES and kin).
_CONSTRUCTOR: dict[str, tuple[str, ...]] = {
    "ARS": ("optimizer", "std_schedule"),
    "ASEBO": ("subspace_dims", "optimizer", "std_schedule"),
    "CMAAnchoredLES": ("params", "params_path"),
    "CMA_ES": (),
    "CR_FM_NES": (),
    "DES": ("optimizer",),
    "DifferentialEvolution": ("num_diff",),
    "DiffusionEvolution": ("num_generations", "fitness_mapping", "alpha_schedule", "num_latent_dims"),
    "ESMC": ("optimizer", "std_schedule"),
    "EvoTF_ES": ("max_context_len", "model_config", "solution_config", "fitness_config",
                 "distrib_config", "use_antithetic_sampling", "params", "params_path"),
    "GESMR_GA": ("num_groups",),
    "GradientlessDescent": (),
    "GuidedES": ("subspace_dims", "optimizer", "std_schedule"),
    "HillClimbing": ("std_schedule",),
    "LES": ("params", "params_path"),
    "LGA": ("params", "params_path", "mutation_feature_encoding"),
    "LM_MA_ES": (),
    "MA_ES": (),
    "MR15_GA": (),
    "NoiseReuseES": ("optimizer", "std_schedule"),
    "Open_ES": ("use_antithetic_sampling", "optimizer", "std_schedule"),
    "PGPE": ("optimizer",),
    "PSO": (),
    "PersistentES": ("optimizer", "std_schedule"),
    "RandomSearch": ("sampling_fn",),
    "Rm_ES": ("m",),
    "SAMR_GA": (),
    "SNES": ("optimizer",),
    "Sep_CMA_ES": (),
    "SimpleES": ("optimizer",),
    "SimpleGA": ("std_schedule",),
    "SimulatedAnnealing": ("std_schedule",),
    "iAMaLGaM_Full": ("std_schedule",),
    "iAMaLGaM_Univariate": ("std_schedule",),
    "xNES": ("optimizer",),
}
#: popeval's defaults where evosax's would surprise (one set, used by `make_strategy`, the
#: `openai_es` / `cma_es` factories and so every config): Salimans et al.'s OpenAI-ES settings
#: and CMA-ES's usual initial step size for standardised parameters.
_DEFAULTS = {
    "Open_ES": {"learning_rate": 0.05, "std_init": 0.1},
    "CMA_ES": {"std_init": 0.5},
}
_WEIGHTED = frozenset({"CMA_ES", "CR_FM_NES", "DES", "LM_MA_ES", "MA_ES", "Rm_ES", "SNES",
                       "Sep_CMA_ES", "SimpleES", "xNES"})


def evosax_strategy(
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
    """The evosax algorithm `name` (or alias, `names()`) as a `Strategy`: `make_strategy`'s
    arguments (`popeval.strategies.algorithms`)."""
    cls = evosax_algorithms.algorithms[names()[name]]
    defaults = _DEFAULTS.get(cls.__name__, {})
    hyper = Hyperparameters(
        learning_rate=defaults.get("learning_rate") if learning_rate is None else learning_rate,
        lr_decay=lr_decay, lr_min=lr_min, optimizer=optimizer,
        std_init=defaults.get("std_init") if std_init is None else std_init,
        std_decay=std_decay, std_min=std_min,
    )
    _check(cls.__name__, hyper, fitness_shaping, pop_size, kwargs)
    takes = _CONSTRUCTOR[cls.__name__]
    ctor = {arg: build(hyper) for arg, build in _BUILT_ARGUMENTS.items() if arg in takes}
    if "optimizer" not in takes and hyper.learning_rate is not None:
        raise ValueError(f"{cls.__name__} takes no learning_rate")
    ctor["fitness_shaping_fn"] = shaping_fn = _shaping_fn(cls.__name__, fitness_shaping)
    ctor.update({k: v for k, v in kwargs.items() if k in takes})
    try:
        algo = cls(population_size=int(pop_size), solution=solution, **ctor)
    except AssertionError as e:  # evosax checks its arguments with asserts
        raise ValueError(f"{cls.__name__} with pop_size={pop_size}: {e}") from None
    param_fields = {k: v for k, v in kwargs.items() if k not in takes}
    if hyper.std_init is not None and "std_schedule" not in takes:
        param_fields.setdefault("std_init", hyper.std_init)
    evo_params = _evo_params(algo, param_fields, takes)
    _, unravel = ravel_pytree(solution)
    init, ask, tell, mean = _functions(algo, evo_params, unravel, hyper.std_init)
    members = member_sampling(algo, shaping_fn, unravel, member_chunk, strong)
    return Strategy(init, ask, tell, mean, cls.__name__, int(pop_size), int(algo.num_dims), members)


def _check(algorithm: str, hyper: Hyperparameters, fitness_shaping: str, pop_size: int, kwargs: dict) -> None:
    """Refuses bad hyperparameters, an unsupported algorithm, an unknown shaping and a bad
    `pop_size` (before evosax sees them)."""
    check_hyperparameters(algorithm, hyper)
    if algorithm not in _CONSTRUCTOR:
        raise ValueError(f"{algorithm} is not supported by popeval (multi-population strategies "
                         f"evolve several means at once); supported: {', '.join(sorted(_CONSTRUCTOR))}")
    check_shaping(fitness_shaping)
    if int(pop_size) < 2:
        raise ValueError(f"pop_size must be >= 2, got {pop_size}")
    antithetic = "use_antithetic_sampling" in _CONSTRUCTOR[algorithm] and kwargs.get("use_antithetic_sampling", True)
    if antithetic and pop_size % 2:
        raise ValueError(f"{algorithm} samples antithetic pairs: pop_size must be even, got {pop_size}")


#: evosax constructor arguments that popeval builds from its own hyperparameters.
_BUILT_ARGUMENTS = {"optimizer": base.optimizer, "std_schedule": base.std_schedule}


def _shaping_fn(algorithm: str, fitness_shaping: str) -> Callable:
    """evosax's fitness-shaping hook running popeval's shaping `fitness_shaping`.

    evosax receives the raw (sanitised, negated) fitness, so that its best-solution tracking,
    which is the "mean" policy of population-based algorithms, follows returns; popeval's
    shaping runs inside evosax's shaping hook. Rank-weighted algorithms (CMA-ES and kin) keep
    evosax's weights after it (popeval's shaping is monotone: same ranks)."""
    own = evosax_shaping.identity_fitness_shaping_fn
    if algorithm in _WEIGHTED:
        own = evosax_shaping.weights_fitness_shaping_fn
    shape = FITNESS_SHAPING[fitness_shaping]

    def shaping_fn(population, fitness, state, params):
        return own(population, -shape(-fitness), state, params)  # popeval shapes maximised values

    return shaping_fn


def _evo_params(algo: Any, param_fields: dict, takes: tuple[str, ...]) -> Any:
    """evosax's default params of `algo` with `param_fields` replaced (unknown fields refused)."""
    evo_params = algo.default_params
    known = set(getattr(evo_params, "__dataclass_fields__", {}))
    unknown = sorted(set(param_fields) - known)
    if unknown:
        raise ValueError(
            f"{type(algo).__name__}: unknown hyperparameter(s) {unknown}; constructor arguments: "
            f"{sorted(takes)}, params: {sorted(known)}"
        )
    if param_fields:
        evo_params = evo_params.replace(**param_fields)
    return evo_params


def _functions(algo: Any, evo_params: Any, unravel: Callable, std_init: float | None):
    """`(init, ask, tell, mean)` of a `Strategy` over the evosax algorithm `algo`."""
    # Distribution-based algorithms expose their mean (`get_mean`); population-based ones
    # track the best member seen (`best_solution` of their state), which popeval calls the mean.
    distribution = hasattr(algo, "get_mean")

    def init(key: jax.Array, mean_params: Any) -> StrategyState:
        key_init, key_pop, key_tell = jax.random.split(key, 3)
        if distribution:
            evo_state = algo.init(key_init, mean_params, evo_params)
        else:
            flat, _ = ravel_pytree(mean_params)
            std = 1.0 if std_init is None else std_init
            pop = flat + std * jax.random.normal(key_pop, (algo.population_size, algo.num_dims))
            evo_state = algo.init(key_init, jax.vmap(unravel)(pop), jnp.full((algo.population_size,), jnp.inf),
                                  evo_params)
        return strong(StrategyState(evo_state=evo_state, evo_params=evo_params, key=key_tell))

    def ask(key: jax.Array, state: StrategyState):
        population, evo_state = algo.ask(key, state.evo_state, state.evo_params)
        return population, state.replace(evo_state=evo_state)

    def tell(state: StrategyState, population: Any, fitness: jax.Array):
        fitness, nonfinite = sanitize_fitness(jnp.asarray(fitness, jnp.float32))
        key, key_tell = jax.random.split(state.key)
        evo_fitness = -fitness  # evosax minimises; popeval maximises returns.
        evo_state, _ = algo.tell(key_tell, population, evo_fitness, state.evo_state, state.evo_params)
        new = strong(state.replace(evo_state=evo_state, key=key), like=state)
        return new, {"nonfinite/count": nonfinite}

    def mean(state: StrategyState) -> Any:
        if distribution:
            return algo.get_mean(state.evo_state)
        return unravel(state.evo_state.best_solution)

    return init, ask, tell, mean


def openai_es(pop_size: int, solution: Any, *, learning_rate: float | None = None, std_init: float | None = None,
              fitness_shaping: str = "centered_rank", **kwargs: Any) -> Strategy:
    """OpenAI-ES (Salimans et al., 2017) with Adam and antithetic sampling (evosax `Open_ES`);
    learning rate 0.05 and std 0.1 unless given."""
    return evosax_strategy("Open_ES", pop_size, solution, fitness_shaping,
                           learning_rate=learning_rate, std_init=std_init, **kwargs)


def cma_es(pop_size: int, solution: Any, *, std_init: float | None = None,
           fitness_shaping: str = "none", **kwargs: Any) -> Strategy:
    """CMA-ES (Hansen, 2016) with evosax's recombination weights (evosax `CMA_ES`)."""
    return evosax_strategy("CMA_ES", pop_size, solution, fitness_shaping, std_init=std_init, **kwargs)
