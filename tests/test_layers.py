"""The layers, read from the import statements of every module (DESIGN.md):

    experiments/  ->  strategies/ (popeval.strategies)  ->  popeval/ (the engine)  ->  environments/

An environment imports nothing from the engine or the strategies; an engine module imports
nothing from the strategies (the command line, the application entry point, and the lazy
top-level namespace excepted); no library module imports the experiments' code (`experiments`,
or what its scripts import with `experiments/` on `sys.path`: `benchmarks`, `agents`, ...),
which only the experiments and the tests use. Also: no module loads another one by file path.
(How long a function may be is ruff's McCabe limit, `tests/test_lint.py`.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Directory on disk -> the package it installs as.
PACKAGES = {"environments": "popeval.environments", "strategies": "popeval.strategies", "popeval": "popeval"}
#: Top-level names of the experiments' code: its scripts and packages (`benchmarks`, `agents`), not installed.
EXPERIMENTS = {"experiments"} | {p.stem for p in (REPO / "experiments").glob("*.py")} | {
    p.name for p in (REPO / "experiments").iterdir() if (p / "__init__.py").is_file()}
#: Engine modules that may import the strategies: the application layer.
APPLICATION = {"popeval.cli", "popeval"}


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
    assert layer("popeval.strategies.evolve") == "strategies"
    assert layer("popeval.rollout") == "engine" and layer("popeval.environments.registry") == "environments"
    assert "popeval.strategies.run_dir" in imports("popeval.strategies.evolve", REPO / "strategies" / "evolve.py")
    assert {"benchmarks", "agents", "benchmark"} <= EXPERIMENTS
    assert layer("benchmarks.programs") == layer("agents") == layer("experiments.zoo") == "experiments"


def experiments_imports(path: Path) -> list[str]:
    """The experiments' modules that the file at `path` imports."""
    return sorted(m for m in imports(path.stem, path) if layer(m) == "experiments")


def test_the_library_imports_no_experiments_code(tmp_path):
    """The installed library (popeval/, strategies/, environments/) never imports the
    experiments' code; the experiments' scripts and the tests (which test them) may."""
    assert experiments_imports(REPO / "experiments" / "benchmark.py")  # the check sees such imports
    bad = tmp_path / "bad.py"
    bad.write_text("import jax\ndef f():\n    from benchmarks import programs\n    import agents.dqn\n")
    assert experiments_imports(bad) == ["agents.dqn", "benchmarks", "benchmarks.programs"]
    for folder in PACKAGES:
        for path in (REPO / folder).rglob("*.py"):
            assert not experiments_imports(path), f"{path} imports {experiments_imports(path)}"


def test_no_module_loads_another_by_file_path():
    for folder in ("experiments", "tests", *PACKAGES):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            assert "spec_from_file_location" not in text or path.name == "test_layers.py", path
