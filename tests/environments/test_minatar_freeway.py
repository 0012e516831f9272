"""Freeway-MinAtar against the `minatar` package, transition by transition (the harness is
tests/environments/minatar_helpers.py's): a crossing policy and random play, >= 20,000 transitions; the
scripted situations must occur. Also: the time limit through the public API.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from popeval.environments import make
from tests.environments.minatar_helpers import DOWN as D
from tests.environments.minatar_helpers import GAMES, Log, play_episode, reference, replay_transitions
from tests.environments.minatar_helpers import LEFT as L
from tests.environments.minatar_helpers import NOOP as N
from tests.environments.minatar_helpers import UP as U


def test_freeway_conformance():
    game = GAMES["freeway"]
    log, rng = Log(game, 7), np.random.default_rng(8)
    policies = [
        lambda g: int(rng.choice([N, U, D, L], p=[0.15, 0.7, 0.1, 0.05])),  # crosses often
        lambda g: int(rng.integers(6)),
    ]
    g = reference("freeway", 9)
    for i in range(9):
        g.reset()
        play_episode(log, g, policies[i % 3 == 2], 3_000)
    _, params = make("Freeway-MinAtar")
    before, rew, term = replay_transitions(log, params)
    new_speeds = np.asarray([a["car_speed"] for a in log.after]) != before["car_speed"]
    pos_after = np.asarray([a["pos"] for a in log.after])
    covered = {
        "crossings (speeds re-drawn)": (new_speeds.any(-1) & (rew == 1)).sum() > 100,
        "speeds unchanged otherwise": not new_speeds[rew == 0].any(),
        "hit by a car": ((pos_after == 9) & (before["pos"] < 8) & (rew == 0)).sum() > 100,
        "terminal on step 2501": (term & ~before["terminal"]).sum() == 9
        and (before["time"][term & ~before["terminal"]] == 2500).all(),
    }
    assert all(covered.values()), covered
    assert len(log) >= 20_000


def test_freeway_time_limit_public_api():
    env, params = make("Freeway-MinAtar")
    _, state = env.reset(jax.random.key(0), params)

    def body(s, key):
        _, s, _, done, info = env.step_env(key, s, jnp.int32(0), params)
        return s, info["terminated"]

    _, terminated = jax.lax.scan(body, state, jax.random.split(jax.random.key(1), 2502))
    assert np.flatnonzero(np.asarray(terminated)).tolist() == [2500, 2501]
