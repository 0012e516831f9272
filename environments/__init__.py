"""popeval.environments: pure-JAX reinforcement-learning environments.

    from popeval.environments import make
    env, env_params = make("CartPole-v1")
    obs, state = env.reset(key, env_params)
    obs, state, reward, done, info = env.step(key, state, action, env_params)
    frames = render(env, env_params, [state])   # RGB frames; see popeval.environments.rendering
"""

from . import spaces
from .environment import Environment, EnvParams, EnvState
from .registry import REGISTRY, make, register, registered_envs
from .wrappers import SixValueStep

__all__ = ["EnvParams", "EnvState", "Environment", "REGISTRY", "SixValueStep", "Visualizer", "make",
           "register", "registered_envs", "render", "spaces"]


def __getattr__(name):  # rendering (and Pillow) is loaded on first use
    if name in {"Visualizer", "render"}:
        from . import rendering

        return getattr(rendering, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
