"""The registry: one literal table from environment ids to constructors, `make`, and the
"did you mean" hint of unknown names."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import unicodedata
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
from .checks import check_default_params
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
        env_id: a new id, e.g. `"MyTask-v0"`: a safe name, without path separators, `..`,
            whitespace or control characters (it names the default run directory).
        factory: a callable (usually the `Environment` subclass) that `make` calls once per
            call, with the keyword arguments it accepts (all of them if it takes `**kwargs`).

    Raises:
        TypeError: `env_id` is not a string, or `factory` is not callable.
        ValueError: `env_id` is empty, not a safe name, or already registered (ids are never
            replaced).
    """
    if not isinstance(env_id, str):
        raise TypeError(f"register: an environment id must be a string, got {type(env_id).__name__} {env_id!r}")
    if not env_id.strip():
        raise ValueError("register: an environment id must not be empty")
    unsafe = _unsafe(env_id)
    if unsafe:
        raise ValueError(f"register: {env_id!r} is not a safe environment id ({unsafe}); use letters, digits "
                         "and - _ . as in 'MyTask-v0'")
    if env_id in REGISTRY:
        raise ValueError(f"{env_id!r} is already registered (to {REGISTRY[env_id]!r}); pick another id")
    if not callable(factory):
        raise TypeError(f"register({env_id!r}, factory): factory must be callable, got {factory!r}")
    REGISTRY[env_id] = factory
    registered_envs.append(env_id)


def _unsafe(env_id: str) -> str | None:
    """What makes `env_id` unsafe as a file name (`runs/<id>-...`) or on a command line, or None."""
    if "/" in env_id or "\\" in env_id:
        return "a path separator"
    if ".." in env_id:
        return "'..'"
    if any(c.isspace() or unicodedata.category(c).startswith("C") for c in env_id):
        return "whitespace or a control character"
    return None


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
            (e.g. `max_steps_in_episode=200`); they take precedence over the preset. A
            factory that takes `**kwargs` receives every one of them; those that name
            `EnvParams` fields (and no named argument of the factory) are also set on the
            returned params.

    Returns:
        `(env, env_params)`.

    Raises:
        TypeError: `env_id` is not a string, or the factory returned no environment.
        ValueError: unknown id (with the closest ids), unknown keyword argument, or an
            `EnvParams` value out of its allowed range (see `checks.py`).
    """
    if not isinstance(env_id, str):
        raise TypeError(f"make: an environment id must be a string, got {type(env_id).__name__} {env_id!r}")
    if env_id not in REGISTRY:
        close = close_matches(env_id, REGISTRY, n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"Unknown environment id {env_id!r} (not in registered_envs).{hint} Registered ids: {', '.join(REGISTRY)}"
        )
    preset = compat_lib.preset(env_id, compat)
    if preset is not None:
        kwargs = {**preset.env_kwargs, **preset.params, **kwargs}
    named, takes_any = _factory_arguments(REGISTRY[env_id])
    env = _build(env_id, REGISTRY[env_id], kwargs if takes_any else {k: v for k, v in kwargs.items() if k in named})
    params = check_default_params(env.default_params, env_id)
    param_fields = {f.name for f in dataclasses.fields(params)}
    unknown = [] if takes_any else sorted(set(kwargs) - named - param_fields)
    if unknown:
        raise ValueError(
            f"{env_id}: unknown keyword argument(s) {', '.join(unknown)}. Constructor "
            f"arguments: {sorted(named) or 'none'}; EnvParams fields: {sorted(param_fields)}"
        )
    overrides = {k: v for k, v in kwargs.items() if k in param_fields and k not in named}
    if overrides:
        params = params.replace(**overrides)
    if preset is not None:
        env = compat_lib.observation_view(env, preset)
    return env, params


def _factory_arguments(factory: Callable) -> tuple[set[str], bool]:
    """The keyword arguments `factory` names, and whether it also takes `**kwargs`."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: pass it everything
        return set(), True
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


def _build(env_id: str, factory: Callable, kwargs: dict) -> Environment:
    """`factory(**kwargs)`, checked to be an environment (popeval's, or gymnax's API)."""
    env = factory(**kwargs)
    if not all(hasattr(env, name) for name in ("reset", "step", "default_params")):
        raise TypeError(f"make({env_id!r}): the registered factory must return a Gymnax Environment or a popeval "
                        f"Environment (with reset, step and default_params), got {type(env).__name__}")
    return env
