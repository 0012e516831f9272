"""`make(env_id, compat="gymnax")`: gymnax's variant of an id, where it is a parameter choice.

popeval's environments follow their reference implementations (gymnasium, minatar, bsuite),
which the conformance tests step side by side; gymnax made other choices for some of the
same ids. The preset reproduces gymnax's where the difference is a parameter, a
constructor argument or the observation's dtype or shape:

    env, env_params = make("Breakout-MinAtar", compat="gymnax")
    # no sticky actions, float32 observations, episodes capped at 1000 steps, as gymnax

`GYMNAX` lists, per id, what the preset changes; ids absent from it either agree with
gymnax or differ in ways no parameter reproduces (docs/environments.md, "Differences from gymnax").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from . import spaces
from .environment import Environment

__all__ = ["GYMNAX", "ObservationView", "Preset", "observation_view", "preset"]


@dataclasses.dataclass(frozen=True)
class Preset:
    """What a preset changes: constructor arguments, `EnvParams` fields, observations."""

    env_kwargs: dict = dataclasses.field(default_factory=dict)
    params: dict = dataclasses.field(default_factory=dict)
    obs_dtype: Any = None  # cast observations to this dtype
    flatten_obs: bool = False  # drop bsuite's leading axis of 1: (1, n) -> (n,)


def _minatar(max_steps: int = 1000) -> Preset:
    # gymnax's MinAtar has no sticky actions, float32 observations and a step cap
    # (minatar itself: 0.1, bool, none; Freeway's own 2500-step game clock ends it anyway).
    return Preset(params={"sticky_action_prob": 0.0, "max_steps_in_episode": max_steps}, obs_dtype=jnp.float32)


#: id -> gymnax's variant (gymnax 0.0.9 and 1.0 agree on these).
GYMNAX: dict[str, Preset] = {
    "Breakout-MinAtar": _minatar(),
    "Asterix-MinAtar": _minatar(),
    "Freeway-MinAtar": _minatar(2500),
    "SpaceInvaders-MinAtar": _minatar(),
    "Seaquest-MinAtar": _minatar(),
    "DeepSea-bsuite": Preset(env_kwargs={"size": 8}),
    "MemoryChain-bsuite": Preset(flatten_obs=True),
    "UmbrellaChain-bsuite": Preset(flatten_obs=True),
    "DiscountingChain-bsuite": Preset(flatten_obs=True),
    "FourRooms-misc": Preset(obs_dtype=jnp.int32),
    "MetaMaze-misc": Preset(params={"wall_penalty": 0.0}),  # gymnax's `punishment` is 0
}

PRESETS = {"gymnax": GYMNAX}


class ObservationView(Environment):
    """`env` with its observations cast to `obs_dtype` and/or flattened to one axis.

    Everything else (params, state, dynamics, action space, rendering) is `env`'s own.
    """

    def __init__(self, env: Environment, obs_dtype: Any = None, flatten: bool = False):
        self.env = env
        self.obs_dtype = None if obs_dtype is None else jnp.dtype(obs_dtype)
        self.flatten = bool(flatten)
        self.stochastic = env.stochastic
        self.clip_discrete_actions = env.clip_discrete_actions

    @property
    def name(self) -> str:
        return self.env.name

    @property
    def unwrapped(self) -> Environment:
        return self.env.unwrapped

    @property
    def default_params(self) -> Any:
        return self.env.default_params

    @property
    def default_rollout_steps(self) -> int | None:
        return self.env.default_rollout_steps

    def reset_state(self, key, params):
        return self.env.reset_state(key, params)

    def transition(self, key, state, action, params):
        return self.env.transition(key, state, action, params)

    def get_obs(self, state, params=None, key=None):
        obs = self.env.get_obs(state, params, key)
        if self.flatten:
            obs = obs.reshape(-1)
        return obs if self.obs_dtype is None else obs.astype(self.obs_dtype)

    def observation_space(self, params=None) -> spaces.Box:
        space = self.env.observation_space(params)
        shape = (math.prod(space.shape),) if self.flatten else space.shape
        dtype = space.dtype if self.obs_dtype is None else self.obs_dtype
        return spaces.Box(space.low.reshape(shape), space.high.reshape(shape), shape, dtype)

    def action_space(self, params=None) -> spaces.Space:
        return self.env.action_space(params)

    def state_space(self, params=None) -> spaces.Dict:
        return self.env.state_space(params)


def preset(env_id: str, compat: str | None) -> Preset | None:
    """The preset of `env_id` under `compat` (`None`: none); `ValueError` for an unknown name."""
    if compat is None:
        return None
    if compat not in PRESETS:
        raise ValueError(f"compat={compat!r} is not a preset; presets: {sorted(PRESETS)} (or None)")
    return PRESETS[compat].get(env_id, Preset())


def observation_view(env: Environment, preset: Preset) -> Environment:
    """`env` with the preset's observation changes (itself when there are none)."""
    if preset.obs_dtype is None and not preset.flatten_obs:
        return env
    return ObservationView(env, preset.obs_dtype, preset.flatten_obs)
