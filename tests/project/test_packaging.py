"""The import layout of the installed distribution: everything lives under `popeval`.

`environments/` and `strategies/` are installed as `popeval.environments` and
`popeval.strategies`; no generic top-level `environments` or `strategies` module may land
in site-packages, and no experiments' code (benchmarks, agents, anchors) is installed. Checked
for a wheel built from this tree and for the current install.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

#: Source folder -> where it is installed.
LAYOUT = {"popeval": "popeval", "environments": "popeval/environments", "strategies": "popeval/strategies"}
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "runs", "wandb", "bench_results"
)


def run_python(code: str, cwd: Path, pythonpath: str | None = None) -> str:
    """Runs `code` in a fresh interpreter of this environment, outside the repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def source_modules() -> set[str]:
    """Installed paths of every module of the source tree, e.g. `popeval/environments/x.py`."""
    return {
        f"{dst}/{path.relative_to(REPO / src).as_posix()}"
        for src, dst in LAYOUT.items()
        for path in (REPO / src).rglob("*.py")
        if "__pycache__" not in path.parts
    }


IMPORT_CHECK = """
    import importlib.util, json, pathlib
    from importlib import metadata
    import popeval.environments, popeval.strategies
    from popeval.environments import make
    env, params = make("CartPole-v1")
    for name in ("environments", "strategies"):
        assert importlib.util.find_spec(name) is None, f"top-level {name!r} is importable"
    print(pathlib.Path(popeval.environments.__file__).resolve())
    print(pathlib.Path(popeval.strategies.__file__).resolve())
    direct_url = json.loads(metadata.distribution("popeval").read_text("direct_url.json") or "{}")
    print("editable" if direct_url.get("dir_info", {}).get("editable") else "not-editable")
"""


#: Wheel paths of code that is not the library: the benchmarks, the RL agents and their anchors
#: (all in experiments/, which is not installed).
NOT_LIBRARY = ("popeval/benchmark*", "*/benchmarks/*", "*/agents/*", "*_seed.py", "*scaling_benchmark*",
               "popeval/suites/*", "experiments/*")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of this tree (the repository is not written to), once."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=COPY_IGNORE)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "dist", src],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (tmp / "dist").glob("popeval-*.whl")
    return built


def test_wheel_holds_the_library_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    stray = sorted(n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in NOT_LIBRARY))
    assert not stray, f"not library code in the wheel: {stray}"
    assert {"popeval/bench.py", "popeval/environments/suites/__init__.py"} <= set(names)
    assert fnmatch.fnmatch("popeval/benchmark_programs.py", NOT_LIBRARY[0])  # the patterns would catch them
    assert fnmatch.fnmatch("popeval/agents/anakin_seed.py", NOT_LIBRARY[2])


@pytest.mark.slow
def test_wheel_installs_only_the_popeval_package(tmp_path, wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"popeval", f"{wheel.name.split('-py')[0]}.dist-info"}, names
    missing = source_modules() - set(names)
    assert not missing, f"modules missing from the wheel (list their packages in pyproject.toml): {sorted(missing)}"

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", site, wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    top_level = {p.name for p in site.iterdir()} - {"bin"}  # bin/: the console script
    assert {n for n in top_level if not n.endswith(".dist-info")} == {"popeval"}, top_level
    *paths, _ = run_python(IMPORT_CHECK, cwd=tmp_path, pythonpath=str(site)).split()
    for path in paths:
        assert Path(path).is_relative_to(site.resolve()), f"imported {path}, not the installed wheel"


def test_current_install_imports_popeval_namespace_only(tmp_path):
    *paths, mode = run_python(IMPORT_CHECK, cwd=tmp_path).split()
    if mode == "editable":  # `pip install -e .`: the modules are this repository's files
        assert paths == [str(REPO / "environments" / "__init__.py"), str(REPO / "strategies" / "__init__.py")]
    else:
        assert all("site-packages" in p for p in paths), paths


@pytest.mark.xdist_group("grouping-check")
def test_xdist_groups_the_tests_that_share_a_fixture(request):
    """Under README's test command (`-n 2`, `--dist loadgroup` from pyproject) a test marked
    `xdist_group` carries its group in its node id, which is what sends a group to one worker
    (pytest 9.2's node ids dropped it: pytest-dev/pytest-xdist#1386)."""
    if not request.config.getoption("loadgroup", False):
        pytest.skip("checks README's test command (-n 2, --dist loadgroup); this run does not distribute tests")
    assert request.node.nodeid.endswith("@grouping-check"), request.node.nodeid
