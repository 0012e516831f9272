"""The layers, read from the import statements of every module (DESIGN.md):

    experiments/  ->  strategies/ (popeval.strategies)  ->  popeval/ (the engine)  ->  environments/

An environment imports nothing from the engine or the strategies; an engine module imports
nothing from the strategies (the command line, the application entry point, and the lazy
top-level namespace excepted); no library module imports the experiments' code (the
`experiments` package), which only the experiments and the tests use. Also: no module loads
another one by file path, and the experiments are imported by their absolute names
(`experiments.zoo.results`), never by a bare name from a folder put on `sys.path`.
(How long a function may be is ruff's McCabe limit, `tests/project/test_lint.py`.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

#: Directory on disk -> the package it installs as.
PACKAGES = {"environments": "popeval.environments", "strategies": "popeval.strategies", "popeval": "popeval"}
#: Top-level name of the experiments' code (not installed): the `experiments` package, run from the
#: repository's root (`python -m experiments.zoo`).
EXPERIMENTS = {"experiments"}
#: Engine modules that may import the strategies: the application layer.
APPLICATION = {"popeval.cli", "popeval"}


def modules() -> dict[str, Path]:
    """`{dotted module name: path}` for every library module."""
    out = {}
    for folder, package in PACKAGES.items():
        out.update(package_modules(REPO / folder, package))
    return out


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """`{dotted module name: path}` for the modules of the folder `root`, installed as `package`."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def _source(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` statement in `name` imports from."""
    if not node.level:
        return node.module or ""
    base = name.split(".")
    base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module `name` imports (relative imports resolved)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _source(name, path, node)
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def layer(module: str) -> str:
    if module == "environments" or module.startswith(("popeval.environments", "environments.")):
        return "environments"
    if module == "strategies" or module.startswith(("popeval.strategies", "strategies.")):
        return "strategies"
    if module.split(".")[0] in EXPERIMENTS:
        return "experiments"
    if module == "popeval" or module.startswith("popeval."):
        return "engine"
    return "outside"


ALLOWED = {
    "environments": {"environments", "outside"},
    "engine": {"engine", "environments", "outside"},
    "strategies": {"strategies", "engine", "environments", "outside"},
}


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_imports_only_the_layers_below(name):
    path = modules()[name]
    own = layer(name)
    allowed = ALLOWED[own] | ({"strategies"} if name in APPLICATION else set())
    wrong = sorted(m for m in imports(name, path) if layer(m) not in allowed)
    assert not wrong, f"{name} ({own}) imports {wrong}"


def test_the_graph_reader_sees_a_violation():
    """The checks above would catch an engine module importing the strategies."""
    assert layer("popeval.strategies.run.evolve") == "strategies"
    assert layer("popeval.rollout") == "engine" and layer("popeval.environments.registry") == "environments"
    evolve_py = REPO / "strategies" / "run" / "evolve.py"
    assert "popeval.strategies.run.run_dir" in imports("popeval.strategies.run.evolve", evolve_py)
    assert layer("experiments.benchmarks.programs") == layer("experiments.agents") == "experiments"
    assert layer("experiments") == "experiments" and layer("experimental") == "outside"


def experiments_imports(path: Path) -> list[str]:
    """The experiments' modules that the file at `path` imports."""
    return sorted(m for m in imports(path.stem, path) if layer(m) == "experiments")


def test_the_library_imports_no_experiments_code(tmp_path):
    """The installed library (popeval/, strategies/, environments/) never imports the
    experiments' code; the experiments' scripts and the tests (which test them) may."""
    assert experiments_imports(REPO / "experiments" / "benchmarks" / "__main__.py")  # the check sees such imports
    bad = tmp_path / "bad.py"
    bad.write_text("import jax\ndef f():\n    from experiments.benchmarks import programs\n"
                   "    import experiments.agents.dqn\n")
    assert experiments_imports(bad) == ["experiments.agents.dqn", "experiments.benchmarks",
                                        "experiments.benchmarks.programs"]
    for folder in PACKAGES:
        for path in (REPO / folder).rglob("*.py"):
            assert not experiments_imports(path), f"{path} imports {experiments_imports(path)}"


def test_no_module_loads_another_by_file_path():
    for folder in ("experiments", "tests", *PACKAGES):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            assert "spec_from_file_location" not in text or path.name == "test_layers.py", path


#: Editing the import path in code: the experiments, the tests and the docs' hooks import the
#: experiments as the `experiments` package instead.
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend)\b|\+?=)")


def bare_experiments_imports(path: Path) -> list[str]:
    """The imports in `path` of an experiments' module or folder by its bare name (`import zoo`,
    `from benchmarks.run import main`), which only resolve with a folder of `experiments/` on
    `sys.path`."""
    folders = [p for p in (REPO / "experiments").iterdir() if (p / "__init__.py").is_file()]
    bare = {p.name for p in folders} | ({m.stem for p in folders for m in p.glob("*.py")} - {"__init__", "__main__"})
    return sorted(m for m in imports(path.stem, path) if m.split(".")[0] in bare)


def test_the_experiments_are_imported_by_their_package_s_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.path.insert(0, 'experiments')\nimport zoo\nfrom benchmarks.run import main\n")
    assert SYS_PATH_EDIT.search(bad.read_text()) and bare_experiments_imports(bad) == [
        "benchmarks.run", "benchmarks.run.main", "zoo"]
    assert not SYS_PATH_EDIT.search("monkeypatch.setattr(sys, 'path', [])\nsys.path.count(here)")
    for folder in ("experiments", "tests", "docs/hooks"):
        for path in (REPO / folder).rglob("*.py"):
            assert not SYS_PATH_EDIT.search(path.read_text()) or path.name == "test_layers.py", path
            assert not bare_experiments_imports(path), f"{path} imports {bare_experiments_imports(path)}"


# ------------------------------------------------------------------ no import cycle; the registry imported by none
ENVIRONMENTS = "popeval.environments"
#: The registry and the package that re-exports it: the only modules that may import the registry.
REGISTRY_SIDE = {f"{ENVIRONMENTS}.registry", ENVIRONMENTS}


def environment_graph(root: Path, package: str = ENVIRONMENTS) -> dict[str, set[str]]:
    """`{module: the package's modules it imports}` for the package at `root`, from every import
    statement (inside functions too). `from X import a` imports the module `X.a` where there is
    one, else `X` itself (so `from . import spaces` is no import of the package)."""
    known = package_modules(root, package)
    graph = {}
    for name, path in known.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _source(name, path, node)
                found.update(f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names)
        graph[name] = found & known.keys()
    return graph


def registry_importers(graph: dict[str, set[str]]) -> list[str]:
    """The modules other than the registry and the package that import either of them."""
    return sorted(m for m, targets in graph.items() if m not in REGISTRY_SIDE and targets & REGISTRY_SIDE)


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` (`[a, b, ..., a]`), or `[]` when there is none (depth-first search)."""
    done, path = set(), []

    def visit(module: str) -> list[str]:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return []
        path.append(module)
        for target in sorted(graph[module]):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return []

    return next((cycle for module in sorted(graph) if (cycle := visit(module))), [])


def test_no_environment_module_imports_the_registry():
    """Each environment carries its own id; only the registry (and the package, which re-exports
    it) may import the registry, whose table imports every environment."""
    importers = registry_importers(environment_graph(REPO / "environments"))
    assert not importers, f"{importers} import the registry"


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_no_layer_has_an_import_cycle(folder):
    """No module of a layer imports, through others of the layer, itself (the environments, the
    engine, the strategies' algorithms and run)."""
    cycle = import_cycle(environment_graph(REPO / folder, PACKAGES[folder]))
    assert not cycle, " -> ".join(cycle)


def test_the_environment_graph_sees_a_registry_import_and_a_cycle(tmp_path):
    """The two checks above fail on a package whose base class looks up its id in the registry."""
    root = tmp_path / "environments"
    (root / "games").mkdir(parents=True)
    (root / "__init__.py").write_text("from . import spaces\nfrom .registry import REGISTRY\n")
    (root / "spaces.py").write_text("import numpy\n")
    (root / "environment.py").write_text("from . import spaces\ndef name():\n    from .registry import REGISTRY\n")
    (root / "games" / "__init__.py").write_text("from .pong import Pong\n")
    (root / "games" / "pong.py").write_text("from ..environment import Environment\n")
    (root / "registry.py").write_text("from .games import Pong\nimport popeval.environments.spaces\n")
    graph = environment_graph(root)
    assert graph[f"{ENVIRONMENTS}.environment"] == {f"{ENVIRONMENTS}.spaces", f"{ENVIRONMENTS}.registry"}
    assert registry_importers(graph) == [f"{ENVIRONMENTS}.environment"]
    cycle = import_cycle(graph)
    assert cycle[0] == cycle[-1] and set(cycle) == {f"{ENVIRONMENTS}.{m}" for m in
                                                    ("environment", "registry", "games", "games.pong")}
    (root / "environment.py").write_text("from . import spaces\n")
    assert not registry_importers(environment_graph(root)) and not import_cycle(environment_graph(root))


def test_the_registry_lists_each_environment_under_its_own_id():
    """The literal table agrees with the ids the classes carry (which `name` returns)."""
    from popeval.environments.registry import REGISTRY

    own = {env_id: cls for env_id, cls in REGISTRY.items() if cls.__module__.startswith(f"{ENVIRONMENTS}.")}
    assert len(own) == 26 and all(vars(cls).get("env_id") == env_id for env_id, cls in own.items()), {
        env_id: vars(cls).get("env_id") for env_id, cls in own.items()}


def test_the_algorithms_never_import_the_run():
    """strategies/: `run/` (config, programs, run directory, loop) builds on `algorithms/`, never
    the reverse; eggroll builds on the base module only, not on another family."""
    graph = environment_graph(REPO / "strategies", "popeval.strategies")
    algorithms = {m: t for m, t in graph.items() if m.startswith("popeval.strategies.algorithms")}
    upward = [m for m, t in algorithms.items() if any(x.startswith("popeval.strategies.run") for x in t)]
    assert algorithms and not upward, upward
    family = "popeval.strategies.algorithms."
    assert graph[family + "eggroll"] == {family + "base", family + "shaping"}
