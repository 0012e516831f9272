"""Breakout-MinAtar against the `minatar` package, transition by transition (the harness is
tests/environments/minatar_helpers.py's): random play, a ball-tracking policy, sparse brick walls and a
sweep over every ball cell, direction, paddle column and move, >= 20,000 transitions; the
scripted situations must occur. Also: a terminated game stays frozen and `step` resets it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from popeval.environments import make
from tests.environments.minatar_helpers import GAMES, Log, play_episode, reference, replay_transitions
from tests.environments.minatar_helpers import LEFT as L
from tests.environments.minatar_helpers import NOOP as N
from tests.environments.minatar_helpers import RIGHT as R


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
        play_episode(log, g, random_policy, 1_000)
    while len(log) < 22_000:
        g.reset()
        if rng.random() < 0.5:  # a wall with few bricks left: cleared and refilled in play
            g.brick_map[1:4] = rng.random((3, 10)) < 0.1
        play_episode(log, g, tracking, 3_000)

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
    before, rew, term = replay_transitions(log, params)
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
