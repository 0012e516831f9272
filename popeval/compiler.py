"""How popeval compiles its programs: `jit` with popeval's XLA options.

On CPUs popeval compiles with LLVM optimisation level 1 instead of XLA's default 3. Rollout
programs are loops over many small fused kernels; measured on a 2-core x86 machine
(`experiments/benchmark.py --compile-options`), level 1 compiles them in 35-55% less time and
runs them as fast or faster (CartPole's evolve generation: 3.1 -> 1.6 s to compile, 0.08 ->
0.06 s per generation), with the same results in the tested cases (the optimisation level is
not a floating-point contract; programs are only guaranteed identical to themselves at one
level). Other backends keep their defaults. A level set in `XLA_FLAGS`
(`--xla_backend_optimization_level=N`) wins over popeval's.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax

__all__ = ["options", "jit"]

#: popeval's XLA options on CPU backends.
CPU_OPTIONS = {"xla_backend_optimization_level": 1}


@functools.cache
def _cpu_default() -> bool:
    return jax.default_backend() == "cpu"


def options() -> dict[str, Any]:
    """XLA compiler options for popeval's programs on the default backend."""
    if "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", "") or not _cpu_default():
        return {}
    return dict(CPU_OPTIONS)


def jit(fn: Callable, **kwargs: Any) -> Callable:
    """`jax.jit(fn, **kwargs)` compiled with `options()`: for top-level programs only (JAX
    refuses compiler options on a jit nested in another trace)."""
    return jax.jit(fn, compiler_options=options(), **kwargs)
