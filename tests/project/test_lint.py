"""ruff's checks (`[tool.ruff]` in pyproject.toml) pass on the whole repository: style, imports,
naming, likely bugs and McCabe complexity (`C901`), whose exceptions pyproject.toml lists with
their reasons."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def test_ruff_check_passes():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 0, f"ruff check found problems:\n{result.stdout}{result.stderr}"
