"""A population call from Python in pieces: one-device programs on threads (`popeval.sharding`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from popeval import keys
from popeval.sharding.devices import AXIS, _cores, _mesh

#: The options a thread can set for itself (`with jax.default_matmul_precision(...)`) that change
#: how a program is traced; a part runs on a pool thread only where they read as on the caller's.
THREAD_OPTIONS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_device", "jax_numpy_rank_promotion",
                  "jax_numpy_dtype_promotion", "jax_threefry_partitionable", "jax_default_prng_impl",
                  "jax_disable_jit", "jax_debug_nans", "jax_debug_infs")


def _thread_options() -> tuple:
    return tuple(getattr(jax.config, name, None) for name in THREAD_OPTIONS) + (jax.sharding.get_abstract_mesh(),)

__all__ = ["shard_members", "PART_EPISODES", "member_parts", "split_members", "on_one_device", "run_parts"]


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


#: A part on its own thread holds at least this many episodes a device: smaller parts gain less
#: than a thread costs (experiments/README.md, "Devices and threads").
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
    a pool's threads unless this thread set options of its own (`THREAD_OPTIONS`); outputs
    concatenated along the member axis on the first's device. One part: `fn(part)`."""
    if len(parts) == 1:
        return fn(parts[0])
    context = _thread_options()

    def elsewhere(p):  # None when the pool thread's options differ from the caller's
        return jax.block_until_ready(fn(p)) if _thread_options() == context else None

    futures = [_pool(len(parts) - 1).submit(elsewhere, p) for p in parts[1:]]
    outs = [jax.block_until_ready(fn(parts[0]))] + [f.result() for f in futures]
    outs = [jax.block_until_ready(fn(p)) if out is None else out for p, out in zip(parts, outs)]
    return jax.tree.map(lambda *xs: jnp.concatenate([jax.device_put(x, xs[0].sharding) for x in xs]), *outs)
