"""Freeway-MinAtar with an eighth channel: the cars that moved on the last step, what a second
stacked frame would show. A car moves every |speed| + 1 steps, so the step it moves on tells a
one-frame policy its countdown, which Freeway's own observation does not show. A pilot
(docs/zoo.md, "Freeway: what was tried"):

    popeval evolve --config experiments/configs/freeway_minatar.yaml \
        --env_module experiments.zoo.freeway_moved --env_name FreewayMoved-MinAtar
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from popeval.environments import register
from popeval.environments.minatar.common import OBS_COLS, lane_rows
from popeval.environments.minatar.freeway import EnvState, Freeway


@struct.dataclass
class MovedState(EnvState):
    moved: jax.Array  # (8,) bool: car i moved on the last step


class FreewayMoved(Freeway):
    env_id = "FreewayMoved-MinAtar"
    CHANNELS = (*Freeway.CHANNELS, "moved")

    def reset_state(self, key, params):
        state = super().reset_state(key, params)
        return MovedState(**{f: getattr(state, f) for f in state.__dataclass_fields__}, moved=jnp.zeros(8, bool))

    def apply(self, state, full_action, draws, params):
        next_state, reward, terminated = super().apply(state, full_action, draws, params)
        moved = jnp.where(state.terminal, state.moved, next_state.car_x != state.car_x)
        return next_state.replace(moved=moved), reward, terminated

    def get_obs(self, state, params=None, key=None):
        moved = OBS_COLS == lane_rows(jnp.where(state.moved, state.car_x, -1), -1)
        return jnp.concatenate([super().get_obs(state, params, key), moved], axis=-1)


register("FreewayMoved-MinAtar", FreewayMoved)
