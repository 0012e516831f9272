"""Conformance of SpaceInvaders-MinAtar and Seaquest-MinAtar with the `minatar` package.

The reference game (`minatar.Environment(game).env`, no sticky actions) is played in
Python by random and scripted policies, from its own start and from scripted start states
(written into the reference after `reset()` and converted into our `EnvState`). Its numpy
RandomState is replaced by a recorder, so each step's draws become our `SpawnDraws`. Our
deterministic `apply` then replays every recorded episode in one jitted `lax.scan`, and
observation, reward and terminal must agree exactly at every step (and the first
observation of every episode). Each game also asserts that the scripted situations of its
brief actually occurred. Sticky actions, out-of-range actions, the ramping switch and spawn
statistics are tested on our side alone (the API contract is tests/test_envs_generic.py's).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from minatar import Environment as MinAtarReference

from popeval.environments import make
from popeval.environments.minatar import seaquest as sq
from popeval.environments.minatar import space_invaders as si

NOOP, LEFT, UP, RIGHT, DOWN, FIRE = range(6)


class RecordingRandom:
    """Stands in for the reference game's `np.random.RandomState`, logging every draw."""

    def __init__(self, seed):
        self._rs = np.random.RandomState(seed)
        self.log = []

    def rand(self):
        v = self._rs.rand()
        self.log.append(v)
        return v

    def randint(self, low, high=None):
        v = self._rs.randint(low=low, high=high)
        self.log.append(v)
        return v

    def __getattr__(self, name):  # any other draw would go unrecorded: fail loudly
        raise AttributeError(f"unrecorded draw {name}")


@dataclasses.dataclass
class Run:
    """`num_steps` transitions: episodes start at `setup(game, rng)` (after `reset()`) and
    end at a terminal or after `max_len` steps; actions come from `policy(game, rng)`."""

    setup: Callable | None
    policy: Callable
    num_steps: int
    max_len: int = 10**9


@dataclasses.dataclass
class Record:
    starts: list  # our EnvState (numpy leaves) at each episode start
    first_obs: list  # the reference's observation there
    first: list  # per step: the first step of an episode
    episode: list  # per step: episode index
    actions: list
    draws: list
    obs: list
    rewards: list
    terminals: list
    events: collections.Counter


def play(game: str, runs: list[Run], to_state, to_draws, events, seed: int) -> Record:
    """Plays the reference game and records everything the replay needs."""
    g = MinAtarReference(game, sticky_action_prob=0.0).env
    g.random = RecordingRandom(seed)
    rng = np.random.RandomState(seed + 1)
    rec = Record([], [], [], [], [], [], [], [], [], collections.Counter())
    for run in runs:
        length = run.max_len  # forces a new episode at the start of the run
        for _ in range(run.num_steps):
            if length >= run.max_len or g.terminal:
                g.reset()
                if run.setup is not None:
                    run.setup(g, rng)
                rec.starts.append(to_state(g))
                rec.first_obs.append(g.state())
                length = 0
            rec.first.append(length == 0)
            rec.episode.append(len(rec.starts) - 1)
            action = run.policy(g, rng)
            before = _snapshot(g)
            g.random.log = []
            reward, terminal = g.act(action)
            events(rec.events, before, action, g, reward, terminal)
            rec.actions.append(action)
            rec.draws.append(to_draws(g.random.log))
            rec.obs.append(g.state())
            rec.rewards.append(reward)
            rec.terminals.append(terminal)
            length += 1
    return rec


def _snapshot(g):
    """A copy of the reference game's attributes (before a step)."""

    def copy(v):
        if isinstance(v, np.ndarray):
            return v.copy()
        return [list(e) for e in v] if isinstance(v, list) else v

    return {k: copy(v) for k, v in vars(g).items() if k != "random"}


def replay(env, params, rec: Record):
    """Our `apply` over the recorded steps in one jitted scan:
    `(first_obs, obs, rewards, terminals)`."""

    def run(starts, first, episode, actions, draws):
        def body(state, xs):
            first, episode, action, draw = xs
            start = jax.tree.map(lambda a: a[episode], starts)
            state = jax.tree.map(lambda a, b: jnp.where(first, a, b), start, state)
            state, reward, terminal = env.apply(state, action, draw, params)
            return state, (env.get_obs(state, params), reward, terminal)

        init = jax.tree.map(lambda a: a[0], starts)
        _, out = jax.lax.scan(body, init, (first, episode, actions, draws))
        return jax.vmap(lambda s: env.get_obs(s, params))(starts), *out

    starts = jax.tree.map(lambda *a: np.stack(a), *rec.starts)
    draws = None if rec.draws[0] is None else jax.tree.map(lambda *a: np.stack(a), *rec.draws)
    out = jax.jit(run)(
        starts, np.array(rec.first), np.array(rec.episode, np.int32),
        np.array(rec.actions, np.int32), draws,
    )  # fmt: skip
    return jax.tree.map(np.asarray, out)


def assert_conforms(env, params, rec: Record):
    first_obs, obs, rewards, terminals = replay(env, params, rec)
    np.testing.assert_array_equal(first_obs, np.array(rec.first_obs))
    ref_obs = np.array(rec.obs)
    bad = np.flatnonzero(
        np.any(obs != ref_obs, axis=(1, 2, 3))
        | (rewards != np.array(rec.rewards, np.float32))
        | (terminals != np.array(rec.terminals))
    )
    if bad.size:
        t = bad[0]
        cells = np.argwhere(obs[t] != ref_obs[t])
        raise AssertionError(
            f"first mismatch at step {t} (episode {rec.episode[t]}, action {rec.actions[t]}): "
            f"reward {rewards[t]} vs {rec.rewards[t]}, terminal {terminals[t]} vs "
            f"{rec.terminals[t]}, differing (row, col, channel): {cells.tolist()[:10]}"
        )
    assert len(rec.obs) >= 20_000


def random_policy(actions):
    return lambda g, rng: int(rng.choice(actions))


# ======================================================================== SpaceInvaders
def si_state(g):
    return si.EnvState(
        pos=np.int32(g.pos),
        alien_map=g.alien_map.astype(bool),
        f_bullet_map=g.f_bullet_map.astype(bool),
        e_bullet_map=g.e_bullet_map.astype(bool),
        alien_dir=np.int32(g.alien_dir),
        enemy_move_interval=np.int32(g.enemy_move_interval),
        alien_move_timer=np.int32(g.alien_move_timer),
        alien_shot_timer=np.int32(g.alien_shot_timer),
        ramp_index=np.int32(g.ramp_index),
        shot_timer=np.int32(g.shot_timer),
        terminal=np.bool_(g.terminal),
        last_action=np.int32(0),
        time=np.int32(0),
    )


def si_draws(log):
    assert not log, "SpaceInvaders draws no random numbers"
    return None


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
    rec = play("space_invaders", SI_RUNS, si_state, si_draws, si_events, seed=0)
    missing = [name for name in SI_EVENTS if rec.events[name] == 0]
    assert not missing, f"situations never reached: {missing} ({dict(rec.events)})"
    assert_conforms(env, params, rec)


# ============================================================================= Seaquest
def sq_state(g):
    """Our state from the reference's (its lists may hold enemies, divers and friendly
    bullets, but no enemy bullet: ours are tied to the sub that fired them)."""
    assert not g.e_bullets
    assert g.surface == (g.sub_y == 0)  # ours keeps no `surface` flag

    def table(rows, width, size):  # newest first, padded
        out = np.zeros((size, width), np.int32)
        out[: len(rows)] = np.array(rows[::-1], np.int32).reshape(-1, width)
        return out, np.arange(size) < len(rows)

    enemies, e_active = table([f + [0] for f in g.e_fish] + g.e_subs, 5, sq.MAX_ENEMIES)
    is_sub = np.zeros(sq.MAX_ENEMIES, bool)
    is_sub[: len(g.e_subs)] = True  # the subs were listed last: they come first here
    divers, d_active = table(g.divers, 4, sq.MAX_DIVERS)
    bullets, b_active = table(g.f_bullets, 3, sq.MAX_BULLETS)
    i32 = np.int32
    return sq.EnvState(
        sub_x=i32(g.sub_x), sub_y=i32(g.sub_y), sub_right=np.bool_(g.sub_or),
        oxygen=i32(g.oxygen), diver_count=i32(g.diver_count),
        bullet_x=bullets[:, 0], bullet_y=bullets[:, 1], bullet_right=bullets[:, 2] > 0,
        bullet_active=b_active,
        enemy_x=enemies[:, 0], enemy_y=enemies[:, 1], enemy_right=enemies[:, 2] > 0,
        enemy_sub=is_sub, enemy_active=e_active, enemy_move_timer=enemies[:, 3],
        enemy_shot_timer=enemies[:, 4],
        e_bullet_x=np.zeros(sq.MAX_ENEMIES, i32), e_bullet_active=np.zeros(sq.MAX_ENEMIES, bool),
        diver_x=divers[:, 0], diver_y=divers[:, 1], diver_right=divers[:, 2] > 0,
        diver_active=d_active, diver_move_timer=divers[:, 3],
        e_spawn_speed=i32(g.e_spawn_speed), e_spawn_timer=i32(g.e_spawn_timer),
        d_spawn_timer=i32(g.d_spawn_timer), move_speed=i32(g.move_speed),
        ramp_index=i32(g.ramp_index), shot_timer=i32(g.shot_timer),
        terminal=np.bool_(g.terminal),
        last_action=i32(0), time=i32(0),
    )  # fmt: skip


def sq_draws(log):
    """The reference draws (rand, rand, randint) for an enemy, then (rand, randint) for a
    diver; the unused fields get values that would be visible if read."""
    enemy, diver = {3: (log, []), 2: ([], log), 5: (log[:3], log[3:]), 0: ([], [])}[len(log)]
    enemy = enemy or [0.25, 0.25, 4]
    diver = diver or [0.25, 4]
    for u, p in ((enemy[0], 0.5), (enemy[1], 1 / 3), (diver[0], 0.5)):
        assert (np.float32(u) < np.float32(p)) == (u < p)  # float32 keeps the comparison
    return sq.SpawnDraws(
        np.float32(enemy[0]), np.float32(enemy[1]), np.int32(enemy[2]),
        np.float32(diver[0]), np.int32(diver[1]),
    )  # fmt: skip


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
    rec = play("seaquest", SQ_RUNS, sq_state, sq_draws, sq_events, seed=1)
    missing = [name for name in SQ_EVENTS if rec.events[name] == 0]
    assert not missing, f"situations never reached: {missing} ({dict(rec.events)})"
    assert rec.events["max enemies"] <= sq.MAX_ENEMIES
    assert rec.events["max divers"] <= sq.MAX_DIVERS
    assert rec.events["max friendly bullets"] <= sq.MAX_BULLETS
    assert_conforms(env, params, rec)


# ======================================================================= our side alone
IDS = ("SpaceInvaders-MinAtar", "Seaquest-MinAtar")


N = 4096  # the batch of every `step_many` call (one compilation per game)


@functools.cache
def step_many(env_id):
    """Jitted `step_env`, vmapped over `N` (typed) keys, states, actions and params."""
    env, _ = make(env_id)
    return jax.jit(jax.vmap(env.step_env))


def fill(tree):
    """`N` copies of every leaf (numpy first: no weakly typed leaves, no recompilation)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(np.asarray(x), (N, *np.shape(x))), tree)


def cycle(values, dtype):
    """`values` repeated up to length `N`."""
    return jnp.asarray(np.resize(np.asarray(values), N), dtype)


@pytest.mark.parametrize("env_id", IDS)
def test_spaces_and_action_sets(env_id):
    """(The API contract itself is tests/test_envs_generic.py's, for every registered id.)"""
    env, params = make(env_id)
    channels, minimal = {
        "SpaceInvaders-MinAtar": (6, (NOOP, LEFT, RIGHT, FIRE)),
        "Seaquest-MinAtar": (10, tuple(range(6))),
    }[env_id]
    space = env.observation_space(params)
    assert space.shape == (10, 10, channels) and space.dtype == jnp.bool_
    assert env.action_set == minimal and env.num_actions == len(minimal)
    full, _ = make(env_id, use_minimal_action_set=False)
    assert full.action_set == tuple(range(6)) and full.num_actions == 6


@pytest.mark.parametrize("env_id", IDS)
def test_sticky_actions(env_id):
    """`l` after `r`: with probability `sticky_action_prob` the previous `r` is repeated."""
    env, params = make(env_id)
    keys = jax.random.split(jax.random.key(0), N)
    state = env.reset(keys[0], params)[1].replace(last_action=jnp.int32(RIGHT))
    left = cycle(env.action_set.index(LEFT), jnp.int32)
    probs = cycle([0.0] * 10 + [1.0] * 10 + [0.25] * (N - 20), jnp.float32)
    batch = fill(params).replace(sticky_action_prob=probs)
    nxt = step_many(env_id)(keys, fill(state), left, batch)[1]
    pos = np.asarray(nxt.pos if env_id.startswith("Space") else nxt.sub_x)
    repeated = np.asarray(nxt.last_action) == RIGHT
    assert not repeated[:10].any() and repeated[10:20].all()
    np.testing.assert_array_equal(pos, np.where(repeated, 6, 4))
    assert abs(repeated[20:].mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / (N - 20))


@pytest.mark.parametrize("env_id", IDS)
def test_out_of_range_actions_are_clipped(env_id):
    env, params = make(env_id, sticky_action_prob=0.0)
    key = jax.random.key(3)
    state = env.reset(key, params)[1]
    actions = cycle([env.num_actions, 100, -1, -100], jnp.int32)
    nxt = step_many(env_id)(jax.random.split(key, N), fill(state), actions, fill(params))[1]
    first, last = env.action_set[0], env.action_set[-1]
    # -1 counts from the end, as in numpy
    np.testing.assert_array_equal(nxt.last_action[:4], [last, last, last, first])
    with pytest.raises(TypeError):
        env.step_env(key, state, jnp.float32(1.0), params)


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
    keys = jax.random.split(jax.random.key(0), N)
    noop = cycle(NOOP, jnp.int32)
    _, nxt, reward, _, _ = step_many("SpaceInvaders-MinAtar")(keys, states, noop, batch)
    np.testing.assert_array_equal(reward, 1.0)
    np.testing.assert_array_equal(nxt.alien_map.sum(axis=(1, 2)), 24)
    np.testing.assert_array_equal(nxt.enemy_move_interval[:3], [11, 12, 6])
    np.testing.assert_array_equal(nxt.ramp_index[:3], [1, 0, 0])


def test_seaquest_ramp_switch():
    """Surfacing with divers speeds the game up only with `difficulty_ramping`."""
    env, params = make("Seaquest-MinAtar", sticky_action_prob=0.0)
    state = env.reset_state(None, params).replace(
        sub_y=jnp.int32(1), diver_count=jnp.int32(3),
        oxygen=jnp.int32(50), ramp_index=jnp.int32(1),
    )  # fmt: skip
    batch = fill(params).replace(difficulty_ramping=cycle([True, False], jnp.bool_))
    keys = jax.random.split(jax.random.key(0), N)
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
    n = N
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
