"""The devices themselves: how many, which, their mesh (`popeval.sharding`)."""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

__all__ = ["AXIS", "use_all_cores", "num_devices", "resolve_devices", "on_cpus"]

#: Name of the device axis inside a sharded generation.
AXIS = "devices"


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def use_all_cores() -> str | None:
    """Gives JAX one CPU device per core unless the user chose a count; returns a log line.
    On a machine with a GPU or TPU, JAX's default backend is the accelerator and these CPU
    devices go unused (checking which backend JAX picks would start the backends, too early
    for `jax.distributed.initialize`), hence the line's wording."""
    if "JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    cores = _cores()
    if cores <= 1:
        return None
    try:
        jax.config.update("jax_num_cpu_devices", cores)
    except Exception:  # backends already initialised: keep what there is
        return None
    return (f"JAX's CPU backend: {cores} devices, one per core (used where there is no GPU or TPU); "
            "set JAX_NUM_CPU_DEVICES to override")


def num_devices() -> int:
    """Devices a generation is sharded over: every device of every process (one process: its
    local devices)."""
    return jax.device_count()


def on_cpus(devices: int) -> bool:
    """Whether the first `devices` devices (of every process) are CPUs."""
    return all(d.platform == "cpu" for d in jax.devices()[:devices])


def resolve_devices(devices: Any) -> tuple:
    """`None` (all local devices), a count `n` (the first `n`) or devices -> a tuple of local devices."""
    local = jax.local_devices()
    if devices is None:
        return tuple(local)
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= devices <= len(local):
            raise ValueError(f"devices={devices}: this process has {len(local)} local device(s) "
                             f"({local[0].platform}); on a CPU set JAX_NUM_CPU_DEVICES before importing jax")
        return tuple(local[:devices])
    devices = tuple(devices)
    if not devices or any(d not in local for d in devices):
        raise ValueError(f"devices must be local devices of this process ({local}), got {devices}")
    return devices


def _mesh(devices: Any) -> Mesh:
    """The one-axis (`AXIS`) mesh of `devices`."""
    return Mesh(np.array(devices), (AXIS,))
