"""popeval: evaluate populations of neural-network controllers on pure-JAX environments.

The top-level namespace is small: `make`, `RolloutWrapper`, the policies, `evolve` and the
strategy factories. (The engine modules never import `popeval.strategies`; this namespace
and the command line are the application layer that ties both together.)
"""

from popeval.environments import make, registered_envs
from popeval.policies import CNNPolicy, LSTMPolicy, MLPPolicy, ParamReshaper
from popeval.rollout import FitnessResult, RolloutWrapper

__version__ = "0.1.0"


_STRATEGIES = {"evolve", "EvolveConfig", "RunOptions", "openai_es", "cma_es", "make_strategy", "load_config"}


def __getattr__(name):  # strategies are loaded on first use (evosax import is not free)
    if name in _STRATEGIES:
        from popeval import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module 'popeval' has no attribute {name!r}")


__all__ = [
    "make", "registered_envs", "RolloutWrapper", "FitnessResult", "MLPPolicy", "CNNPolicy", "LSTMPolicy",
    "ParamReshaper", "evolve", "EvolveConfig", "RunOptions", "openai_es", "cma_es", "make_strategy", "load_config",
]
