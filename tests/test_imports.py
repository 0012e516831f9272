"""Importing popeval must not start JAX's backends (the CLI sets the CPU device count after
importing popeval, and users may still configure JAX after `import popeval`), nor load
Pillow and the rendering package before something is drawn, nor gymnax and gymnasium (its
environments' gymnax spaces are imported on their first use)."""

import subprocess
import sys


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
        # gymnax's spaces are imported on their first use only (tests/test_gymnax_compat.py).
        "from popeval.environments import SixValueStep, make\n"
        "from popeval.environments.wrappers import to_gymnax_space\n"
        "env = SixValueStep(make('CartPole-v1')[0])\n"
        "env.observation_space(); env.action_space()\n"
        "assert 'gymnax' not in sys.modules and 'gymnasium' not in sys.modules, sorted(sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
