"""The layers, read from the import statements of every module (DESIGN.md):

    experiments/  ->  strategies/ (popeval.strategies)  ->  popeval/ (the engine)  ->  environments/

An environment imports nothing from the engine or the strategies; an engine module imports
nothing from the strategies (the command line, the application entry point, and the lazy
top-level namespace excepted); nothing imports `experiments`. Also: no library module over
300 lines (one documented exception), and no module loads another one by file path.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Directory on disk -> the package it installs as.
PACKAGES = {"environments": "popeval.environments", "strategies": "popeval.strategies", "popeval": "popeval"}
#: Engine modules that may import the strategies: the application layer.
APPLICATION = {"popeval.cli", "popeval"}
MAX_LINES = 300
#: Modules allowed to be longer, with the reason.
LONGER = {
    # One game's rules, written in the order of its docstring's six rules (the reference's
    # order, which the conformance test replays); splitting the step would scatter them.
    "popeval.environments.minatar.seaquest": 400,
}


def modules() -> dict[str, Path]:
    """`{dotted module name: path}` for every library module."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module `name` imports (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return found


def layer(module: str) -> str:
    if module == "environments" or module.startswith(("popeval.environments", "environments.")):
        return "environments"
    if module == "strategies" or module.startswith(("popeval.strategies", "strategies.")):
        return "strategies"
    if module == "experiments" or module.startswith("experiments."):
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
    assert layer("popeval.strategies.evolve") == "strategies"
    assert layer("popeval.rollout") == "engine" and layer("popeval.environments.registry") == "environments"
    assert "popeval.strategies.run_dir" in imports("popeval.strategies.evolve", REPO / "strategies" / "evolve.py")


def test_experiments_and_tests_import_no_experiments_module():
    for folder in ("experiments", "tests", "popeval", "strategies", "environments"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            names = imports(path.stem, path)
            assert not any(layer(m) == "experiments" for m in names), path
            assert "spec_from_file_location" not in text or path.name == "test_layers.py", path


@pytest.mark.parametrize("name", sorted(modules()))
def test_library_modules_stay_small(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= LONGER.get(name, MAX_LINES), f"{name}: {lines} lines (split it by concern)"
