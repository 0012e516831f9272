"""Device sharding of a population: the one module of popeval that mentions devices.

`RolloutWrapper`: on CPUs a population call from Python runs in one-device pieces, `parts`
a device (`member_parts`, `split_members`), each on its device and thread (`run_parts`; a CPU
device runs a program on the calling thread's core). A one-device program rounds as one device
does; a program over several devices (`shard_members`: inside a trace, on accelerators) can
round a chaotic task differently (README, Exactness).

The evolve loop (`Replicated`): a generation is one program per device (`shard_map` over a
mesh of the devices, jitted): every device receives the same replicated inputs (strategy
state, generation), takes its slice of the population by *global* member index, evaluates
it, and all devices `all_gather` the fitness so each runs the (cheap, deterministic) strategy
update itself. Padded slots (`P` padded to a multiple of the device count) evaluate a copy of
the last member and are dropped after the gather. Episode keys derive from member indices,
never from the layout, so 1, 2 or 4 devices play the same episodes (bit-identical runs on the
configs `tests/test_sharding.py` checks; not the shipped CartPole config: README, Exactness).

Anakin (`popeval.agents.anakin`): a learner `vmap`ped over a batch of environments runs under
`Replicated` too, its per-environment state split over the devices with `split_leading`.
`pmap` is plain `jax.pmap` over chosen devices (`popeval.agents.anakin_seed`).
`use_all_cores()` splits a CPU host into one device per core (before JAX starts its backends).
Several processes (`popeval.distributed`): a generation's mesh holds the devices of all
processes, so its member slices and its all-gather span them, and every process holds the
same strategy state.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from popeval import compiler, keys

try:  # the thread's JAX configuration that tracing depends on (JAX has no public name for it)
    from jax._src.config import trace_context as _trace_context
except ImportError:  # pragma: no cover - another JAX: every part on the calling thread
    _trace_context = None

__all__ = ["AXIS", "use_all_cores", "num_devices", "resolve_devices", "shard_members", "member_parts", "split_members",
           "on_one_device", "run_parts", "local_slice", "gather_members", "Replicated", "split_leading", "pmap"]

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


def shard_members(fn: Callable, devices: tuple) -> Callable:
    """`fn(keys, pop_params, *shared)` with `keys` and `pop_params` split along their leading
    (member) axis over `devices`, the other arguments replicated; every output leaf must have
    the member axis first. One device: `fn` itself."""
    if len(devices) == 1:
        return fn
    mesh = _mesh(devices)
    member, whole = PartitionSpec(AXIS), PartitionSpec()

    def sharded(keys_, pop_params, *shared):
        num_members = keys_.shape[0]
        pad = -num_members % len(devices)
        if pad:
            keys_, pop_params = jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, 0)]),
                                             (keys_, pop_params))
        mapped = jax.shard_map(fn, mesh=mesh, in_specs=(member, member) + (whole,) * len(shared),
                               out_specs=member, check_vma=False)
        out = mapped(keys_, pop_params, *shared)
        return jax.tree.map(lambda x: x[:num_members], out) if pad else out

    return sharded


#: A part on its own thread holds at least this many episodes a device (two parts of CartPole or
#: Pendulum ran slower at P=16 x 8, 1.4x faster at P=64 x 8).
PART_EPISODES = 256
_pool = functools.cache(lambda workers: ThreadPoolExecutor(workers, thread_name_prefix="popeval-part"))


def member_parts(devices: tuple, num_members: int, num_episodes: int, threads: int | None = None) -> int:
    """Parts of a population evaluation called from Python (`split_members`, `run_parts`): on CPU
    devices `threads` (default `cores // len(devices)`), fewer where a part would hold under
    `PART_EPISODES` episodes a device or the devices would not split the parts evenly; else 1."""
    if any(d.platform != "cpu" for d in devices):
        return 1
    threads = _cores() // len(devices) if threads is None else int(threads)
    parts = max(1, min(threads, num_episodes // (PART_EPISODES * len(devices))))
    while parts > 1 and num_members % (parts * len(devices)):
        parts -= 1
    return parts


def split_members(tree: Any, devices: tuple, parts: int = 1) -> list:
    """`tree` (member axis first) in pieces for a call from Python (`run_parts`). On CPUs `parts` pieces
    a device (sizes within one), each a view of the host memory on its device (JAX copies one not 64-byte
    aligned), for the one-device program. Elsewhere `tree` placed over `devices` as `shard_members` takes
    it (else JAX reshards it slice by slice). `[tree]` inside a trace, for arrays spanning processes, for
    one piece, and off the CPU for one device or a member count the devices do not divide."""
    leaves = jax.tree.leaves(tree)
    if not leaves or any(isinstance(x, jax.core.Tracer) or not getattr(x, "is_fully_addressable", True)
                         or np.ndim(x) == 0 for x in leaves):
        return [tree]
    members = np.shape(leaves[0])[0]
    if all(d.platform == "cpu" for d in devices):
        count = min(members, parts * len(devices))
        if count <= 1:
            return [tree]
        raw = [np.asarray(keys.to_raw(x)) for x in leaves]  # views of the CPU arrays' buffers, once

        def piece(x, r, i):  # piece i of a leaf, placed on its device
            v = r[i * members // count:(i + 1) * members // count]
            target = SingleDeviceSharding(devices[i * len(devices) // count])
            return keys.from_raw(jax.make_array_from_callback(v.shape, target, lambda index: v[index]), x)

        treedef = jax.tree.structure(tree)
        return [treedef.unflatten([piece(x, r, i) for x, r in zip(leaves, raw)]) for i in range(count)]
    if len(devices) == 1 or members % len(devices):
        return [tree]
    target = NamedSharding(_mesh(devices), PartitionSpec(AXIS))
    return [jax.tree.map(lambda x: x if getattr(x, "sharding", None) is not None
                         and x.sharding.is_equivalent_to(target, x.ndim) else jax.device_put(x, target), tree)]


def on_one_device(tree: Any) -> bool:
    """Whether every leaf is an array on one device (a CPU piece of `split_members`)."""
    return all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and len(x.devices()) == 1
               for x in jax.tree.leaves(tree))


def run_parts(fn: Callable, parts: list) -> Any:
    """`fn(part)` for every part of `split_members` side by side: the first here, the others on
    a pool's threads unless this thread is in a JAX configuration context (per thread); outputs
    concatenated along the member axis on the first's device. One part: `fn(part)`."""
    if len(parts) == 1:
        return fn(parts[0])
    context = None if _trace_context is None else _trace_context()

    def elsewhere(p):  # None when the pool thread's configuration differs from the caller's
        return jax.block_until_ready(fn(p)) if context is not None and _trace_context() == context else None

    futures = [_pool(len(parts) - 1).submit(elsewhere, p) for p in parts[1:]]
    outs = [jax.block_until_ready(fn(parts[0]))] + [f.result() for f in futures]
    outs = [jax.block_until_ready(fn(p)) if out is None else out for p, out in zip(parts, outs)]
    return jax.tree.map(lambda *xs: jnp.concatenate([jax.device_put(x, xs[0].sharding) for x in xs]), *outs)


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
    them), every argument replicated (one copy per device). The state lives on the devices
    between calls as a stacked copy per device: `replicate` places a host pytree once, a call
    maps stacked inputs to stacked outputs (fed straight back in), `first` copies this
    process's first copy to the host; `lower` and `compile` build the program from shapes
    alone (on another thread, while the state is being initialised). In a multi-process run
    the mesh holds every process's devices: each process places and reads only its own
    devices' copies, and `fn`'s collectives span all processes."""

    def __init__(self, fn: Callable, devices: int):
        every = jax.devices()  # global: a multi-process run maps over all of them
        if jax.process_count() > 1 and devices != len(every):
            raise ValueError(f"a multi-process generation runs on all {len(every)} global devices, not {devices}")
        self._all = every[:devices]
        self._devices = [d for d in self._all if d.process_index == jax.process_index()]
        mesh = _mesh(self._all)
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
    stacked = NamedSharding(_mesh(jax.local_devices()[:devices]), PartitionSpec(AXIS))

    def one(x):
        if x.shape[0] % devices:
            raise ValueError(f"a batch of {x.shape[0]} cannot be split evenly over {devices} device(s)")
        return jax.device_put(x.reshape((devices, x.shape[0] // devices) + x.shape[1:]), stacked)

    return jax.tree.map(one, tree)


def pmap(fn: Callable, devices: Any = None, axis_name: str = AXIS) -> Callable:
    """`jax.pmap(fn, axis_name)` over `resolve_devices(devices)` (default: every local device),
    compiled with JAX's defaults on the first call."""
    return jax.pmap(fn, axis_name=axis_name, devices=resolve_devices(devices))
