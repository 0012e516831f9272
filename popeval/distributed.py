"""Several processes in one run, on `jax.distributed`: joining, leaving, and process 0's
values sent to the others.

Every process of a run runs the same program; `popeval.sharding`'s meshes then hold the
devices of all processes, so a generation's member slices and all-gathers span them. CPU
collectives between processes go through gloo. Process 0 is the one that reads and writes the
run directory; `broadcast` and `broadcast_json` send what it read to the others.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from typing import Any

import jax
import numpy as np

from popeval import keys

__all__ = ["initialize", "finish", "lost_peer", "process_index", "process_count", "broadcast", "broadcast_json"]

#: What `initialize` joined: (coordinator_address, num_processes, process_id), or None.
_joined: tuple | None = None


def _detected_cluster() -> str | None:
    """The scheduler that started this process as one of several (one of the clusters
    `jax.distributed.initialize()` detects by itself), or None."""
    if "SLURM_JOB_ID" in os.environ and "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", 1)) > 1:
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in os.environ and int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1)) > 1:
        return "open mpi"
    return None


def _wait_for_coordinator(address: str, timeout: float) -> None:
    """Returns once `address` (host:port) accepts connections; raises after `timeout` s."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not reach the coordinator at {address} within {timeout:g} s ({e}); "
                                   f"is process 0 running, and is the address right?") from None
            time.sleep(0.25)


def _check_arguments(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Refuses an incomplete or malformed set of `initialize`'s arguments."""
    if any(v is None for v in (coordinator_address, num_processes, process_id)):
        raise ValueError("a multi-process run needs coordinator_address, num_processes and process_id "
                         f"together, got {coordinator_address!r}, {num_processes!r}, {process_id!r}")
    host, _, port = str(coordinator_address).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator_address must be HOST:PORT, got {coordinator_address!r}")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a positive integer, got {num_processes!r}")
    if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id!r}")


#: Seconds without a heartbeat after which JAX declares a process dead (JAX's own default).
HEARTBEAT_SECONDS = 100


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, timeout: float = 300,
               heartbeat: float = HEARTBEAT_SECONDS) -> str | None:
    """Joins this process to a multi-process run (`jax.distributed.initialize`); returns a log
    line, or None when the run has one process.

    With no arguments, a process that a cluster scheduler started as one of several (SLURM,
    Open MPI) joins the others as JAX detects them; otherwise nothing happens. Calling it again
    with the same arguments does nothing. It must run before JAX starts its backends.

    Args:
        coordinator_address: `host:port` of process 0, where the coordinator listens.
        num_processes: how many processes take part.
        process_id: this process's index in `[0, num_processes)`.
        timeout: seconds to wait for the coordinator and for every process to join; then it
            raises (or JAX ends the process) instead of waiting forever.
        heartbeat: seconds after which a process that stopped answering (hung, or stopped
            with SIGSTOP) is declared dead. JAX then ends the other processes itself, by
            SIGABRT with its own log, not a Python error (docs/devices.md).
    """
    global _joined
    given = (coordinator_address, num_processes, process_id)
    if all(v is None for v in given):
        cluster = _detected_cluster()
        if cluster is None:
            return None
        key = ("auto",)
    else:
        _check_arguments(coordinator_address, num_processes, process_id)
        if num_processes == 1:
            return None
        key, cluster = given, None
    if not heartbeat >= 1:
        raise ValueError(f"the heartbeat timeout must be >= 1 second, got {heartbeat!r}")
    if _joined is not None:
        if _joined != key:
            raise RuntimeError(f"this process already joined a multi-process run {_joined}; it cannot join {key}")
        return None
    if cluster is None and process_id != 0:
        _wait_for_coordinator(coordinator_address, timeout)
    elif cluster is None:
        logging.getLogger("popeval").info("coordinator %s: waiting up to %g s for %d processes to join",
                                          coordinator_address, timeout, num_processes)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    limits = dict(initialization_timeout=int(timeout), heartbeat_timeout_seconds=math.ceil(heartbeat))
    try:
        if cluster is None:
            jax.distributed.initialize(coordinator_address, num_processes, process_id, **limits)
        else:
            jax.distributed.initialize(**limits)
    except RuntimeError as e:
        if "before" in str(e):
            raise RuntimeError("a multi-process run must start before JAX runs anything in this process "
                               f"(call it first): {e}") from None
        raise
    _joined = key
    where = f"detected by {cluster}" if cluster else f"coordinator {coordinator_address}"
    return f"process {jax.process_index()} of {jax.process_count()} ({where})"


def finish() -> None:
    """Leaves a multi-process run that ended well: waits until every process has finished
    (process 0 hosts the coordinator the others still talk to). Nothing on one process."""
    global _joined
    if _joined is not None:
        jax.distributed.shutdown()
        _joined = None


def lost_peer(error: BaseException) -> bool:
    """Whether `error` says another process of a multi-process run stopped (a failed
    collective or the coordination service)."""
    text = str(error)
    return _joined is not None and any(k in text for k in ("Gloo", "gloo", "coordination", "DEADLINE_EXCEEDED",
                                                           "heartbeat", "Connection reset"))


def process_index() -> int:
    """This process's index (0 on one process); process 0 is the one that writes."""
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def broadcast(tree: Any) -> Any:
    """Process 0's `tree` on every process (host arrays; typed keys kept). Every process passes
    a tree of the same shapes. One process: `tree` itself."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    out = multihost_utils.broadcast_one_to_all(jax.tree.map(lambda x: np.asarray(keys.to_raw(x)), tree))
    return jax.tree.map(lambda o, x: keys.from_raw(np.asarray(o), x), out, tree)


def broadcast_json(value: Any = None) -> Any:
    """Process 0's JSON-serialisable `value` on every process (the others pass anything)."""
    if jax.process_count() == 1:
        return value
    data = np.frombuffer(json.dumps(value).encode(), np.uint8) if jax.process_index() == 0 else np.zeros(0, np.uint8)
    size = int(broadcast(np.int32(data.size)))
    data = broadcast(np.pad(data, (0, size - data.size)))
    return json.loads(data.tobytes().decode())
