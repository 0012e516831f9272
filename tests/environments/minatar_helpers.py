"""Helpers of the MinAtar tests: the `minatar` package's games replayed through ours, and
batched steps of ours alone.

Two replay harnesses, both with the reference's numpy `RandomState` replaced by a recorder
so that its draws become our `draws` pytrees:

- transitions (Breakout, Asterix, Freeway): the reference game
  (`minatar.Environment(game, sticky_action_prob=0).env`) plays; `Log` records every
  transition, and `replay_transitions` steps them all through our deterministic
  `apply(state, full_action, draws, params)` in one jitted vmapped call: the reference's
  state before the step is converted into our `EnvState` and its recorded draws into our
  `draws` pytree (`rand()` values as they are; `randint(n)` = k as the uniform
  `(k + 0.5) / n`; Freeway's `randint(1, 6)` speed and `rand()` direction as the uniform of
  that signed speed; draws the step did not use are filled with fresh uniforms, so a step
  that wrongly reads them disagrees). Next state (every field), observation, reward and
  terminal must agree exactly.
- episodes (SpaceInvaders, Seaquest): `record_runs` plays `Run`s of random and scripted
  policies from the reference's own start and from scripted start states (written into the
  reference after `reset()` and converted into our `EnvState`); `replay_episodes` replays
  every recorded episode through our `apply` in one jitted `lax.scan`, and
  `assert_conforms` requires observation, reward and terminal to agree exactly at every
  step (and the first observation of every episode).

The converters from the reference's state and draws to ours are here too (`*_state`,
`*_draws`); what is played and what must happen is in each game's test file.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from minatar import Environment as MinAtarReference

from popeval.environments import make
from popeval.environments.minatar import seaquest as sq
from popeval.environments.minatar import space_invaders as si
from popeval.environments.minatar.asterix import SpawnDraws
from popeval.environments.minatar.freeway import CarDraws

NOOP, LEFT, UP, RIGHT, DOWN, FIRE = range(6)  # full action indices


# ============================================== transitions: Breakout, Asterix, Freeway
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


def replay_transitions(log: Log, params):
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


def play_episode(log, g, policy, max_steps, extra_after_terminal=2):
    """One episode from `g`'s current state; a couple of steps after termination too."""
    for _ in range(max_steps):
        _, terminal = log.step(g, policy(g))
        if terminal:
            for _ in range(extra_after_terminal):
                log.step(g, policy(g))
            return


# ==================================================== episodes: SpaceInvaders, Seaquest
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


def record_runs(game: str, runs: list[Run], to_state, to_draws, events, seed: int) -> Record:
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


def replay_episodes(env, params, rec: Record):
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
    first_obs, obs, rewards, terminals = replay_episodes(env, params, rec)
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


# ======================================================================= our side alone
BATCH = 4096  # the batch of every `step_many` call (one compilation per game)


@functools.cache
def step_many(env_id):
    """Jitted `step_env`, vmapped over `BATCH` (typed) keys, states, actions and params."""
    env, _ = make(env_id)
    return jax.jit(jax.vmap(env.step_env))


def fill(tree):
    """`BATCH` copies of every leaf (numpy first: no weakly typed leaves, no recompilation)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(np.asarray(x), (BATCH, *np.shape(x))), tree)


def cycle(values, dtype):
    """`values` repeated up to length `BATCH`."""
    return jnp.asarray(np.resize(np.asarray(values), BATCH), dtype)
