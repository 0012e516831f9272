"""The documentation's Python code runs as written, and the site builds.

For README.md and every page of `docs/`, the page's ```python blocks run in order in one fresh
process from the repository root (as a reader would run them), each block continuing the ones
before it; the runs they start are written under a temporary directory. Blocks that are not
meant to run (output listings, diagrams) use another fence language (```text). The blocks are
kept small (tiny populations, a few generations) so that all pages together cost seconds, not
minutes. `mkdocs build --strict` then builds the site as CI would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, subprocess_env

PAGES = ["README.md"] + sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```$", re.S | re.M)
#: What a page's output must contain, besides running without an error.
EXPECTED = {
    "README.md": ["(16, 4) (16, 4)", "generation 9: mean return"],
    "docs/index.md": ["(16, 4) (16, 4)"],
    "docs/environments.md": ["'final_observation'"],
    "docs/rollouts.md": ["(8, 4, 50, 3) (8, 4) (8, 4)", "(8,)\n", "3200.0", "(2, 3, 4)", "(8, 4) (8, 3, 1)"],
    "docs/evolve.md": ["\n2\n"],
}


def fences(page: str) -> list[tuple[str, str]]:
    """`(language, code)` of every fenced block of `page`, in order."""
    return FENCE.findall((REPO / page).read_text())


def python_blocks(page: str) -> list[str]:
    return [code for language, code in fences(page) if language == "python"]


def test_every_fence_names_a_language_and_python_is_spelled_one_way():
    """An unlabelled fence, or ```py, would silently escape the test below."""
    for page in PAGES:
        for language, code in fences(page):
            assert language in ("python", "bash", "text", "yaml", "toml"), \
                f"{page}: fence ```{language} before {code[:60]!r}"
    assert len(python_blocks("README.md")) >= 3


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)])
def test_python_blocks_run_in_order(page, tmp_path):
    # Relative paths (configs) resolve from the repository root; runs and files go to tmp_path.
    code = "\n".join(python_blocks(page)).replace('"runs/', f'"{tmp_path}/runs/')
    env = subprocess_env(TMPDIR=str(tmp_path), MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{page}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    for expected in EXPECTED.get(page, []):
        assert expected in out.stdout, f"{page}: {expected!r} not in its output:\n{out.stdout[-2000:]}"


def test_mkdocs_builds_the_site_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = (out.stdout + out.stderr)[-4000:]
    assert out.returncode == 0, f"mkdocs build --strict failed (pip install -e '.[docs]'):\n{log}"
    zoo_figures = [f"figures/zoo_curves_{family}.png" for family in ("classic_control", "bsuite", "minatar", "misc")]
    for page in ("index.html", "api/index.html", *zoo_figures):
        assert (tmp_path / "site" / page).is_file(), page
    zoo_page = (tmp_path / "site" / "zoo" / "index.html").read_text()
    assert all(f'href="../{figure}"' in zoo_page for figure in zoo_figures)  # each linked to its full size
    assert "popeval.rollout.RolloutWrapper" in (tmp_path / "site" / "api" / "index.html").read_text()
