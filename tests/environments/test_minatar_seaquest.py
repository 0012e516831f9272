"""Seaquest-MinAtar against the `minatar` package, episode by episode (the harness is
tests/environments/minatar_helpers.py's): random play, a diver-collecting policy, late in the difficulty
ramp, short of oxygen and crowded cells; the scripted situations must occur and the object
capacities must hold. Also, on our side alone: the ramping switch and spawn statistics.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from popeval.environments import make
from popeval.environments.minatar import seaquest as sq
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
    sq_draws,
    sq_state,
    step_many,
)


def sq_play(g, rng, eps=0.1):
    """Dodges enemies and enemy bullets, collects divers, surfaces for air or with 6
    divers, shoots enemies in its row; a random action with probability `eps`."""
    if rng.rand() < eps:
        return rng.randint(6)
    x, y = g.sub_x, g.sub_y
    enemies = [e[:3] for e in g.e_fish + g.e_subs]
    threats = enemies + [b[:3] for b in g.e_bullets]

    def danger(col, row):
        return any(
            ey == row and (abs(ex - col) <= 1 or 0 < (col - ex if er else ex - col) <= 3)
            for ex, ey, er in threats
        )

    cells = {NOOP: (x, y), LEFT: (max(0, x - 1), y), RIGHT: (min(9, x + 1), y),
             UP: (x, y - 1), DOWN: (x, min(8, y + 1))}  # fmt: skip

    def safe(a):
        col, row = cells[a]
        return (g.diver_count > 0 or y == 0) if row == 0 else not danger(col, row)

    if y == 0:
        return DOWN
    if g.diver_count > 0 and (g.diver_count >= 6 or g.oxygen < 12 + 3 * y) and safe(UP):
        return UP
    if g.divers and g.diver_count < 6:
        dx, dy = min((d[:2] for d in g.divers), key=lambda d: abs(d[0] - x) + abs(d[1] - y))
        want = (DOWN if dy > y else UP) if dy != y else (RIGHT if dx > x else LEFT)
        if (dx, dy) != (x, y) and safe(want):
            return want
    if any(ey == y and (ex > x) == g.sub_or for ex, ey, _ in enemies) and not danger(x, y):
        return FIRE
    options = [a for a in (NOOP, LEFT, RIGHT, UP, DOWN) if safe(a)]
    return int(rng.choice(options)) if options else rng.randint(6)


def sq_hard(g, rng):
    """Late in the difficulty ramp: enemies spawn every 1-6 steps and move every 3."""
    g.ramp_index = rng.randint(14, 26)
    g.e_spawn_speed = max(1, 20 - g.ramp_index)
    g.e_spawn_timer = rng.randint(0, 3)
    g.move_speed = 2
    g.diver_count = rng.randint(0, 7)


def sq_fastest(g, rng):
    """The end of the ramp (a spawn every step), the player safe on the surface: the most
    enemies alive at once."""
    g.ramp_index, g.e_spawn_speed, g.move_speed = 25, 1, 2


def sq_air(g, rng):
    """Below the surface, short of oxygen, with 0, some, or 6 divers (or fewer than 0, as
    the reference leaves it after a bonus)."""
    g.sub_y, g.surface = rng.randint(1, 9), False
    g.oxygen = rng.randint(1, 40)
    g.diver_count = int(rng.choice([0, 0, 1, 3, 5, 6, 6, -1]))
    g.ramp_index = rng.randint(0, 8)
    g.move_speed = max(2, 5 - g.ramp_index // 2)
    g.e_spawn_speed = 20 - g.ramp_index


def sq_up(g, rng):
    return UP if rng.rand() < 0.6 else rng.randint(6)


def sq_crowd(g, rng):
    """Enemies stacked on and around a cell of a row, often about to move on together,
    friendly bullets among them or heading for the cell they move to (several candidates
    for one bullet, or two bullets for one cell), the player and divers nearby."""
    row, right = rng.randint(1, 9), bool(rng.rand() < 0.5)
    step = 1 if right else -1
    c = rng.randint(2, 8)  # the stack's cell; c + 2 * step is on the grid
    for _ in range(rng.randint(2, 6)):
        x, timer = c + step * rng.randint(-1, 2), (0 if rng.rand() < 0.6 else rng.randint(1, 3))
        if rng.rand() < 0.5:
            g.e_subs.append([x, row, right, timer, rng.randint(0, 3)])
        else:
            g.e_fish.append([x, row, right, timer])
    candidates = [[c + 2 * step, row, not right], [c, row, right],
                  [c + rng.randint(-2, 3), row, bool(rng.rand() < 0.5)]]  # fmt: skip
    for i in rng.permutation(3)[: rng.randint(1, 3)]:
        if 0 <= candidates[i][0] <= 9:
            g.f_bullets.append(candidates[i])
    where = rng.rand()
    g.sub_x = c + step if where < 0.3 else rng.randint(0, 10)
    g.sub_y = row if where < 0.5 else rng.randint(1, 9)
    g.sub_or = (g.sub_x > 0 and rng.rand() < 0.5) if g.sub_x < 9 else True  # back on the grid
    g.surface = False
    g.shot_timer = 10  # no third friendly bullet
    g.diver_count = rng.randint(4, 7)
    if rng.rand() < 0.5:
        g.divers.append([c + step * rng.randint(-1, 2), row, right, rng.randint(0, 2)])
    for _ in range(rng.randint(0, 3 - len(g.divers))):  # on the player's cell or moving onto it
        right, behind = bool(rng.rand() < 0.5), rng.randint(0, 2)
        x = g.sub_x - behind if right else g.sub_x + behind
        if 0 <= x <= 9:
            g.divers.append([x, g.sub_y, right, rng.randint(0, 2)])


def sq_events(ev, before, action, g, reward, terminal):
    b = before
    if b["e_spawn_timer"] == 0:
        right, row = g.random.log[0] < 0.5, g.random.log[2]
        head_on = any(e[1] == row and e[2] != right for e in b["e_fish"] + b["e_subs"])
        ev["spawn refused (head-on)"] += head_on
        ev["enemy spawned"] += not head_on
    ev["diver spawned"] += b["d_spawn_timer"] == 0
    ev["sub fired"] += len(g.e_bullets) > len(b["e_bullets"])
    ev["diver picked up"] += g.diver_count > b["diver_count"] and g.sub_y > 0
    ev["two divers picked up at once"] += g.diver_count > b["diver_count"] + 1
    ev["diver left behind (6 aboard)"] += b["diver_count"] == 6 and any(
        d[:2] == [g.sub_x, g.sub_y] for d in g.divers)
    ev["enemy shot"] += reward > 0 and g.sub_y > 0
    ev["two enemies shot in one step"] += reward > 1 and g.sub_y > 0
    stacked = collections.Counter(tuple(e[:2]) for e in b["e_fish"] + b["e_subs"])
    ev["enemy shot on a shared cell"] += reward > 0 and max(stacked.values(), default=0) > 1
    surfaced = g.sub_y == 0 and b["sub_y"] > 0
    ev["surfaced with 1-5 divers"] += surfaced and 0 < b["diver_count"] < 6
    ev["surfaced with 6 divers (bonus)"] += surfaced and b["diver_count"] == 6 and reward > 0
    ev["surfaced with fewer than 0 divers"] += surfaced and b["diver_count"] < 0
    ev["surfaced without divers: death"] += surfaced and b["diver_count"] == 0 and terminal
    ev["ramp: move speed"] += g.move_speed < b["move_speed"]
    ev["ramp: spawn speed"] += g.e_spawn_speed < b["e_spawn_speed"]
    ev["ramp at its end"] += surfaced and b["e_spawn_speed"] == 1 and b["move_speed"] == 2
    if terminal and not surfaced:
        ev["oxygen ran out"] += b["oxygen"] <= 0
        player = [g.sub_x, g.sub_y]
        ev["hit by an enemy bullet"] += any(e[:2] == player for e in g.e_bullets)
        ev["hit by an enemy"] += any(e[:2] == player for e in g.e_fish + g.e_subs)
    ev["max enemies"] = max(ev["max enemies"], len(g.e_fish) + len(g.e_subs))
    ev["max divers"] = max(ev["max divers"], len(g.divers))
    ev["max friendly bullets"] = max(ev["max friendly bullets"], len(g.f_bullets))


SQ_RUNS = [
    Run(None, random_policy(range(6)), 6000),
    Run(None, sq_play, 8000),
    Run(sq_hard, sq_play, 4000, max_len=400),
    Run(sq_fastest, random_policy([NOOP, LEFT, RIGHT, FIRE]), 1000),
    Run(sq_air, sq_up, 1500, max_len=60),
    Run(sq_crowd, random_policy(range(6)), 2500, max_len=10),
]
SQ_EVENTS = (
    "enemy spawned", "spawn refused (head-on)", "diver spawned", "sub fired", "diver picked up",
    "two divers picked up at once", "diver left behind (6 aboard)", "enemy shot",
    "two enemies shot in one step", "enemy shot on a shared cell", "surfaced with 1-5 divers",
    "surfaced with 6 divers (bonus)", "surfaced with fewer than 0 divers",
    "surfaced without divers: death", "ramp: move speed", "ramp: spawn speed", "ramp at its end",
    "oxygen ran out", "hit by an enemy bullet", "hit by an enemy",
)  # fmt: skip


def test_seaquest_conformance():
    env, params = make("Seaquest-MinAtar", sticky_action_prob=0.0)
    rec = record_runs("seaquest", SQ_RUNS, sq_state, sq_draws, sq_events, seed=1)
    missing = [name for name in SQ_EVENTS if rec.events[name] == 0]
    assert not missing, f"situations never reached: {missing} ({dict(rec.events)})"
    assert rec.events["max enemies"] <= sq.MAX_ENEMIES
    assert rec.events["max divers"] <= sq.MAX_DIVERS
    assert rec.events["max friendly bullets"] <= sq.MAX_BULLETS
    assert_conforms(env, params, rec)


def test_seaquest_ramp_switch():
    """Surfacing with divers speeds the game up only with `difficulty_ramping`."""
    env, params = make("Seaquest-MinAtar", sticky_action_prob=0.0)
    state = env.reset_state(None, params).replace(
        sub_y=jnp.int32(1), diver_count=jnp.int32(3),
        oxygen=jnp.int32(50), ramp_index=jnp.int32(1),
    )  # fmt: skip
    batch = fill(params).replace(difficulty_ramping=cycle([True, False], jnp.bool_))
    keys = jax.random.split(jax.random.key(0), BATCH)
    up = cycle(env.action_set.index(UP), jnp.int32)
    _, nxt, reward, done, _ = step_many("Seaquest-MinAtar")(keys, fill(state), up, batch)
    assert not done.any()
    np.testing.assert_array_equal(nxt.oxygen, 200)
    np.testing.assert_array_equal(nxt.diver_count, 2)
    np.testing.assert_array_equal(nxt.e_spawn_speed[:2], [19, 20])
    np.testing.assert_array_equal(nxt.move_speed[:2], [4, 5])
    np.testing.assert_array_equal(nxt.ramp_index[:2], [2, 1])


def test_seaquest_spawn_statistics():
    """Our own draws: enemies and divers spawn on rows 1..8 uniformly, at either edge with
    probability 1/2, subs with probability 1/3 (one step from a state due to spawn)."""
    env, params = make("Seaquest-MinAtar", sticky_action_prob=0.0)
    n = BATCH
    state = env.reset_state(None, params).replace(
        e_spawn_timer=jnp.int32(0), d_spawn_timer=jnp.int32(0)
    )
    keys = jax.random.split(jax.random.key(7), n)
    nxt = step_many("Seaquest-MinAtar")(keys, fill(state), cycle(NOOP, jnp.int32), fill(params))[1]
    for kind, x, y, right, extra in (
        ("enemy", nxt.enemy_x[:, 0], nxt.enemy_y[:, 0], nxt.enemy_right[:, 0], nxt.enemy_sub[:, 0]),
        ("diver", nxt.diver_x[:, 0], nxt.diver_y[:, 0], nxt.diver_right[:, 0], None),
    ):
        x, y, right = np.asarray(x), np.asarray(y), np.asarray(right)
        np.testing.assert_array_equal(x, np.where(right, 0, 9), err_msg=kind)
        counts = np.bincount(y, minlength=10)
        assert counts[0] == counts[9] == 0, kind
        assert np.all(np.abs(counts[1:9] / n - 1 / 8) < 4 * np.sqrt(1 / 8 * 7 / 8 / n)), kind
        assert abs(right.mean() - 0.5) < 4 * np.sqrt(0.25 / n), kind
        if extra is not None:
            assert abs(np.asarray(extra).mean() - 1 / 3) < 4 * np.sqrt(2 / 9 / n)
    assert np.all(nxt.enemy_active[:, 0]) and np.all(nxt.diver_active[:, 0])
