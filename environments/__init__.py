"""popeval.environments: pure-JAX reinforcement-learning environments.

    from popeval.environments import make
    env, env_params = make("CartPole-v1")
    obs, state = env.reset(key, env_params)
    obs, state, reward, done, info = env.step(key, state, action, env_params)
"""

from . import spaces
from .environment import Environment
from .registry import REGISTRY, make, registered_envs

__all__ = ["Environment", "REGISTRY", "make", "registered_envs", "spaces"]
