"""popeval.strategies: evosax's evolution strategies as optax-style ask/tell functions,
and the sharded, checkpointed evolve loop."""

from .core import (
    FITNESS_SHAPING,
    Strategy,
    StrategyState,
    centered_rank,
    cma_es,
    identity,
    make_strategy,
    openai_es,
    sanitize_fitness,
    strategy_names,
    z_score,
)
from .evolve import EvolveConfig, EvolveState, build, evolve, load_config, load_policy

__all__ = [
    "FITNESS_SHAPING", "Strategy", "StrategyState", "centered_rank", "cma_es", "identity",
    "make_strategy", "openai_es", "sanitize_fitness", "strategy_names", "z_score",
    "EvolveConfig", "EvolveState", "build", "evolve", "load_config", "load_policy",
]
