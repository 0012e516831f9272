"""Device sharding: the one package of popeval that mentions devices.

`RolloutWrapper` (`members`): on CPUs a population call from Python runs in one-device pieces,
`parts` a device (`member_parts`, `split_members`), each on its device and thread
(`run_parts`; a CPU device runs a program on the calling thread's core). A one-device program
rounds as one device does; a program over several devices (`shard_members`: inside a trace, on
accelerators) can round a chaotic task differently (README, Exactness).

The evolve loop (`generation`): on CPU devices a generation runs as one-device programs
(`Pieces`): ask on one device, evaluate pieces of the population on every device, gather the
fitness on the host (and over processes), update on one device, so any device count gives one
device's bits. On accelerators a generation is one program per device (`Replicated`:
`shard_map` over a mesh of the devices): every device receives the same replicated inputs,
takes its slice of the population by *global* member index, evaluates it, and all devices
`all_gather` the fitness so each runs the (cheap, deterministic) strategy update itself.
Padded slots (`P` padded to a multiple of the device or process count) evaluate a copy of the
last member and are dropped after the gather. Episode keys derive from member indices, never
from the layout, so any device count plays the same episodes.

Anakin (`popeval.agents.anakin`): a learner `vmap`ped over a batch of environments runs under
`Replicated`, its per-environment state split over the devices with `split_leading`. `pmap`
is plain `jax.pmap` over chosen devices (`popeval.agents.anakin_seed`). `use_all_cores()`
splits a CPU host into one device per core (before JAX starts its backends). Several
processes (`popeval.distributed`): a generation spans the devices of all processes, and every
process holds the same strategy state.
"""

from popeval.sharding.devices import _cores  # noqa: F401 - the tests' count of cores
from popeval.sharding.devices import AXIS, num_devices, on_cpus, pmap, resolve_devices, use_all_cores
from popeval.sharding.generation import Pieces, Replicated, gather_members, local_slice, split_leading
from popeval.sharding.members import (PART_EPISODES, member_parts, on_one_device, run_parts, shard_members,
                                      split_members)

__all__ = ["AXIS", "use_all_cores", "num_devices", "resolve_devices", "on_cpus", "pmap", "shard_members",
           "member_parts", "split_members", "on_one_device", "run_parts", "PART_EPISODES", "local_slice",
           "gather_members", "Replicated", "Pieces", "split_leading"]
