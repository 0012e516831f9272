"""The registry: one literal table from environment ids to constructors, `make`, the
"did you mean" hint of unknown names, and the ids that other modules register: a module named
by a config's `env_module` (`import_env_module`) and installed packages' `popeval.environments`
entry points (`load_entry_points`, when `make` is asked for an id it does not know)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import logging
import sys
import unicodedata
from collections.abc import Callable
from importlib import metadata
from typing import Any, NamedTuple

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
from .hints import close_matches, did_you_mean
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

__all__ = ["ENTRY_POINT_GROUP", "REGISTRY", "SUITES", "Suite", "close_matches", "did_you_mean", "import_env_module",
           "load_entry_points", "register", "registered_envs", "make", "suite_env_ids", "suite_factory"]

log = logging.getLogger("popeval")

#: Environment id -> constructor. The single source of truth for `make`, the CLI and tests. Each
#: class carries its own id as `env_id` (so no environment module imports this table).
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


class Suite(NamedTuple):
    """Another JAX suite, whose ids are `<namespace>/<name>`: `module.<factory>(name, **kwargs)`
    builds one, `module.env_names()` lists its names (None where it cannot)."""

    package: str  # what the suites extra installs, e.g. "brax"
    module: str  # popeval's adapter
    factory: str


#: Namespace -> suite: the other suites' ids (`brax/ant`, `craftax/Craftax-Symbolic-v1`), each suite
#: imported only when one of its ids is made or listed (`pip install "popeval[suites]"`).
SUITES: dict[str, Suite] = {
    "brax": Suite("brax", "popeval.environments.suites.brax", "brax_env"),
    "craftax": Suite("craftax", "popeval.environments.suites.craftax", "craftax_env"),
    "jumanji": Suite("jumanji", "popeval.environments.suites.jumanji", "jumanji_env"),
    "navix": Suite("navix", "popeval.environments.suites.navix", "navix_env"),
    "xminigrid": Suite("xminigrid", "popeval.environments.suites.xminigrid", "xminigrid_env"),
}


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
        raise ValueError(f"register({env_id!r}, {_describe(factory)}): {env_id!r} is already registered to "
                         f"{_describe(REGISTRY[env_id])}; ids are never replaced, pick another id")
    if not callable(factory):
        raise TypeError(f"register({env_id!r}, factory): factory must be callable, got {factory!r}")
    if isinstance(factory, type) and issubclass(factory, Environment) and vars(factory).get("env_id") not in REGISTRY:
        factory.env_id = env_id  # its `name`: the first of its ids that is still registered
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


def _suite_module(namespace: str, env_id: str) -> Any:
    """The adapter module of the suite `namespace`, the suite imported now."""
    if namespace not in SUITES:
        raise ValueError(f"Unknown environment id {env_id!r}: {namespace!r} is not a suite; the suites' ids are "
                         f"{', '.join(f'{ns}/<name>' for ns in SUITES)}; popeval's own ids have no '/' "
                         "(popeval list-envs --all lists them all)")
    suite = SUITES[namespace]
    if importlib.util.find_spec(suite.package) is None:
        raise ModuleNotFoundError(f'{env_id}: needs the {suite.package} package: pip install "popeval[suites]"',
                                  name=suite.package)
    return importlib.import_module(suite.module)


def suite_factory(env_id: str) -> Callable[..., Environment]:
    """The factory of another suite's id (`"brax/ant"`), its suite imported now.

    Args:
        env_id: `<namespace>/<name>`, a namespace of `SUITES` and one of its suite's names.

    Returns:
        The adapter's factory with the name bound: its keyword arguments are `make`'s.

    Raises:
        ValueError: an unknown namespace, or a name the suite does not have (with the close ones).
        ModuleNotFoundError: the suite is not installed (naming the extra that brings it).
    """
    namespace, _, name = env_id.partition("/")
    module = _suite_module(namespace, env_id)
    names = module.env_names()  # None: the suite cannot list them
    if names is not None and name not in names:
        close = close_matches(name, names, n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(repr(f'{namespace}/{c}') for c in close)}?" if close else ""
        raise ValueError(f"Unknown environment id {env_id!r}: {namespace} has no {name!r}.{hint} "
                         f"popeval list-envs --all lists the {namespace}/ ids")
    return functools.partial(getattr(module, SUITES[namespace].factory), name)


def suite_env_ids(namespace: str) -> list[str]:
    """The ids of the suite `namespace` (`["brax/ant", ...]`), its suite imported now.

    Raises:
        ModuleNotFoundError: the suite is not installed (naming the extra that brings it).
    """
    return [f"{namespace}/{name}" for name in _suite_module(namespace, f"{namespace}/...").env_names() or ()]


def make(env_id: str, compat: str | None = None, **kwargs: Any) -> tuple[Environment, Any]:
    """Builds an environment and its default parameters.

    Args:
        env_id: a registered id, e.g. `"CartPole-v1"` (see `registered_envs`), or another suite's
            `<namespace>/<name>` (`"brax/ant"`, `"craftax/Craftax-Classic-Symbolic-v1"`; see
            `SUITES`), which imports that suite (`pip install "popeval[suites]"`).
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
        ValueError: unknown id (with the closest ids and the ways to register one), even after
            loading installed packages' `popeval.environments` entry points (`load_entry_points`);
            an unknown keyword argument, or an `EnvParams` value out of its allowed range (see
            `checks.py`). What the factory raises names the id (`_build`).
        ModuleNotFoundError: another suite's id, and that suite is not installed.
    """
    if not isinstance(env_id, str):
        raise TypeError(f"make: an environment id must be a string, got {type(env_id).__name__} {env_id!r}")
    if "/" in env_id:  # another suite's id, `brax/ant` (`register` refuses '/' in its ids)
        return _make(env_id, suite_factory(env_id), compat, kwargs)
    if env_id not in REGISTRY:
        load_entry_points()  # installed packages' ids: imported only when an unknown id is asked for
    if env_id not in REGISTRY:
        raise ValueError(_unknown_id(env_id))
    return _make(env_id, REGISTRY[env_id], compat, kwargs)


def _make(env_id: str, factory: Callable[..., Environment], compat: str | None,
          kwargs: dict[str, Any]) -> tuple[Environment, Any]:
    """`make` once `env_id`'s factory is known: the preset, the factory's arguments and the
    `EnvParams` overrides."""
    preset = compat_lib.preset(env_id, compat)
    if preset is not None:
        kwargs = {**preset.env_kwargs, **preset.params, **kwargs}
    named, takes_any = _factory_arguments(factory)
    env = _build(env_id, factory, kwargs if takes_any else {k: v for k, v in kwargs.items() if k in named})
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
    """`factory(**kwargs)`, checked to be an environment (popeval's, or gymnax's API); what the
    factory raises is said in one line naming the id (unless it names it already)."""
    try:
        env = factory(**kwargs)
    except Exception as e:
        if env_id in str(e):
            raise
        raise _factory_error(env_id, factory, e) from e
    if not all(hasattr(env, name) for name in ("reset", "step", "default_params")):
        raise TypeError(f"make({env_id!r}): the registered factory must return a Gymnax Environment or a popeval "
                        f"Environment (with reset, step and default_params), got {type(env).__name__}")
    return env


# ------------------------------------------------------------------ environments from other modules
#: The entry-point group through which an installed package registers its environments: each
#: entry point names a module that calls `register` when imported, or a function that does when
#: called. `make` loads them when it is asked for an id that is not registered.
ENTRY_POINT_GROUP = "popeval.environments"

#: The entry points loaded so far, as (distribution, name, value): each is loaded once.
_loaded_entry_points: set[tuple[str, str, str]] = set()


def import_env_module(name: str) -> list[str]:
    """Imports `name`, a module that registers environments (`register`) when imported: a
    config's `env_module` (`popeval evolve --env_module my_pkg.envs`).

    Args:
        name: the module as Python imports it, e.g. `"my_pkg.envs"`.

    Returns:
        The ids it registered (none when it was imported before).

    Raises:
        ValueError: in one line, the module does not import (its error; the ids it registered
            before failing are removed again), or importing it registered no environment.
    """
    before, fresh = len(registered_envs), name not in sys.modules
    try:
        importlib.import_module(name)
    except Exception as e:
        _forget(registered_envs[before:])  # a fixed module can be imported again
        raise ValueError(f"env_module {name}: {_error_line(e)}{_import_hint(name, e)}") from e
    added = registered_envs[before:]
    if fresh and not added:
        raise ValueError(f"env_module {name}: registered no environment; importing it must call "
                         "popeval.environments.register(env_id, factory)")
    return added


def _import_hint(name: str, error: Exception) -> str:
    """What to do when the module `name` itself (or its package) is not found."""
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if not missing or not f"{name}.".startswith(f"{missing}."):
        return ""
    return ("; install the package that holds it, or run popeval in the directory that holds it (or with "
            "that directory on PYTHONPATH)")


def _forget(env_ids: list[str]) -> None:
    for env_id in env_ids:
        factory = REGISTRY.pop(env_id, None)
        registered_envs.remove(env_id)
        if isinstance(factory, type) and vars(factory).get("env_id") == env_id:
            del factory.env_id  # `register` set it: its `name` is its class name again


def load_entry_points() -> list[str]:
    """Loads the `popeval.environments` entry points of the installed packages that were not
    loaded yet (`make` does, for an id that is not registered). One that fails is skipped with a
    warning naming its package and entry point; the others' ids still work.

    Returns:
        The ids they registered.
    """
    before = len(registered_envs)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        origin = (_distribution(entry), entry.name, entry.value)
        if origin not in _loaded_entry_points:
            _loaded_entry_points.add(origin)
            _load_entry_point(entry, origin[0])
    return registered_envs[before:]


def _distribution(entry: metadata.EntryPoint) -> str:
    """The name of the installed package that declares `entry`."""
    dist = getattr(entry, "dist", None)
    return getattr(dist, "name", None) or "an unnamed package"


def _load_entry_point(entry: metadata.EntryPoint, distribution: str) -> None:
    """Imports the module `entry` names, or calls the function it names; a failure is a warning."""
    try:
        loaded = entry.load()
        if callable(loaded):
            loaded()
    except Exception as e:
        log.warning("popeval: %s's %s entry point %s = %s failed, so its environments are not registered: %s",
                    distribution, ENTRY_POINT_GROUP, entry.name, entry.value, _error_line(e))


def _unknown_id(env_id: str) -> str:
    """Why `env_id` cannot be made, in one line: the close ids, and the ways to register one."""
    close = close_matches(env_id, REGISTRY, n=3, cutoff=0.4)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return (f"Unknown environment id {env_id!r} (not in registered_envs).{hint} To add one, name the module that "
            f"registers it (--env_module my_pkg.envs, or env_module: in the config), install a package that "
            f"registers it through the {ENTRY_POINT_GROUP!r} entry point, or call "
            f"popeval.environments.register(env_id, factory) first (docs/environments.md). "
            f"Registered ids: {', '.join(REGISTRY)}")


def _factory_error(env_id: str, factory: Callable, error: Exception) -> Exception:
    """`error` in one line that names the id and the factory: of the same type where that type
    takes a message as its one argument, else a RuntimeError naming the type."""
    where = f"make({env_id!r}): its factory {_describe(factory)}"
    message = f"{where} failed: {_message(error) or type(error).__name__}"
    try:
        wrapped = type(error)(message)
    except Exception:
        wrapped = None
    return wrapped if str(wrapped) == message else RuntimeError(f"{where} raised {_error_line(error)}")


def _describe(factory: Any) -> str:
    """`module.Name` of a factory (a class or function), else its repr."""
    name, module = getattr(factory, "__qualname__", None), getattr(factory, "__module__", None)
    return f"{module}.{name}" if isinstance(name, str) and isinstance(module, str) else repr(factory)


def _message(error: BaseException) -> str:
    """`error`'s message in one line of at most 300 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _error_line(error: BaseException) -> str:
    """`Type: message` in one line."""
    text = _message(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
