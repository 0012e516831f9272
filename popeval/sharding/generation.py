"""A generation over devices: `Pieces` (CPUs) and `Replicated` (accelerators, Anakin) (`popeval.sharding`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from popeval import compiler, keys
from popeval.sharding.devices import AXIS, _cores, _mesh
from popeval.sharding.members import _pool, member_parts, run_parts, split_members

__all__ = ["local_slice", "gather_members", "Replicated", "split_leading", "Pieces"]


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


class Pieces:
    """A generation on CPU devices as one-device programs, so that any count of devices and
    processes rounds as one device does (docs/exactness.md). `ask(state, seed)` runs on this
    process's first device; `evaluate(state, seed, asked, members)` on pieces of this process's
    share of the members (`member_parts` a device, side by side: `run_parts`); the pieces'
    outputs, gathered over processes, go to `update(state, seed, asked, gathered)` on the first
    device. Every process runs `ask` and `update` itself. The state lives on the first device
    between calls; `replicate`, `first`, `lower` and `compile` as `Replicated`'s."""

    def __init__(self, ask: Callable, evaluate: Callable, update: Callable, pop_size: int, devices: int,
                 episodes_per_member: int = 1):
        every = jax.devices()
        if jax.process_count() > 1 and devices != len(every):
            raise ValueError(f"a multi-process generation runs on all {len(every)} global devices, not {devices}")
        local = tuple(d for d in every[:devices] if d.process_index == jax.process_index())
        share = -(-pop_size // jax.process_count())  # members a process (the last pads with copies)
        ids = np.minimum(np.arange(share) + jax.process_index() * share, pop_size - 1).astype(np.int32)
        parts = member_parts(local, share, share * episodes_per_member)
        self._ids = [jax.device_put(p, local[0]) if isinstance(p, np.ndarray) else p
                     for p in split_members(ids, local, parts)]
        self._ask, self._evaluate, self._update = (jax.jit(f) for f in (ask, evaluate, update))
        self._first, self._pop_size, self._compiled = local[0], pop_size, {}

    def _key(self, fn: Callable, args: tuple) -> tuple:  # a program runs where it was compiled
        return (fn,) + tuple((np.shape(x), str(x.dtype), tuple(d.id for d in x.sharding.device_set))
                             for x in jax.tree.leaves(args))

    def _run(self, fn: Callable, *args: Any) -> Any:
        key = self._key(fn, args)
        if key not in self._compiled:
            self._compiled[key] = fn.lower(*args).compile(compiler.options())
        return self._compiled[key](*args)

    def replicate(self, tree: Any) -> Any:
        return jax.device_put(tree, self._first)

    def first(self, tree: Any) -> Any:
        return jax.tree.map(lambda x: keys.from_raw(np.asarray(keys.to_raw(x)), x), tree)

    def lower(self, state: Any, seed: Any) -> list:
        """Traces every program for arguments shaped like `(state, seed)`: `[(key, lowered)]`."""
        def on(device, tree, rows=None):  # specs on `device` (`rows`: another leading size)
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
                np.shape(x) if rows is None else (rows,) + tuple(np.shape(x)[1:]), x.dtype,
                sharding=SingleDeviceSharding(device)), tree)

        args = on(self._first, (state, seed))
        out = {self._key(self._ask, args): self._ask.lower(*args)}
        asked = next(iter(out.values())).out_info
        for ids in self._ids:
            piece = on(next(iter(ids.sharding.device_set)), (state, seed, asked)) + (ids,)
            if self._key(self._evaluate, piece) not in out:
                out[self._key(self._evaluate, piece)] = self._evaluate.lower(*piece)
        final = (*args, on(self._first, asked), on(self._first, out[self._key(self._evaluate, piece)].out_info,
                                                   self._pop_size))
        out[self._key(self._update, final)] = self._update.lower(*final)
        return list(out.items())

    def compile(self, lowered: list, options: dict | None = None) -> None:
        """Compiles `lower`'s programs side by side (one a device and piece shape)."""
        options = compiler.options() if options is None else options
        done = _pool(max(1, min(_cores(), len(lowered)))).map(lambda item: (item[0], item[1].compile(options)), lowered)
        self._compiled.update(done)

    def __call__(self, state: Any, seed: Any) -> Any:
        asked = self._run(self._ask, state, seed)

        def piece(ids):
            return self._run(self._evaluate, *jax.device_put((state, seed, asked), ids.sharding), ids)

        evaluated = run_parts(piece, self._ids)
        if jax.process_count() > 1:  # every process's share, in process order; padding dropped
            gathered = multihost_utils.process_allgather(evaluated, tiled=True)
            evaluated = jax.device_put(jax.tree.map(lambda x: x[:self._pop_size], gathered), self._first)
        return self._run(self._update, state, seed, asked, evaluated)


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
