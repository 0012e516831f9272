"""SpaceInvaders-MinAtar against the `minatar` package, episode by episode (the harness is
tests/environments/minatar_helpers.py's): random play, an aiming policy, thinned waves and random states;
the scripted situations must occur. Also: the ramping switch, on our side alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from popeval.environments import make
from tests.environments.minatar_helpers import (
    BATCH,
    DOWN,
    FIRE,
    LEFT,
    NOOP,
    RIGHT,
    UP,
    Run,
    assert_conforms,
    cycle,
    fill,
    random_policy,
    record_runs,
    si_draws,
    si_state,
    step_many,
)


def si_aim(g, rng, fire=True):
    """Dodges enemy bullets about to land on the cannon, else moves under the nearest
    alien column and fires (or, with `fire=False`, waits for the aliens to land)."""

    def threatened(c):  # off the grid, or a bullet or an alien about to land on column c
        return not 0 <= c <= 9 or g.e_bullet_map[7:9, c].any() or g.alien_map[8:10, c].any()

    if threatened(g.pos):
        safe = [a for a, c in ((LEFT, g.pos - 1), (RIGHT, g.pos + 1)) if not threatened(c)]
        return safe[rng.randint(len(safe))] if safe else NOOP
    if not fire:
        return int(rng.choice([NOOP, LEFT, RIGHT]))
    cols = np.flatnonzero(g.alien_map.any(axis=0))
    target = cols[np.argmin(np.abs(cols - g.pos))]
    if target != g.pos:
        return RIGHT if target > g.pos else LEFT
    return FIRE if rng.rand() < 0.9 else int(rng.choice([NOOP, UP, DOWN]))


def si_random_state(g, rng):
    """Anywhere: sparse aliens (row 9 included), bullets, timers, direction, cannon."""
    g.alien_map = (rng.rand(10, 10) < rng.choice([0.05, 0.2, 0.5])).astype(float)
    if not g.alien_map.any():
        g.alien_map[rng.randint(10), rng.randint(10)] = 1
    g.f_bullet_map = (rng.rand(10, 10) < 0.05).astype(float)
    g.e_bullet_map = (rng.rand(10, 10) < 0.05).astype(float)
    g.alien_dir = int(rng.choice([-1, 1]))
    g.pos = rng.randint(10)
    g.enemy_move_interval = rng.randint(5, 13)
    g.alien_move_timer = rng.randint(0, 4)
    g.alien_shot_timer = rng.randint(0, 4)
    g.shot_timer = rng.randint(0, 6)
    g.ramp_index = rng.randint(0, 7)


def si_last_aliens(g, rng):
    """A thinned wave (faster aliens), each alien with a friendly bullet right below it:
    the wave is cleared next step, at the first, a middle or the last ramp level."""
    g.alien_map[:] = 0
    for _ in range(rng.randint(1, 4)):
        row, col = rng.randint(0, 8), rng.randint(0, 10)
        g.alien_map[row, col] = g.f_bullet_map[row + 1, col] = 1
    g.enemy_move_interval = int(rng.choice([12, 9, 7, 6]))
    g.ramp_index = 12 - g.enemy_move_interval
    g.alien_move_timer = rng.randint(1, 4)
    g.alien_dir = int(rng.choice([-1, 1]))


def si_events(ev, before, action, g, reward, terminal):
    ev["alien direction reversed"] += g.alien_dir != before["alien_dir"]
    moved = before["alien_move_timer"] == 0
    ev["aliens moved sideways"] += moved and g.alien_dir == before["alien_dir"]
    ev["move timer below the interval (thinned wave)"] += (
        moved and 0 < g.alien_move_timer + 1 < g.enemy_move_interval
    )
    ev["alien fired"] += before["alien_shot_timer"] == 0
    ev["fire while the gun cools"] += (action == FIRE) & (before["shot_timer"] > 0)
    ev["alien shot down"] += reward > 0
    ev["two aliens shot in one step"] += reward > 1
    new_wave = g.alien_map[0:4, 2:8].all() and g.alien_map.sum() == 24 and reward > 0
    ev["wave cleared"] += new_wave
    ev["wave cleared: first wave, faster"] += new_wave and before["enemy_move_interval"] == 12
    ev["wave cleared: faster"] += g.enemy_move_interval < before["enemy_move_interval"]
    ev["wave cleared: end of the ramp"] += (
        new_wave and g.enemy_move_interval == before["enemy_move_interval"]
    )
    if terminal:
        hit = before["e_bullet_map"][8, g.pos] or g.e_bullet_map[9, g.pos]
        ev["cannon hit by a bullet"] += hit
        ev["alien reached the cannon"] += g.alien_map[9, g.pos] > 0
        ev["aliens landed while reversing (row 9 wraps to 0)"] += (
            before["alien_map"][9].any() and g.alien_dir != before["alien_dir"]
        )


SI_RUNS = [
    Run(None, random_policy([NOOP, LEFT, RIGHT, FIRE]), 6000),
    Run(None, random_policy(range(6)), 2000),
    Run(None, si_aim, 7000),
    Run(None, lambda g, rng: si_aim(g, rng, fire=False), 1500),
    Run(si_last_aliens, si_aim, 1500, max_len=30),
    Run(si_random_state, random_policy(range(6)), 3000, max_len=25),
]


SI_EVENTS = (
    "alien direction reversed", "aliens moved sideways",
    "move timer below the interval (thinned wave)", "alien fired", "fire while the gun cools",
    "alien shot down", "two aliens shot in one step", "wave cleared",
    "wave cleared: first wave, faster", "wave cleared: faster", "wave cleared: end of the ramp",
    "cannon hit by a bullet", "alien reached the cannon",
    "aliens landed while reversing (row 9 wraps to 0)",
)  # fmt: skip


def test_space_invaders_conformance():
    env, params = make("SpaceInvaders-MinAtar", sticky_action_prob=0.0)
    rec = record_runs("space_invaders", SI_RUNS, si_state, si_draws, si_events, seed=0)
    missing = [name for name in SI_EVENTS if rec.events[name] == 0]
    assert not missing, f"situations never reached: {missing} ({dict(rec.events)})"
    assert_conforms(env, params, rec)


def test_space_invaders_ramp_switch():
    """Clearing a wave lowers the move interval only with `difficulty_ramping`, and never
    below `min_enemy_move_interval`."""
    env, params = make("SpaceInvaders-MinAtar", sticky_action_prob=0.0)
    last = np.zeros((10, 10), bool)
    last[3, 5] = True  # the last alien, and a bullet right below it
    state = env.reset_state(None, params).replace(
        alien_map=jnp.asarray(last), f_bullet_map=jnp.asarray(np.roll(last, 1, axis=0))
    )
    states = fill(state).replace(enemy_move_interval=cycle([12, 12, 6], jnp.int32))
    batch = fill(params).replace(difficulty_ramping=cycle([True, False, True], jnp.bool_))
    keys = jax.random.split(jax.random.key(0), BATCH)
    noop = cycle(NOOP, jnp.int32)
    _, nxt, reward, _, _ = step_many("SpaceInvaders-MinAtar")(keys, states, noop, batch)
    np.testing.assert_array_equal(reward, 1.0)
    np.testing.assert_array_equal(nxt.alien_map.sum(axis=(1, 2)), 24)
    np.testing.assert_array_equal(nxt.enemy_move_interval[:3], [11, 12, 6])
    np.testing.assert_array_equal(nxt.ramp_index[:3], [1, 0, 0])
