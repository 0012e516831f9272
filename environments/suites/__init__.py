"""Adapters that give other JAX environment suites popeval's environment API.

```python
from popeval.environments.suites import brax_env
env = brax_env("inverted_pendulum")          # a popeval Environment
manager = RolloutWrapper(policy.apply, env=env, num_env_steps=1000)
```

Each adapter is one module (`brax`, `craftax`, `jumanji`, `navix`, `xminigrid`) that imports its
suite only when called: the suites are test and benchmark extras (`pip install 'popeval[suites]'`),
never dependencies of popeval. `make` builds them from ids too (`make("brax/ant")`,
`make("craftax/Craftax-Symbolic-v1")`, `jumanji/<id>`, `navix/<id>`, `xminigrid/<id>`: the
registry's `SUITES` table), and so do the `popeval` command and its configs. gymnax
environments need no adapter: `RolloutWrapper(env=...)` takes them as they are (0.x five-value
and 1.x six-value steps).

Every adapter is a `SuiteEnv` (`popeval.environments.suites.base`): the suite's state and
observation ride in a `SuiteState`, the episode limit in `SuiteParams.max_steps_in_episode`, and
the rest (auto-reset `step`, raw `step_env`, time limit, `info`, fast eager calls,
`state_space`) is popeval's `Environment`, so the fitness path's early exit and memory
guarantees hold unchanged.
"""

from __future__ import annotations

from popeval.environments.suites.base import SuiteEnv, SuiteParams, SuiteState

__all__ = ["SuiteEnv", "SuiteParams", "SuiteState"]

# --- brax: imported on first use (`from popeval.environments.suites import brax_env`) -------
__all__ += ["BraxEnv", "brax_env"]
_PACKAGE = "popeval.environments.suites"
_LAZY = {"BraxEnv": f"{_PACKAGE}.brax", "brax_env": f"{_PACKAGE}.brax"}
# --- end brax ------------------------------------------------------------------------------
# --- craftax, jumanji, navix, xminigrid: likewise -------------------------------------------
__all__ += ["CraftaxClassic", "CraftaxEnv", "craftax_classic", "craftax_env", "JumanjiEnv", "jumanji_env",
            "NavixEnv", "navix_env", "XMiniGridEnv", "xminigrid_env"]
_LAZY.update({
    "CraftaxClassic": f"{_PACKAGE}.craftax", "craftax_classic": f"{_PACKAGE}.craftax",
    "CraftaxEnv": f"{_PACKAGE}.craftax", "craftax_env": f"{_PACKAGE}.craftax",
    "JumanjiEnv": f"{_PACKAGE}.jumanji", "jumanji_env": f"{_PACKAGE}.jumanji",
    "NavixEnv": f"{_PACKAGE}.navix", "navix_env": f"{_PACKAGE}.navix",
    "XMiniGridEnv": f"{_PACKAGE}.xminigrid", "xminigrid_env": f"{_PACKAGE}.xminigrid",
})
# --- end craftax, jumanji, navix, xminigrid -------------------------------------------------


def __getattr__(name):  # each adapter imports its suite only when first asked for
    if name in _LAZY:
        import importlib
        import importlib.util

        suite = _LAZY[name].rsplit(".", 1)[1]  # the adapter module is named after its suite
        if importlib.util.find_spec(suite) is None:
            raise ModuleNotFoundError(f"{name} needs the {suite} package, which is not installed: "
                                      f'pip install "popeval[suites]"', name=suite)
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
