"""Device sharding: the one package of popeval that mentions devices.

- `members`: a population call from Python. On CPUs it runs one-device programs on pieces of
  the population, side by side on threads (`member_parts`, `split_members`, `run_parts`), so
  any device count rounds as one device does; elsewhere one program over the devices
  (`shard_members`).
- `generation`: the evolve loop's generation. On CPUs one-device programs (`Pieces`: ask,
  evaluate pieces on every device, gather, update); on accelerators one program per device
  (`Replicated`: each evaluates its slice by global member index, all gather the fitness and
  run the update). Padded slots are dropped after the gather.
- `devices`: choosing and counting devices (`use_all_cores`: one CPU device per core).

Episode keys derive from member indices, never from the layout, so any device count plays the
same episodes; several processes (`popeval.distributed`) span the devices of all of them. The
longer story: experiments/README.md, "Devices and threads".
"""

from popeval.sharding.devices import (
    AXIS,
    _cores,  # noqa: F401 - the tests' count of cores
    num_devices,
    on_cpus,
    resolve_devices,
    use_all_cores,
)
from popeval.sharding.generation import Pieces, Replicated, gather_members, local_slice, split_leading
from popeval.sharding.members import PART_EPISODES, member_parts, on_one_device, run_parts, shard_members, split_members

__all__ = ["AXIS", "use_all_cores", "num_devices", "resolve_devices", "on_cpus", "shard_members",
           "member_parts", "split_members", "on_one_device", "run_parts", "PART_EPISODES", "local_slice",
           "gather_members", "Replicated", "Pieces", "split_leading"]
