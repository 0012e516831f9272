"""The registry: one literal table from environment ids to constructors, `make`, and the
"did you mean" hint of unknown names."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

from . import compat as compat_lib
from .bsuite import (
    Catch,
    DeepSea,
    DiscountingChain,
    MemoryChain,
    MNISTBandit,
    SimpleBandit,
    UmbrellaChain,
)
from .classic_control import Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum
from .environment import Environment
from .minatar import Asterix, Breakout, Freeway, Seaquest, SpaceInvaders
from .misc import (
    BernoulliBandit,
    FourRooms,
    FrozenLake,
    GaussianBandit,
    MetaMaze,
    PointRobot,
    Pong,
    Reacher,
    Swimmer,
)

__all__ = ["REGISTRY", "close_matches", "did_you_mean", "register", "registered_envs", "make"]

#: Environment id -> constructor. The single source of truth for `make`, the CLI and tests.
REGISTRY: dict[str, Callable[..., Environment]] = {
    # classic control (gymnasium 1.x)
    "CartPole-v1": CartPole,
    "Pendulum-v1": Pendulum,
    "Acrobot-v1": Acrobot,
    "MountainCar-v0": MountainCar,
    "MountainCarContinuous-v0": MountainCarContinuous,
    # bsuite
    "Catch-bsuite": Catch,
    "DeepSea-bsuite": DeepSea,
    "MemoryChain-bsuite": MemoryChain,
    "UmbrellaChain-bsuite": UmbrellaChain,
    "DiscountingChain-bsuite": DiscountingChain,
    "SimpleBandit-bsuite": SimpleBandit,
    "MNISTBandit-bsuite": MNISTBandit,
    # misc
    "FourRooms-misc": FourRooms,
    "MetaMaze-misc": MetaMaze,
    "PointRobot-misc": PointRobot,
    "BernoulliBandit-misc": BernoulliBandit,
    "GaussianBandit-misc": GaussianBandit,
    "FrozenLake-misc": FrozenLake,
    "Pong-misc": Pong,
    "Reacher-misc": Reacher,
    "Swimmer-misc": Swimmer,
    # MinAtar
    "Breakout-MinAtar": Breakout,
    "Asterix-MinAtar": Asterix,
    "Freeway-MinAtar": Freeway,
    "SpaceInvaders-MinAtar": SpaceInvaders,
    "Seaquest-MinAtar": Seaquest,
}

#: The registered ids, in registration order (`register` appends).
registered_envs: list[str] = list(REGISTRY)


def register(env_id: str, factory: Callable[..., Environment]) -> None:
    """Registers a user-defined environment under `env_id`, for `make` and the CLI.

    Args:
        env_id: a new id, e.g. `"MyTask-v0"`.
        factory: a callable (usually the `Environment` subclass) whose keyword arguments
            are the shape-defining settings `make(env_id, **kwargs)` passes on.

    Raises:
        ValueError: `env_id` is empty or already registered (ids are never replaced).
        TypeError: `factory` is not callable.
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"an environment id must be a non-empty string, got {env_id!r}")
    if env_id in REGISTRY:
        raise ValueError(f"{env_id!r} is already registered (to {REGISTRY[env_id]!r}); pick another id")
    if not callable(factory):
        raise TypeError(f"register({env_id!r}, factory): factory must be callable, got {factory!r}")
    REGISTRY[env_id] = factory
    registered_envs.append(env_id)


def close_matches(name: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The up to `n` choices closest to `name` (difflib's ratio >= `cutoff`), best first."""
    return difflib.get_close_matches(name, list(choices), n=n, cutoff=cutoff)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """A hint naming the closest of `choices` to `name` (difflib's default cutoff, 0.6).

    Returns:
        `" (did you mean 'X'?)"`, or `""` when no choice is close.
    """
    close = close_matches(name, choices)
    return f" (did you mean {close[0]!r}?)" if close else ""


def make(env_id: str, compat: str | None = None, **kwargs: Any) -> tuple[Environment, Any]:
    """Builds an environment and its default parameters.

    Args:
        env_id: a registered id, e.g. `"CartPole-v1"` (see `registered_envs`).
        compat: `"gymnax"` for gymnax's variant of the id where it is a parameter choice
            (MinAtar without sticky actions, float32 observations and a 1000-step cap, ...;
            see `popeval.environments.compat`); `None` for the reference implementation's.
        **kwargs: constructor arguments of the environment (shape-defining settings), or
            fields of its `EnvParams` to override in the returned default params
            (e.g. `max_steps_in_episode=200`); they take precedence over the preset.

    Returns:
        `(env, env_params)`.

    Raises:
        ValueError: unknown id (with the closest ids), unknown keyword argument, or an
            `EnvParams` value out of its allowed range (see `checks.py`).
    """
    if env_id not in REGISTRY:
        close = close_matches(env_id, REGISTRY, n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"Unknown environment id {env_id!r}.{hint} Registered ids: {', '.join(REGISTRY)}"
        )
    preset = compat_lib.preset(env_id, compat)
    if preset is not None:
        kwargs = {**preset.env_kwargs, **preset.params, **kwargs}
    ctor = REGISTRY[env_id]
    ctor_args = {
        name
        for name, p in inspect.signature(ctor).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    env_kwargs = {k: v for k, v in kwargs.items() if k in ctor_args}
    env = ctor(**env_kwargs)
    params = env.default_params
    param_fields = {f.name for f in dataclasses.fields(params)}
    unknown = sorted(set(kwargs) - ctor_args - param_fields)
    if unknown:
        raise ValueError(
            f"{env_id}: unknown keyword argument(s) {', '.join(unknown)}. Constructor "
            f"arguments: {sorted(ctor_args) or 'none'}; EnvParams fields: {sorted(param_fields)}"
        )
    overrides = {k: v for k, v in kwargs.items() if k in param_fields and k not in ctor_args}
    if overrides:
        params = params.replace(**overrides)
    if preset is not None:
        env = compat_lib.observation_view(env, preset)
    return env, params
