"""Conformance of Breakout-, Asterix- and Freeway-MinAtar with the `minatar` package.

The reference game (`minatar.Environment(game, sticky_action_prob=0).env`) plays whole
episodes (random play and game-specific scripted policies and states) with its numpy
`RandomState` replaced by a recorder. Every transition is replayed through our
deterministic `apply(state, full_action, draws, params)` in one jitted vmapped call: the
reference's state before the step is converted into our `EnvState` and its recorded
draws into our `draws` pytree (`rand()` values as they are; `randint(n)` = k as the
uniform `(k + 0.5) / n`; Freeway's `randint(1, 6)` speed and `rand()` direction as the
uniform of that signed speed; draws the step did not use are filled with fresh
uniforms, so a step that wrongly reads them disagrees). Next state (every field),
observation, reward and terminal must agree exactly, over >= 20,000 transitions per
game. Each game also checks that its scripted situations occurred. Resets, sticky
actions, out-of-range actions, action sets and vmap over params are tested here too;
the generic API contract (jit, vmap over keys, spaces, retracing) is in
tests/test_envs_generic.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from minatar import Environment as MinAtarReference

from popeval.environments import make
from popeval.environments.minatar.asterix import SpawnDraws
from popeval.environments.minatar.freeway import CarDraws

IDS = ("Breakout-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar")
N, L, U, R, D, F = range(6)  # full action indices


class Recorder:
    """A numpy RandomState that logs every draw the game makes."""

    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)
        self.log = []

    def rand(self, *size):
        v = self.rs.rand(*size)
        self.log.append(("rand", np.copy(v)))
        return v

    def randint(self, *args):
        v = self.rs.randint(*args)
        self.log.append(("randint", args, np.copy(v)))  # freeway scales it in place
        return v


def reference(game, seed, ramping=True):
    g = MinAtarReference(game, sticky_action_prob=0.0, difficulty_ramping=ramping).env
    g.random = Recorder(seed)
    g.reset()
    return g


# ------------------------------------------------------------- reference -> our pytrees
def breakout_state(g):
    return dict(
        ball_x=g.ball_x, ball_y=g.ball_y, ball_dir=g.ball_dir, pos=g.pos, last_x=g.last_x,
        last_y=g.last_y, brick_map=g.brick_map.astype(bool), strike=g.strike,
        terminal=g.terminal,
    )


def asterix_state(g):
    ents = [e if e is not None else [0, 0, False, False] for e in g.entities]
    return dict(
        player_x=g.player_x, player_y=g.player_y,
        entity_x=np.array([e[0] for e in ents]),
        entity_right=np.array([bool(e[2]) for e in ents]),
        entity_gold=np.array([bool(e[3]) for e in ents]),
        entity_active=np.array([e is not None for e in g.entities]),
        spawn_speed=g.spawn_speed, spawn_timer=g.spawn_timer, move_speed=g.move_speed,
        move_timer=g.move_timer, ramp_timer=g.ramp_timer, ramp_index=g.ramp_index,
        terminal=g.terminal,
    )


def freeway_state(g):
    return dict(
        pos=g.pos, move_timer=g.move_timer,
        car_x=np.array([c[0] for c in g.cars]), car_timer=np.array([c[2] for c in g.cars]),
        car_speed=np.array([c[3] for c in g.cars]), terminal=g.terminal,
        time=2500 - g.terminate_timer,  # our `time` is the reference's terminate timer
    )


def asterix_draws(log, before, rng):
    u = list(rng.random(3))
    if log:  # rand() side, rand() gold[, randint(n_free) slot]
        u[0], u[1] = log[0][1], log[1][1]
        if len(log) == 3:
            n = log[2][1][0]
            u[2] = (log[2][2] + 0.5) / n
    return u


def freeway_draws(log, before, rng):
    u = rng.random((1, 8))
    if log:  # randint(1, 6, 8) speeds, rand(8) directions -> one of 10 signed speeds
        speed, right = log[0][2], log[1][1] > 0.5
        u[0] = (np.where(right, speed + 4, speed - 1) + 0.5) / 10
    return u


@dataclasses.dataclass(frozen=True)
class Game:
    id: str
    game: str
    to_state: Callable  # reference game -> dict of our EnvState fields
    to_draws: Callable | None  # (log, before, rng) -> draws as (fields, ...) arrays
    draws_type: type | None


GAMES = {
    "breakout": Game("Breakout-MinAtar", "breakout", breakout_state, None, None),
    "asterix": Game("Asterix-MinAtar", "asterix", asterix_state, asterix_draws, SpawnDraws),
    "freeway": Game("Freeway-MinAtar", "freeway", freeway_state, freeway_draws, CarDraws),
}


class Log:
    """Transitions of the reference, to replay through ours in one batch."""

    def __init__(self, game: Game, seed: int):
        self.game, self.rng = game, np.random.default_rng(seed)
        self.before, self.actions, self.draws = [], [], []
        self.after, self.rewards, self.terminals, self.obs = [], [], [], []

    def step(self, g, action):
        before = self.game.to_state(g)
        g.random.log.clear()
        reward, terminal = g.act(action)
        if self.game.to_draws is None:
            assert g.random.log == [], "Breakout draws only at reset"
        else:
            self.draws.append(self.game.to_draws(g.random.log, before, self.rng))
        self.before.append(before)
        self.actions.append(action)
        self.after.append(self.game.to_state(g))
        self.rewards.append(reward)
        self.terminals.append(terminal)
        self.obs.append(g.state())
        return reward, terminal

    def __len__(self):
        return len(self.actions)


def _stack(dicts, env, params):
    state = env.reset_state(jax.random.key(0), params)
    fields = {k: np.stack([np.asarray(d[k]) for d in dicts]) for k in dicts[0]}
    n = len(dicts)
    for f in dataclasses.fields(state):  # fields the reference lacks: time, last_action
        x = getattr(state, f.name)
        fields.setdefault(f.name, np.broadcast_to(x, (n,) + x.shape))
    return type(state)(**{k: jnp.asarray(v, getattr(state, k).dtype) for k, v in fields.items()})


def _canonical(game, state):
    """Asterix: entity fields of empty slots carry no meaning."""
    d = {k: np.asarray(v) for k, v in vars(state).items() if k not in ("time", "last_action")}
    if game.game == "asterix":
        for k in ("entity_x", "entity_right", "entity_gold"):
            d[k] = np.where(d["entity_active"], d[k], 0)
    return d


def replay(log: Log, params):
    """Steps every logged transition through our `apply`; asserts full agreement."""
    env, _ = make(log.game.id)
    before = _stack(log.before, env, params)
    after = _stack(log.after, env, params)
    actions = jnp.asarray(log.actions, jnp.int32)
    draws = None
    if log.game.draws_type is not None:
        u = np.asarray(log.draws, np.float32)
        draws = log.game.draws_type(*np.moveaxis(u, 1, 0))

    @jax.jit
    def run(s, a, d):
        nxt, r, t = jax.vmap(lambda s, a, d: env.apply(s, a, d, params))(s, a, d)
        return nxt, r, t, jax.vmap(env.get_obs)(nxt)

    nxt, rew, term, obs = run(before, actions, draws)
    ours, ref = _canonical(log.game, nxt), _canonical(log.game, after)
    for k in ref:
        bad = np.flatnonzero((ours[k] != ref[k]).reshape(len(log), -1).any(-1))
        assert bad.size == 0, f"{k}: first mismatch at transition {bad[0]} of {len(log)}"
    np.testing.assert_array_equal(np.asarray(rew), np.asarray(log.rewards, np.float32))
    np.testing.assert_array_equal(np.asarray(term), np.asarray(log.terminals))
    bad = np.flatnonzero((np.asarray(obs) != np.stack(log.obs)).reshape(len(log), -1).any(-1))
    assert bad.size == 0, f"observation: first mismatch at transition {bad[0]}"
    assert obs.dtype == jnp.bool_
    return {k: np.asarray(v) for k, v in vars(before).items()}, np.asarray(rew), np.asarray(term)


def play(log, g, policy, max_steps, extra_after_terminal=2):
    """One episode from `g`'s current state; a couple of steps after termination too."""
    for _ in range(max_steps):
        _, terminal = log.step(g, policy(g))
        if terminal:
            for _ in range(extra_after_terminal):
                log.step(g, policy(g))
            return


# ------------------------------------------------------------------------- Breakout
def test_breakout_conformance():
    game = GAMES["breakout"]
    log, rng = Log(game, 0), np.random.default_rng(1)
    random_policy = lambda g: int(rng.integers(6))  # noqa: E731

    def tracking(g):  # heads for where the ball will reach row 8, with noise
        if rng.random() < 0.03:
            return int(rng.integers(6))
        x, dx = g.ball_x, (1 if g.ball_dir in (1, 2) else -1)
        for _ in range(8 - g.ball_y if g.ball_dir >= 2 else 0):
            x += dx
            if not 0 <= x <= 9:
                x, dx = min(9, max(0, x)), -dx
        return L if x < g.pos else R if x > g.pos else N

    g = reference("breakout", 2)
    while len(log) < 8_000:
        g.reset()
        play(log, g, random_policy, 1_000)
    while len(log) < 22_000:
        g.reset()
        if rng.random() < 0.5:  # a wall with few bricks left: cleared and refilled in play
            g.brick_map[1:4] = rng.random((3, 10)) < 0.1
        play(log, g, tracking, 3_000)

    # Every ball cell, direction, paddle column and move from rows 0..8, with and
    # without a strike on the previous step, over a sparse and an empty brick wall.
    sweep = np.random.default_rng(3)
    for bricks in ("sparse", "empty"):
        for bx in range(10):
            for by in range(9):
                for d in range(4):
                    for pos in range(10):
                        for a in (N, L, R):
                            g.reset()
                            g.brick_map[:] = 0
                            if bricks == "sparse":
                                g.brick_map[0:9] = sweep.random((9, 10)) < 0.3
                            g.ball_x, g.ball_y, g.ball_dir, g.pos = bx, by, d, pos
                            g.last_x, g.last_y = int(sweep.integers(10)), int(sweep.integers(10))
                            g.strike = bool(sweep.random() < 0.5)
                            log.step(g, a)

    env, params = make("Breakout-MinAtar")
    before, rew, term = replay(log, params)
    after = {k: np.stack([a[k] for a in log.after]) for k in ("brick_map", "ball_y", "ball_dir")}
    live = ~before["terminal"]
    refills = live & ~before["brick_map"].any((1, 2)) & after["brick_map"].any((1, 2))
    bounce = live & (before["ball_y"] == 8) & (before["ball_dir"] >= 2) & (after["ball_y"] == 8)
    turned = after["ball_dir"] ^ before["ball_dir"]  # 1 horizontal, 3 vertical, 2 both
    leftward = before["ball_dir"] % 3 == 0
    at_wall = ((before["ball_x"] == 0) & leftward) | ((before["ball_x"] == 9) & ~leftward)
    ball_x = np.asarray([a["ball_x"] for a in log.after])
    in_brick = after["brick_map"][np.arange(len(log)), after["ball_y"], ball_x]
    covered = {
        "bricks broken": rew.sum() > 1000,
        "wall cleared and refilled": refills[:22_000].sum() > 20 and refills.sum() > 500,
        "paddle: ball from above": (bounce & (turned == 3)).sum() > 100,
        "paddle: ball onto its edge": (bounce & (turned == 2)).sum() > 100,
        "paddle + side wall": (bounce & at_wall).sum() > 10,
        "paddle missed": (live & term).sum() > 100,
        "side walls": (live & at_wall & (turned == 1)).sum() > 100,
        "top-corner": (live & at_wall & (before["ball_y"] == 0) & (turned == 2)).any(),
        "ball passes through a brick after a strike": (live & before["strike"] & in_brick).any(),
        "stepped after termination": (~live).sum() > 100,
    }
    assert all(covered.values()), covered
    assert len(log) >= 20_000


# -------------------------------------------------------------------------- Asterix
def asterix_dodge(rng):
    moves = {N: (0, 0), L: (-1, 0), U: (0, -1), R: (1, 0), D: (0, 1)}

    def policy(g):
        if rng.random() < 0.1:
            return int(rng.integers(6))
        danger = set()
        for e in g.entities:
            if e is not None and not e[3]:
                danger |= {(e[0], e[1]), (e[0] + (1 if e[2] else -1), e[1])}
        safe = [a for a, (dx, dy) in moves.items()
                if (min(9, max(0, g.player_x + dx)), min(8, max(1, g.player_y + dy))) not in danger]
        return int(rng.choice(safe)) if safe else N

    return policy


def test_asterix_conformance():
    game = GAMES["asterix"]
    rng = np.random.default_rng(4)
    random_policy = lambda g: int(rng.integers(6))  # noqa: E731
    dodge = asterix_dodge(rng)
    results = []
    for ramping, target in ((True, 17_000), (False, 4_000)):
        log = Log(game, 5)
        g = reference("asterix", 6, ramping)
        while len(log) < target:
            g.reset()
            if rng.random() < 0.5:  # somewhere along the difficulty ramp
                g.spawn_speed, g.move_speed = int(rng.integers(1, 11)), int(rng.integers(1, 6))
                g.spawn_timer = int(rng.integers(0, g.spawn_speed + 1))
                g.move_timer = int(rng.integers(0, g.move_speed + 1))
                g.ramp_timer, g.ramp_index = int(rng.integers(-1, 101)), int(rng.integers(0, 12))
            play(log, g, dodge if rng.random() < 0.7 else random_policy, 1_500)
        _, params = make("Asterix-MinAtar", difficulty_ramping=ramping)
        results.append((log, *replay(log, params)))

    (log, before, rew, term), (flat_log, before_flat, _, _) = results
    after_spawn = np.asarray([a["spawn_speed"] for a in log.after])
    after_move = np.asarray([a["move_speed"] for a in log.after])
    spawning = (before["spawn_timer"] == 0) & ~before["terminal"]
    full = before["entity_active"].all(-1)
    covered = {
        "spawn": spawning.sum() > 500,
        "spawn with all rows taken": (spawning & full).any(),
        "spawn faster": (after_spawn < before["spawn_speed"]).sum() > 20,
        "move faster": (after_move < before["move_speed"]).sum() > 5,
        "fully ramped": ((before["spawn_speed"] == 1) & (before["move_speed"] == 1)).any(),
        "gold": rew.sum() > 100,
        "enemy": (term & ~before["terminal"]).sum() > 50,
        "stepped after termination": before["terminal"].sum() > 50,
        "no ramp when off": all(
            a["spawn_speed"] == b["spawn_speed"] and a["ramp_timer"] == b["ramp_timer"]
            for a, b in zip(flat_log.after, flat_log.before)
        ),
    }
    assert all(covered.values()), covered
    assert sum(len(r[0]) for r in results) >= 20_000


# -------------------------------------------------------------------------- Freeway
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
        play(log, g, policies[i % 3 == 2], 3_000)
    _, params = make("Freeway-MinAtar")
    before, rew, term = replay(log, params)
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


# ------------------------------------------------------------------------ resets
def _resets(env_id, n=256):
    env, params = make(env_id)
    keys = jax.random.split(jax.random.key(0), n)
    obs, states = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys, params)
    return env, jax.tree.map(np.asarray, obs), states


def _assert_state(ours, ref, i=0):
    for k, v in ref.items():
        np.testing.assert_array_equal(np.asarray(getattr(ours, k))[i], v, err_msg=k)


def test_resets_match_reference():
    _, obs, states = _resets("Breakout-MinAtar")
    starts = np.asarray(states.ball_x)
    assert 0.4 < (starts == 9).mean() < 0.6 and set(starts.tolist()) == {0, 9}
    g = reference("breakout", 0)
    for start in (0, 9):
        while g.ball_x != start:
            g.reset()
        i = int(np.argmax(starts == start))
        _assert_state(states, breakout_state(g), i)
        np.testing.assert_array_equal(obs[i], g.state())

    _, obs, states = _resets("Asterix-MinAtar", 2)
    g = reference("asterix", 0)
    _assert_state(states, asterix_state(g))
    np.testing.assert_array_equal(obs[0], g.state())

    # Freeway: speeds drawn like the reference's; the rest matches it given its speeds.
    env, _, states = _resets("Freeway-MinAtar")
    speeds = np.asarray(states.car_speed).ravel()
    counts = np.bincount(np.abs(speeds), minlength=6)[1:]
    assert np.abs(counts - speeds.size / 5).max() < 5 * np.sqrt(speeds.size * 0.16)
    assert abs((speeds > 0).mean() - 0.5) < 5 * np.sqrt(0.25 / speeds.size)
    np.testing.assert_array_equal(states.car_timer, np.abs(states.car_speed))
    g = reference("freeway", 0)
    ref = freeway_state(g)
    ours = jax.tree.map(lambda x: x[0], states)
    ours = ours.replace(car_speed=jnp.asarray(ref["car_speed"]),
                        car_timer=jnp.asarray(ref["car_timer"]))
    _assert_state(jax.tree.map(lambda x: x[None], ours), ref)
    np.testing.assert_array_equal(np.asarray(jax.jit(env.get_obs)(ours)), g.state())


# ------------------------------------------------------------------ sticky / actions
def test_sticky_actions_statistics():
    env, params = make("Breakout-MinAtar", sticky_action_prob=0.3)
    _, state = env.reset(jax.random.key(0), params)
    state = state.replace(last_action=jnp.int32(L))
    keys = jax.random.split(jax.random.key(1), 8192)
    step = jax.jit(jax.vmap(env.step_env, in_axes=(0, None, None, None)))
    _, nxt, *_ = step(keys, state, jnp.int32(2), params)  # minimal action 2 is `r`
    sticky = np.asarray(nxt.last_action) == L
    assert set(np.asarray(nxt.last_action).tolist()) == {L, R}
    np.testing.assert_array_equal(np.asarray(nxt.pos), np.where(sticky, 3, 5))
    assert abs(sticky.mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / sticky.size)
    for p, expect in ((0.0, R), (1.0, L)):
        _, nxt, *_ = step(keys[:64], state, jnp.int32(2), params.replace(sticky_action_prob=p))
        assert (np.asarray(nxt.last_action) == expect).all()


def test_out_of_range_actions():
    """Index the action set as jnp does: >= n acts as the last, -1 .. -n count from the
    end, below -n acts as the first (common.py); wrong dtype or shape raises."""
    env, params = make("Breakout-MinAtar", sticky_action_prob=0.0)
    _, state = env.reset(jax.random.key(0), params)
    step = jax.jit(env.step_env)
    for action, pos in ((3, 5), (7, 5), (2**31 - 1, 5), (-1, 5), (-3, 4), (-9, 4)):
        _, nxt, *_ = step(jax.random.key(1), state, jnp.int32(action), params)
        assert int(nxt.pos) == pos, action
    with pytest.raises(TypeError):
        env.step_env(jax.random.key(1), state, jnp.float32(1.0), params)
    with pytest.raises(ValueError):
        env.step_env(jax.random.key(1), state, jnp.zeros(2, jnp.int32), params)


# ------------------------------------------------------------------------ public API
@pytest.mark.parametrize("env_id", IDS)
def test_action_sets_spaces_and_vmapped_params(env_id):
    """(jit / vmap over keys / spaces / retracing: tests/test_envs_generic.py.)"""
    ref = MinAtarReference(env_id.split("-")[0].lower())
    env, params = make(env_id)
    assert env.action_set == tuple(ref.minimal_action_set())
    assert env.action_space(params).n == len(ref.minimal_action_set())
    assert make(env_id, use_minimal_action_set=False)[0].action_space().n == ref.num_actions()
    assert env.observation_space(params).shape == tuple(ref.state_shape())
    assert env.CHANNELS == tuple(sorted(ref.env.channels, key=ref.env.channels.get))

    # vmap over params: one batch member never sticky, one always (last_action 0 at reset).
    batch = jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * 2), params)
    batch = batch.replace(sticky_action_prob=jnp.array([0.0, 1.0]))

    @jax.jit
    def reset_and_step(key, batch):
        _, states = jax.vmap(env.reset, in_axes=(None, 0))(key, batch)
        step = jax.vmap(env.step_env, in_axes=(None, 0, None, 0))
        return step(key, states, jnp.int32(1), batch)

    for key in (jax.random.PRNGKey(0), jax.random.key(0)):
        obs, nxt, reward, done, _ = reset_and_step(key, batch)
        assert np.asarray(nxt.last_action).tolist() == [env.action_set[1], 0]
        assert obs.shape == (2, 10, 10, len(env.CHANNELS)) and obs.dtype == jnp.bool_


def test_terminated_game_is_frozen_and_step_resets():
    env, params = make("Breakout-MinAtar", sticky_action_prob=0.0)
    _, state = env.reset(jax.random.key(0), params)
    state = state.replace(ball_x=jnp.int32(0), ball_y=jnp.int32(8), ball_dir=jnp.int32(2),
                          pos=jnp.int32(7))
    step_env = jax.jit(env.step_env)
    obs, dead, reward, done, info = step_env(jax.random.key(1), state, jnp.int32(0), params)
    assert bool(done) and bool(info["terminated"]) and int(dead.ball_y) == 9
    obs2, dead2, reward2, done2, _ = step_env(jax.random.key(2), dead, jnp.int32(2), params)
    assert bool(done2) and float(reward2) == 0.0 and int(dead2.pos) == int(dead.pos)
    np.testing.assert_array_equal(np.asarray(obs2), np.asarray(obs))
    _, fresh, *_ = jax.jit(env.step)(jax.random.key(1), state, jnp.int32(0), params)
    assert int(fresh.ball_y) == 3 and int(fresh.time) == 0 and not bool(fresh.terminal)


def test_freeway_time_limit_public_api():
    env, params = make("Freeway-MinAtar")
    _, state = env.reset(jax.random.key(0), params)

    def body(s, key):
        _, s, _, done, info = env.step_env(key, s, jnp.int32(0), params)
        return s, info["terminated"]

    _, terminated = jax.lax.scan(body, state, jax.random.split(jax.random.key(1), 2502))
    assert np.flatnonzero(np.asarray(terminated)).tolist() == [2500, 2501]
