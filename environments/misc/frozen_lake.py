"""FrozenLake-misc: walk from S to G across a frozen lake without falling into a hole.

The toy-text grid world of gymnasium's `FrozenLake-v1` (Brockman et al. 2016, "OpenAI Gym"),
which `tests/environments/test_misc.py` compares against transition by transition (its full table `P`)
and along trajectories with the same random draws.

Tiles: S start, F frozen, H hole, G goal; the 4x4 map by default, the 8x8 map with
`map_name="8x8"`, or any rectangular map via `desc`. Actions: 0 left, 1 down, 2 right, 3 up;
a move off the grid leaves the agent in place. When `is_slippery`, the agent moves in the
intended direction with probability `success_rate` (1/3) and in each of the two
perpendicular directions with probability `(1 - success_rate) / 2`. Reward 1 on entering
G, 0 otherwise; the episode terminates on entering H or G and is truncated after 100 steps
(`FrozenLake-v1`'s limit, for both maps; gymnasium's `FrozenLake8x8-v1` is the 8x8 map with
`max_steps_in_episode=200`). Stepping from H or G (possible only from an
injected state) stays there with reward 0 and terminates, as gymnasium's table says.

The slip follows gymnasium's sampling rule exactly: with `u ~ U[0, 1)` the outcome is the
first of `[(a - 1) % 4, a, (a + 1) % 4]` whose cumulative probability exceeds `u`
(`slide(u, ...)`), so both environments agree draw for draw (up to the float32 rounding of
`u` and of the interval ends). The observation is the tile
index `row * ncol + col` (an int32 scalar).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import bounded, flag, params_dataclass
from ..environment import Environment
from .common import DIRECTIONS

MAPS = {
    "4x4": ("SFFF", "FHFH", "FFFH", "HFFG"),
    "8x8": (
        "SFFFFFFF",
        "FFFFFFFF",
        "FFFHFFFF",
        "FFFFFHFF",
        "FFFHFFFF",
        "FHHFFFHF",
        "FHFFHFHF",
        "FFFHFFFG",
    ),
}


@struct.dataclass
class EnvState:
    pos: jax.Array  # int32 tile index row * ncol + col
    time: jax.Array


@params_dataclass
class EnvParams:
    is_slippery: bool = flag(True)
    success_rate: float = bounded(1.0 / 3.0, 0.0, 1.0)
    max_steps_in_episode: int = bounded(100, 1)


class FrozenLake(Environment):
    """Four actions (0 left, 1 down, 2 right, 3 up) on a fixed map (constructor argument)."""

    env_id = "FrozenLake-misc"
    def __init__(self, map_name: str = "4x4", desc: Sequence[str] | None = None):
        if desc is None:
            if map_name not in MAPS:
                raise ValueError(
                    f"FrozenLake: map_name must be one of {sorted(MAPS)}, got {map_name!r}"
                )
            desc = MAPS[map_name]
        rows = [str(r) for r in desc]
        if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
            raise ValueError(f"FrozenLake: desc must be equally long non-empty rows, got {desc!r}")
        if set("".join(rows)) - set("SFHG") or "S" not in "".join(rows):
            raise ValueError(f"FrozenLake: desc needs an S and only the letters SFHG, got {desc!r}")
        self.desc = tuple(rows)
        self.nrow, self.ncol = len(rows), len(rows[0])
        tiles = np.array([list(r) for r in rows]).ravel()
        self._start = jnp.asarray(tiles == "S", jnp.float32)  # start distribution (unnormalised)
        self._goal = jnp.asarray(tiles == "G")
        self._stop = jnp.asarray((tiles == "G") | (tiles == "H"))

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_state(self, key, params):
        pos = jax.random.choice(key, self.nrow * self.ncol, p=self._start / self._start.sum())
        return EnvState(pos=pos.astype(jnp.int32), time=jnp.int32(0))

    def transition(self, key, state, action, params):
        return self.slide(jax.random.uniform(key), state, action, params)

    def slide(self, u, state, action, params):
        """The transition for the slip draw `u` in [0, 1)."""
        fail = (1.0 - params.success_rate) / 2.0
        turn = jnp.where(u < fail, -1, jnp.where(u < fail + params.success_rate, 0, 1))
        direction = (action + jnp.where(params.is_slippery, turn, 0)) % 4
        row, col = jnp.divmod(state.pos, self.ncol)
        row = jnp.clip(row + jnp.asarray(DIRECTIONS)[direction, 0], 0, self.nrow - 1)
        col = jnp.clip(col + jnp.asarray(DIRECTIONS)[direction, 1], 0, self.ncol - 1)
        stopped = self._stop[state.pos]
        pos = jnp.where(stopped, state.pos, row * self.ncol + col).astype(jnp.int32)
        reward = jnp.where(~stopped & self._goal[pos], 1.0, 0.0)
        return state.replace(pos=pos), reward, self._stop[pos]

    def get_obs(self, state, params=None, key=None):
        return state.pos

    def observation_space(self, params=None):
        return spaces.Discrete(self.nrow * self.ncol)

    def action_space(self, params=None):
        return spaces.Discrete(4)
