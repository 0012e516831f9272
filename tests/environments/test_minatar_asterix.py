"""Asterix-MinAtar against the `minatar` package, transition by transition (the harness is
tests/environments/minatar_helpers.py's): random play and a dodging policy, from the start and from
states along the difficulty ramp, with and without ramping, >= 20,000 transitions; the
scripted situations must occur.
"""

from __future__ import annotations

import numpy as np

from popeval.environments import make
from tests.environments.minatar_helpers import DOWN as D
from tests.environments.minatar_helpers import GAMES, Log, play_episode, reference, replay_transitions
from tests.environments.minatar_helpers import LEFT as L
from tests.environments.minatar_helpers import NOOP as N
from tests.environments.minatar_helpers import RIGHT as R
from tests.environments.minatar_helpers import UP as U


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
            play_episode(log, g, dodge if rng.random() < 0.7 else random_policy, 1_500)
        _, params = make("Asterix-MinAtar", difficulty_ramping=ramping)
        results.append((log, *replay_transitions(log, params)))

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
