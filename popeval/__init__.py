"""popeval: evaluate populations of neural-network controllers on pure-JAX environments.

The top-level namespace is small: `make`, `RolloutWrapper`, the policies, `LowRankPopulation`,
`evolve` and the strategy factories. (The engine modules never import `popeval.strategies`;
this namespace and the command line are the application layer that ties both together.)
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: The module of each top-level name. Names load on first use: JAX's import takes a second,
#: evosax's more, and `popeval.cli` must run (to answer Ctrl-C in one line) before either.
_LAZY = {
    "make": "environments", "registered_envs": "environments", "MLPPolicy": "policies", "CNNPolicy": "policies",
    "LSTMPolicy": "policies", "ParamReshaper": "policies", "RolloutWrapper": "rollout", "FitnessResult": "rollout",
    "LowRankPopulation": "low_rank",
    **dict.fromkeys(("evolve", "EvolveConfig", "RunOptions", "openai_es", "cma_es", "make_strategy", "load_config"),
                    "strategies"),
}

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from popeval.environments import make, registered_envs
    from popeval.low_rank import LowRankPopulation
    from popeval.policies import CNNPolicy, LSTMPolicy, MLPPolicy, ParamReshaper
    from popeval.rollout import FitnessResult, RolloutWrapper
    from popeval.strategies import EvolveConfig, RunOptions, cma_es, evolve, load_config, make_strategy, openai_es


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"popeval.{_LAZY[name]}"), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"popeval.{name}") is not None:
        value = importlib.import_module(f"popeval.{name}")  # `popeval.environments` after `import popeval`
    else:
        raise AttributeError(f"module 'popeval' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "make", "registered_envs", "RolloutWrapper", "FitnessResult", "LowRankPopulation", "MLPPolicy", "CNNPolicy",
    "LSTMPolicy", "ParamReshaper", "evolve", "EvolveConfig", "RunOptions", "openai_es", "cma_es", "make_strategy",
    "load_config",
]
