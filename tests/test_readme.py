"""README's Python code runs as written: its ```python blocks, in order, in one fresh process
(from the repository root, as a reader would run them), each block continuing the ones
before it. The runs they start are written under a temporary directory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import subprocess_env

REPO = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", (REPO / "README.md").read_text(), re.S | re.M)


def test_readme_python_blocks_run_in_order(tmp_path):
    blocks = python_blocks()
    assert len(blocks) >= 4
    # Relative paths (configs) resolve from the repository root; outputs go to tmp_path.
    code = "\n".join(blocks).replace('"runs/', f'"{tmp_path}/runs/').replace('"anim.gif"', f'"{tmp_path}/anim.gif"')
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(64, 8) (64, 8)" in out.stdout
    assert (tmp_path / "anim.gif").is_file() and (tmp_path / "runs" / "acrobot" / "result.json").is_file()
