"""Device sharding of a population: the one module of popeval that mentions devices.

`RolloutWrapper` (`shard_members`): its population methods split the member axis over the
local devices with `shard_map` (padding `P` to a multiple of the device count with copies of
the last member, dropped from the outputs). Every device runs the same per-member program,
but XLA compiles the sharded program differently, so on some chaotic tasks (CartPole) the
last bits differ from one device (README, Exactness).

The evolve loop (`Replicated`): a generation runs as one `jax.pmap`ped program: every device
receives the same replicated inputs (strategy state, generation), takes its slice of the
population by *global* member index, evaluates it, and all devices `all_gather` the fitness so each can run the (cheap,
deterministic) strategy update itself. The population is padded to a multiple of the device
count; padded slots evaluate a copy of the last member and are dropped after the gather, so
the padding never reaches the strategy. Since episode keys derive from member indices, never
from the device layout, 1, 2 or 4 devices play the same episodes (bit-identical runs on
the configs `tests/test_sharding.py` checks; see the caveat above for chaotic tasks).

Anakin (`popeval.agents.anakin`): a learner `vmap`ped over a batch of environments runs
under `Replicated` too; its per-environment state is split over the devices with
`split_leading` (global environment `i` lands on device `i // per_device`). `pmap` is plain `jax.pmap` over chosen devices, for code measured as
written (the seed's Anakin in `popeval.agents.anakin_seed`).

On a CPU, XLA runs one device on about one core; `use_all_cores()` splits the host into one
device per core (it must run before JAX initialises its backends).

Several processes (`initialize`, on `jax.distributed`): every process runs the same program;
a generation's mesh holds the devices of all processes, so its member slices and its
all-gather span them, and every process holds the same strategy state. CPU collectives
between processes go through gloo. `broadcast` and `broadcast_json` send process 0's values
to the others (what it read from the run directory).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from popeval import compiler, keys

__all__ = ["AXIS", "initialize", "finish", "lost_peer", "process_index", "process_count", "broadcast", "broadcast_json",
           "use_all_cores", "num_devices", "resolve_devices", "shard_members", "local_slice",
           "gather_members", "Replicated", "split_leading", "pmap"]

#: Name of the device axis inside a sharded generation.
AXIS = "devices"


#: What `initialize` joined: (coordinator_address, num_processes, process_id), or None.
_joined: tuple | None = None

#: Environment variables by which a cluster scheduler says this process is one of several
#: (the clusters `jax.distributed.initialize()` detects by itself).
_CLUSTER_SIZE = {"slurm": "SLURM_NTASKS", "open mpi": "OMPI_COMM_WORLD_SIZE"}


def _detected_cluster() -> str | None:
    """The scheduler that started this process as one of several, or None."""
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


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, timeout: float = 300) -> str | None:
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
    """
    global _joined
    given = (coordinator_address, num_processes, process_id)
    if all(v is None for v in given):
        cluster = _detected_cluster()
        if cluster is None:
            return None
        key = ("auto",)
    else:
        if any(v is None for v in given):
            raise ValueError("a multi-process run needs coordinator_address, num_processes and process_id "
                             f"together, got {coordinator_address!r}, {num_processes!r}, {process_id!r}")
        host, _, port = str(coordinator_address).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"coordinator_address must be HOST:PORT, got {coordinator_address!r}")
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise ValueError(f"num_processes must be a positive integer, got {num_processes!r}")
        if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id!r}")
        if num_processes == 1:
            return None
        key, cluster = given, None
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
    try:
        if cluster is None:
            jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                       initialization_timeout=int(timeout))
        else:
            jax.distributed.initialize(initialization_timeout=int(timeout))
    except RuntimeError as e:
        if "before" in str(e):
            raise RuntimeError("a multi-process run must start before JAX runs anything in this process "
                               f"(call it first): {e}") from None
        raise
    _joined = key
    where = f"detected by {cluster}" if cluster else f"coordinator {coordinator_address}"
    return (f"process {jax.process_index()} of {jax.process_count()} ({where}): "
            f"{jax.local_device_count()} local and {jax.device_count()} global device(s)")


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


def use_all_cores() -> str | None:
    """Gives JAX one CPU device per core unless the user chose a count; returns a log line."""
    if "JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores <= 1:
        return None
    try:
        jax.config.update("jax_num_cpu_devices", cores)
    except Exception:  # backends already initialised: keep what there is
        return None
    return f"using {cores} host CPU devices (one per core); set JAX_NUM_CPU_DEVICES to override"


def num_devices() -> int:
    """Devices a generation is sharded over: every device of every process (one process: its
    local devices)."""
    return jax.device_count()


def resolve_devices(devices: Any) -> tuple:
    """`None` (all local devices), a count `n` (the first `n`) or a sequence of devices ->
    a tuple of local devices."""
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


def _pad_members(tree: Any, pad: int) -> Any:
    return jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]), tree)


def shard_members(fn: Callable, devices: tuple) -> Callable:
    """`fn(keys, pop_params, *shared)` with `keys` and `pop_params` split along their leading
    (member) axis over `devices`, the other arguments replicated; every output leaf must have
    the member axis first. One device: `fn` itself."""
    if len(devices) == 1:
        return fn
    mesh = Mesh(np.array(devices), (AXIS,))
    member, whole = PartitionSpec(AXIS), PartitionSpec()

    def sharded(keys_, pop_params, *shared):
        num_members = keys_.shape[0]
        pad = -num_members % len(devices)
        if pad:
            keys_, pop_params = _pad_members((keys_, pop_params), pad)
        mapped = jax.shard_map(fn, mesh=mesh, in_specs=(member, member) + (whole,) * len(shared),
                               out_specs=member, check_vma=False)
        out = mapped(keys_, pop_params, *shared)
        return jax.tree.map(lambda x: x[:num_members], out) if pad else out

    return sharded


def local_slice(pop_size: int, devices: int) -> tuple[jax.Array, int]:
    """Inside a sharded function: this device's global member indices and slice size."""
    per_device = -(-pop_size // devices)
    first = jax.lax.axis_index(AXIS) * per_device
    return first + jnp.arange(per_device), per_device


def gather_members(x: Any, pop_size: int) -> Any:
    """All-gathers per-member values `(per_device, ...)` into `(pop_size, ...)` (padding dropped)."""
    def one(v):
        g = jax.lax.all_gather(v, AXIS)
        return g.reshape((-1,) + v.shape[1:])[:pop_size]

    return jax.tree.map(one, x)


class Replicated:
    """`fn` run on every device of `devices` (one program per device, `shard_map` over a mesh of
    them), every argument replicated (one copy per device).

    The state lives on the devices between calls as a stacked copy per device: `replicate`
    places a host pytree once, a call maps stacked inputs to stacked outputs (fed straight
    back in, no copies), and `first` copies this process's first copy to the host. A loop of
    calls dispatches no small eager operations; `lower` and `compile` build the program from
    shapes alone (on another thread, while the state is still being initialised).

    In a multi-process run (`initialize`) the mesh holds every process's devices: each process
    places and reads only its own devices' copies, and `fn`'s collectives span all processes.
    """

    def __init__(self, fn: Callable, devices: int):
        every = jax.devices()  # global: a multi-process run maps over all of them
        if jax.process_count() > 1 and devices != len(every):
            raise ValueError(f"a multi-process generation runs on all {len(every)} global devices, not {devices}")
        self._all = every[:devices]
        self._devices = [d for d in self._all if d.process_index == jax.process_index()]
        mesh = Mesh(np.array(self._all), (AXIS,))
        self._stacked = NamedSharding(mesh, PartitionSpec(AXIS))

        def one_copy(*args):  # this device's copy of every argument -> of every output
            out = fn(*jax.tree.map(lambda x: x[0], args))
            return jax.tree.map(lambda x: x[None], out)

        self._mapped = jax.jit(jax.shard_map(one_copy, mesh=mesh, in_specs=PartitionSpec(AXIS),
                                             out_specs=PartitionSpec(AXIS), check_vma=False))
        self._compiled = None

    def replicate(self, tree: Any) -> Any:
        """A host (or single-device) pytree -> its stacked per-device copies (copies only, no
        compiled program)."""
        def one(x):
            host = np.asarray(keys.to_raw(x))[None]
            parts = [jax.device_put(host, d) for d in self._devices]  # this process's devices
            out = jax.make_array_from_single_device_arrays((len(self._all),) + host.shape[1:], self._stacked, parts)
            return keys.from_raw(out, x)

        return jax.tree.map(one, tree)

    def lower(self, *specs: Any) -> Any:
        """Traces and lowers `fn` for arguments shaped like `specs` (one copy's shapes: arrays
        or `jax.ShapeDtypeStruct`s); `compile` the result. Safe to run on another thread."""
        stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
            (len(self._all),) + tuple(jnp.shape(x)), x.dtype, sharding=self._stacked), specs)
        return self._mapped.lower(*stacked)

    def compile(self, lowered: Any, options: dict | None = None) -> None:
        """Compiles `lower`'s result ahead of the first call with XLA `options` (default:
        `popeval.compiler.options()`)."""
        self._compiled = lowered.compile(compiler.options() if options is None else options)

    def __call__(self, *stacked: Any) -> Any:
        if self._compiled is None:
            self.compile(self.lower(*jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), stacked)))
        return self._compiled(*stacked)

    def first(self, tree: Any) -> Any:
        """Stacked copies -> this process's first copy, as host arrays (no compiled program)."""
        def one(x):
            data = x.addressable_shards[0].data
            return keys.from_raw(np.asarray(keys.to_raw(data))[0], data)

        return jax.tree.map(one, tree)


def split_leading(tree: Any, devices: int) -> Any:
    """`(devices * per_device, ...)` -> `(devices, per_device, ...)`: a batch in global order,
    stacked for a `Replicated` call over the first `devices` local devices and placed there
    (device `d` holds items `d * per_device` onwards), so the first call moves no data.

    Raises:
        ValueError when the leading axis is not a multiple of `devices`.
    """
    stacked = NamedSharding(Mesh(np.array(jax.local_devices()[:devices]), (AXIS,)), PartitionSpec(AXIS))

    def one(x):
        if x.shape[0] % devices:
            raise ValueError(f"a batch of {x.shape[0]} cannot be split evenly over {devices} device(s)")
        return jax.device_put(x.reshape((devices, x.shape[0] // devices) + x.shape[1:]), stacked)

    return jax.tree.map(one, tree)


def pmap(fn: Callable, devices: Any = None, axis_name: str = AXIS) -> Callable:
    """`jax.pmap(fn, axis_name)` over `resolve_devices(devices)` (default: every local device),
    compiled with JAX's defaults on the first call."""
    return jax.pmap(fn, axis_name=axis_name, devices=resolve_devices(devices))
