"""DeepSea-bsuite: a size x size grid where only a long run of "right" moves pays off.

Osband et al. (2020), "Behaviour Suite for Reinforcement Learning", ICLR; Osband et al.
(2019), "Deep Exploration via Randomized Value Functions". Reference implementation:
`bsuite.environments.deep_sea.DeepSea` (bsuite 0.3.x), which `tests/environments/test_bsuite.py` steps
side by side.

The agent starts in the top-left cell and drops one row per step, so every episode lasts
exactly `size` steps. In cell (row, col) action `action_mapping[row, col]` means "right"
(column + 1, at a cost of `unscaled_move_cost / size`) and the other action means "left"
(column - 1); both are clipped at the walls. Moving right from the rightmost column pays +1.
The observation is the (size, size) float32 one-hot of the agent's cell, all zeros after the
last step. With `deterministic=False` ("windy" DeepSea) a right move fails with probability
1/size (the agent only drops) and the rewards of the two bottom corner cells get N(0, 1)
noise added before the move.

Action mapping. bsuite draws the per-cell mapping once per environment object from
`mapping_seed` (`np.random.RandomState(mapping_seed).binomial(1, 0.5, [size, size])`). Here
the mapping is the `EnvParams.action_mapping` array: `DeepSea(size, mapping_seed)` fills the
default with exactly bsuite's draw (so `make("DeepSea-bsuite", size=N, mapping_seed=s)` is
bsuite's `DeepSea(N, mapping_seed=s)`), and any other mapping can be put in params
(`params.replace(action_mapping=...)`), e.g. a different one per member of a vmapped batch.
The default `mapping_seed=42` is the one bsuite's deep_sea sweep uses for every size; the default
`size=10` is the sweep's smallest. `randomize_actions=False` is bsuite's debug mode: action 1
is "right" everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import bounded, check_int, flag, params_dataclass
from ..environment import Environment
from .common import check_seed, one_hot_board


@struct.dataclass
class EnvState:
    row: jax.Array
    column: jax.Array
    time: jax.Array


@params_dataclass
class EnvParams:
    # (size, size) int32 in {0, 1}: the action that moves right in each cell
    action_mapping: jax.Array = bounded(low=0, high=1)
    deterministic: bool = flag(True)
    unscaled_move_cost: float = bounded(0.01, 0.0)  # a right move costs unscaled_move_cost / size
    max_steps_in_episode: int = bounded(10, 1)  # size: the natural episode length


def action_mapping(size: int, mapping_seed: int = 42, randomize_actions: bool = True) -> np.ndarray:
    """bsuite's action mapping of `DeepSea(size, mapping_seed=...)`: int32, (size, size)."""
    if not randomize_actions:
        return np.ones((size, size), np.int32)
    return np.random.RandomState(mapping_seed).binomial(1, 0.5, [size, size]).astype(np.int32)


def transition_draws(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The random numbers of one step: (reward noise ~ N(0, 1), uniform u in [0, 1)).

    They play bsuite's `rng.randn()` (the corner-cell noise) and `rng.rand()` (a right move
    succeeds when u > 1/size); only used when `deterministic` is False.
    """
    key_noise, key_move = jax.random.split(key)
    return jax.random.normal(key_noise), jax.random.uniform(key_move)


class DeepSea(Environment):
    """Two actions whose meaning (left/right) depends on the cell, see `action_mapping`."""

    env_id = "DeepSea-bsuite"
    stochastic = True  # the windy version (deterministic=False) uses the step key

    def __init__(self, size: int = 10, mapping_seed: int = 42, randomize_actions: bool = True):
        self.size = check_int("DeepSea-bsuite", "size", size, 1)
        self.mapping_seed = check_seed("DeepSea-bsuite", "mapping_seed", mapping_seed)
        self.randomize_actions = bool(randomize_actions)

    @property
    def default_params(self) -> EnvParams:
        mapping = action_mapping(self.size, self.mapping_seed, self.randomize_actions)
        return EnvParams(action_mapping=jnp.asarray(mapping), max_steps_in_episode=self.size)

    def reset_state(self, key, params):
        return EnvState(row=jnp.int32(0), column=jnp.int32(0), time=jnp.int32(0))

    def transition(self, key, state, action, params):
        n = self.size
        row, col = state.row, state.column
        noise, u = transition_draws(key)
        right = action == params.action_mapping[row, col]
        reward = jnp.where(right & (col == n - 1), 1.0, 0.0)
        noisy_cell = (row == n - 1) & ((col == 0) | (col == n - 1))
        reward = reward + jnp.where(jnp.logical_not(params.deterministic) & noisy_cell, noise, 0.0)
        moves_right = right & (params.deterministic | (u > 1.0 / n))
        reward = reward - jnp.where(right, params.unscaled_move_cost / n, 0.0)
        col = jnp.clip(jnp.where(moves_right, col + 1, jnp.where(right, col, col - 1)), 0, n - 1)
        next_state = state.replace(row=row + 1, column=col)
        return next_state, reward, next_state.row == n

    def get_obs(self, state, params=None, key=None):
        return one_hot_board((self.size, self.size), state.row, state.column)

    def observation_space(self, params=None):
        return spaces.Box(0.0, 1.0, (self.size, self.size), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)
