"""Importing popeval must not start JAX's backends (the CLI sets the CPU device count after
importing popeval, and users may still configure JAX after `import popeval`), nor load
Pillow and the rendering package before something is drawn, nor gymnax and gymnasium (its
environments' gymnax spaces are imported on their first use)."""

import subprocess
import sys

from tests.helpers import REPO


def test_import_popeval_starts_no_backend_and_loads_no_pillow():
    code = (
        "import jax\n"
        "from jax._src import xla_bridge as xb\n"
        "import sys\n"
        "import popeval, popeval.environments, popeval.cli, popeval.rollout\n"
        "assert 'PIL' not in sys.modules, 'importing popeval imported PIL'\n"
        "assert 'popeval.environments.rendering' not in sys.modules\n"
        "from popeval.environments import Visualizer, render\n"
        "assert render.__module__ == Visualizer.__module__ == 'popeval.environments.rendering'\n"
        "assert not xb._backends, 'importing popeval initialised a JAX backend'\n"
        "jax.config.update('jax_num_cpu_devices', 3)\n"
        "assert jax.local_device_count() == 3\n"
        # gymnax's spaces are imported on their first use only (tests/environments/test_gymnax_compat.py).
        "from popeval.environments import SixValueStep, make\n"
        "from popeval.environments.wrappers import to_gymnax_space\n"
        "env = SixValueStep(make('CartPole-v1')[0])\n"
        "env.observation_space(); env.action_space()\n"
        "assert 'gymnax' not in sys.modules and 'gymnasium' not in sys.modules, sorted(sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]


def _private_jax_names(root):
    """`path:line: text` of every use of a private JAX name under `root`'s library folders:
    `jax._src`, an underscored attribute or import of a jax module, a `DO_NOT_USE` name."""
    import re

    pattern = re.compile(r"\bjax(\.\w+)*\._\w|\bfrom jax(\.\w+)* import .*\b_\w|DO_NOT_USE")
    return [f"{path.relative_to(root)}:{n}: {line.strip()}"
            for folder in ("popeval", "environments", "strategies")
            for path in sorted((root / folder).rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line.split("#")[0])]


def test_the_library_uses_no_private_jax_name(tmp_path):
    assert _private_jax_names(REPO) == []
    bad = tmp_path / "popeval"
    bad.mkdir()
    (bad / "a.py").write_text("from jax._src.core import trace_state_clean\nfrom jax.core import _x\n"
                              "jax._src.config.trace_context()\nok = jax.core.Tracer  # jax._src in a comment\n")
    assert [x.split(":")[1] for x in _private_jax_names(tmp_path)] == ["1", "2", "3"]
