"""What the five MinAtar games share: sticky actions, action sets, the observation space.

Young & Tian (2019), "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments". Reference implementation: the `minatar` package
(`minatar.Environment` wraps a game's `Env`; `act(a)` first replaces `a` by the previous
action with probability `sticky_action_prob`, then steps the game with an index into the
full action list `['n', 'l', 'u', 'r', 'd', 'f']`).

A game's `EnvState` extends `MinAtarState` (`terminal`, `last_action` and `time`, which
every game carries) and its `EnvParams` extends `MinAtarParams` (`sticky_action_prob`,
`max_steps_in_episode`); as flax struct dataclasses, they list the shared fields first.
A game subclasses `MinAtarEnv` and writes:
    CHANNELS: tuple[str, ...]          # observation channel names, in minatar's order
    MINIMAL_ACTIONS: tuple[str, ...]   # minatar's minimal_action_set(), as letters
    default_params, reset_state(key, params), get_obs(state, params, key)
    game_step(key, state, full_action, params) -> (state, reward, terminal)
where `full_action` is an int32 index into `FULL_ACTIONS` (sticky actions already applied).

Instead of `game_step`, a game may write its randomness and its logic apart (the default
`game_step` joins them):
    draw(key, state, params) -> draws                      # a small pytree of random draws
    apply(state, full_action, draws, params) -> (state, reward, terminal)   # deterministic
so that a conformance test can feed `apply` the draws the reference made with numpy.
The step's key split and sticky-action draw use `prng` (`jax.random`'s values, fused by XLA
instead of run as one loop per hash on CPUs); a game's own draws use `jax.random`, which
measured faster for values that many places of the step read (`prng`'s docstring).
`grid_mask(y, x)` builds one-hot 10x10 cells. Observations run fastest under vmap built as
one elementwise expression over `(10, 10, C)` from `OBS_ROWS`, `OBS_COLS`, a channel
iota and `lane_rows` (per-lane values of rows 1..8), not by stacking per-channel masks
(experiments/README.md, "MinAtar observations").

An out-of-range integer action indexes the action set with jnp's gather semantics:
values >= n act as the last action, negative values count from the end as in numpy
(-1 is the last action) and values below -n act as the first. This is the one exception to
the clipping rule of every other environment (`environment.py`): minatar indexes its Python
action list the same way, so `MinAtarEnv` sets `clip_discrete_actions = False`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import prng, spaces
from ..checks import bounded, params_dataclass
from ..environment import Environment

__all__ = [
    "FULL_ACTIONS",
    "MinAtarEnv",
    "MinAtarParams",
    "MinAtarState",
    "NO_TIME_LIMIT",
    "OBS_COLS",
    "OBS_ROWS",
    "grid_mask",
    "lane_rows",
]

FULL_ACTIONS = ("n", "l", "u", "r", "d", "f")

#: `max_steps_in_episode` meaning "no cap beyond the game's own terminal conditions".
NO_TIME_LIMIT = 2**31 - 1


@struct.dataclass
class MinAtarState:
    """The state fields of every game; a game's `EnvState` adds its own after them."""

    terminal: jax.Array  # bool: the game is over (its state then stays frozen)
    last_action: jax.Array  # int32 full-action index (sticky actions)
    time: jax.Array  # int32 steps in this episode


@params_dataclass
class MinAtarParams:
    """The parameters of every game; a game's `EnvParams` adds its own after them."""

    sticky_action_prob: float = bounded(0.1, 0.0, 1.0)
    max_steps_in_episode: int = bounded(NO_TIME_LIMIT, 1)


_ROWS = np.arange(10, dtype=np.int32)[:, None]
_COLS = np.arange(10, dtype=np.int32)[None, :]


#: Row and column iotas that broadcast against a trailing channel axis: `(10, 1, 1)`, `(1, 10, 1)`.
OBS_ROWS = np.arange(10, dtype=np.int32)[:, None, None]
OBS_COLS = np.arange(10, dtype=np.int32)[None, :, None]


def lane_rows(values, fill):
    """Values for rows 1..8 (shape `(8,)`) as a `(10, 1, 1)` column, `fill` on rows 0 and 9."""
    return jnp.pad(values, 1, constant_values=fill)[:, None, None]


def grid_mask(y, x):
    """`(..., 10, 10)` bool, True at cell `(y, x)` (row, column); off-grid gives no cell.

    `y` and `x` broadcast against each other (e.g. one cell per entity: shapes `(n,)`).
    """
    y = jnp.asarray(y)[..., None, None]
    x = jnp.asarray(x)[..., None, None]
    return (_ROWS == y) & (_COLS == x)


class MinAtarEnv(Environment):
    """Base class of the MinAtar games (10x10xC boolean observations)."""

    CHANNELS: tuple[str, ...] = ()
    MINIMAL_ACTIONS: tuple[str, ...] = ()
    clip_discrete_actions = False  # the reference's list indexing (module docstring)
    # minatar has no time limit (max_steps_in_episode = NO_TIME_LIMIT); rollout tools cap
    # episodes at gymnax's 1000 steps unless told otherwise.
    default_rollout_steps = 1000

    def __init__(self, use_minimal_action_set: bool = True):
        # The action set defines the action space's size, so it is a constructor argument.
        self.use_minimal_action_set = bool(use_minimal_action_set)
        letters = self.MINIMAL_ACTIONS if self.use_minimal_action_set else FULL_ACTIONS
        self.action_set = tuple(FULL_ACTIONS.index(a) for a in letters)

    def game_step(self, key, state, full_action, params):
        return self.apply(state, full_action, self.draw(key, state, params), params)

    def draw(self, key, state, params):
        """The random draws one game step may use (a pytree); none by default."""
        return None

    def apply(self, state, full_action, draws, params):
        """The deterministic game step given `draw`'s draws: `(state, reward, terminal)`."""
        raise NotImplementedError

    def transition(self, key, state, action, params):
        if type(self).draw is MinAtarEnv.draw and type(self).game_step is MinAtarEnv.game_step:
            # The game draws nothing: skip the split, a large share of a cheap step's cost.
            key_sticky = key_game = key
        else:
            key_sticky, key_game = prng.split(key)
        full_action = jnp.asarray(self.action_set, jnp.int32)[action]
        sticky = prng.uniform(key_sticky) < params.sticky_action_prob
        full_action = jnp.where(sticky, state.last_action, full_action)
        state = state.replace(last_action=full_action)
        return self.game_step(key_game, state, full_action, params)

    def observation_space(self, params=None):
        return spaces.Box(0, 1, (10, 10, len(self.CHANNELS)), jnp.bool_)

    def action_space(self, params=None):
        return spaces.Discrete(len(self.action_set))
