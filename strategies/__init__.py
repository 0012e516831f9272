"""popeval.strategies: evolution strategies as optax-style ask/tell functions, and the
sharded, checkpointed evolve loop, in two sub-packages:

    algorithms/   the strategies (evosax's algorithms, EGGROLL) behind one interface, by name
    run/          an experiment: config, compiled programs, run directory, the loop

`run/` builds on `algorithms/`, never the reverse.
"""

from .algorithms import Strategy, StrategyState, cma_es, eggroll, make_strategy, openai_es, strategy_names
from .algorithms.shaping import FITNESS_SHAPING, centered_rank, identity, sanitize_fitness, z_score
from .run.config import EvolveConfig, RunOptions, load_config, parse_overrides
from .run.evolve import default_sinks, evolve
from .run.programs import EvolveState, build
from .run.run_dir import load_policy

__all__ = [
    "FITNESS_SHAPING", "Strategy", "StrategyState", "centered_rank", "cma_es", "eggroll", "identity",
    "make_strategy", "openai_es", "sanitize_fitness", "strategy_names", "z_score",
    "EvolveConfig", "RunOptions", "EvolveState", "build", "default_sinks", "evolve", "load_config",
    "load_policy", "parse_overrides",
]
