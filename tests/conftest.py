"""The session's set-up and the fixtures every folder uses (the helpers are `tests/helpers.py`)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# One persistent XLA compilation cache for the whole session: this process, the xdist workers
# (which inherit the variable) and every subprocess a test starts, so a program compiled once is
# loaded, not compiled, by the next test that builds it. Compiled programs are the same either way.
_OWN_CACHE = None
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _OWN_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="popeval-test-xla-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="module")
def fast_compilation():
    """Skips XLA's expensive backend passes while a module compiles (~40% faster where nearly all
    of a module's time is compiling small programs that then run a few times; the flag is JAX's
    own for that trade-off). Floats may differ from optimised code in the last bit (fused
    multiply-adds), so a module that uses it (`pytestmark = pytest.mark.usefixtures(...)`)
    compares programs compiled under the same setting only. Restored afterwards."""
    import jax  # after the cache's variables above, which JAX reads when imported

    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)
