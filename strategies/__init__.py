"""popeval.strategies: evosax's evolution strategies as optax-style ask/tell functions,
and the sharded, checkpointed evolve loop.

    shaping.py    fitness shaping (centred ranks, z-scores) and non-finite fitness
    strategy.py   make_strategy / openai_es / cma_es: evosax behind init, ask, tell, mean
    eggroll.py    eggroll: EGGROLL over low-rank populations (popeval.low_rank), popeval's own
    config.py     EvolveConfig (what is evolved, saved with a run), RunOptions (how it runs)
    programs.py   build(config) and the compiled init / generation / evaluation programs
    run_dir.py    a run directory's files, starting or resuming one, load_policy
    evolve.py     the loop: programs + sinks + checkpoints
"""

from .config import EvolveConfig, RunOptions, load_config, parse_overrides
from .eggroll import eggroll
from .evolve import default_sinks, evolve
from .programs import EvolveState, build
from .run_dir import load_policy
from .shaping import FITNESS_SHAPING, centered_rank, identity, sanitize_fitness, z_score
from .strategy import Strategy, StrategyState, cma_es, make_strategy, openai_es, strategy_names

__all__ = [
    "FITNESS_SHAPING", "Strategy", "StrategyState", "centered_rank", "cma_es", "eggroll", "identity",
    "make_strategy", "openai_es", "sanitize_fitness", "strategy_names", "z_score",
    "EvolveConfig", "RunOptions", "EvolveState", "build", "default_sinks", "evolve", "load_config",
    "load_policy", "parse_overrides",
]
