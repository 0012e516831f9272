"""popeval: evaluate populations of neural-network controllers on pure-JAX environments."""

from popeval.environments import make, registered_envs

__all__ = ["make", "registered_envs"]
__version__ = "0.1.0"
