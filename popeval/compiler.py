"""The XLA options popeval compiles its programs with, and `jit`, which applies them.

    fn = compiler.jit(f)          # jax.jit(f) compiled with options() when called from Python
    lowered.compile(options())    # the same options for a program compiled ahead of time

On CPUs popeval's programs are compiled with LLVM optimisation level 1 instead of XLA's
default 3: they are loops over many small fused kernels, which level 3 takes longer to
compile into code that is no faster (experiments/README.md, "Compiler options"). Other
backends keep their defaults; a level set in `XLA_FLAGS` (`--xla_backend_optimization_level=N`)
wins.

The optimisation level is no floating-point contract: the same program can round differently
at another level (Acrobot's returns did, `tests/engine/test_rollout.py`), so a program reproduces
itself bit for bit at one level only. Every program popeval compiles itself uses these
options, `RolloutWrapper`'s methods and the evolve loop's programs, so an evaluation
reproduces the returns a run logged.
A program of yours that calls `RolloutWrapper`'s methods inside `jax.jit` is compiled with
your options (`jax.jit(f, compiler_options=compiler.options())` gives it popeval's).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["options", "jit", "CPU_OPTIONS"]

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


def _tracing(args: Any) -> bool:
    """Whether this call is part of another program being traced (`jit`, `grad`, `scan`...):
    an argument is a tracer, or (constants inside a trace) a new array would be one."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
        return True
    return isinstance(jnp.zeros(()), jax.core.Tracer)


def jit(fn: Callable) -> Callable:
    """`jax.jit(fn)`, compiled with `options()` when called from Python. Inside another traced
    program it is inlined there and compiled with that program's options (JAX accepts compiler
    options on outermost programs only)."""
    top, inner = jax.jit(fn, compiler_options=options()), jax.jit(fn)

    @functools.wraps(fn)
    def call(*args):
        return (inner if _tracing(args) else top)(*args)

    return call
