"""The XLA options popeval compiles its evolve loop's programs with (`Lowered.compile(options())`).

On CPUs these programs are compiled with LLVM optimisation level 1 instead of XLA's default
3. They are loops over many small fused kernels, which level 3 optimises at length for little
or no gain: CartPole's generation program (`python experiments/time_to_solve.py
--compile-options --repeats 2`, 2-core x86 machine) compiled in 1.4-1.7 s (2.4-2.8 CPU s)
instead of 2.1-2.8 s (3.8-4.8 CPU s) and ran 0.057-0.058 s per generation instead of
0.063-0.082, with a bit-identical fitness curve. The optimisation level is no floating-point
contract, so a program is only guaranteed to reproduce itself at one level: the rollout
methods of `RolloutWrapper`, which users compile themselves, keep XLA's defaults (level 1
made the fitness and trajectory paths of Reacher differ in the last bit). Other backends keep their
defaults; a level set in `XLA_FLAGS` (`--xla_backend_optimization_level=N`) wins.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax

__all__ = ["options", "CPU_OPTIONS"]

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
