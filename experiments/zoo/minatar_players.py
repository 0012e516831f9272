"""Hand-written MinAtar players, the references of the Freeway, SpaceInvaders and Seaquest
zoo configs (`python -m experiments.zoo references freeway_minatar ...` plays them).

Every player is `policy(carry, state, obs, key) -> (action, carry)`, a pure JAX function
of the game's state (an index into the game's minimal action set), for `references.play`.
The references read only the current state (Freeway's planner predicts the cars, whose
motion is deterministic); the two planners at the end simulate the game ahead in
popeval's own environment and are reported for comparison only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def stateless(fn):
    """A `policy(carry, state, obs, key)` from `fn(state)`."""
    return lambda carry, state, obs, key: (jnp.asarray(fn(state), jnp.int32), carry)


def random_player(num_actions: int):
    return lambda carry, state, obs, key: (jax.random.randint(key, (), 0, num_actions), carry)


# ------------------------------------------------------------------ Breakout: 0 noop, 1 left, 2 right
def breakout_track(state):
    """Move the paddle under the column the ball enters next (its direction: 1 and 2 go
    right). Not a zoo reference (Breakout's is NeuroEvoBench's ES result): it shows what a
    policy of the current observation can earn (docs/zoo.md)."""
    step = jnp.where((state.ball_dir == 1) | (state.ball_dir == 2), 1, -1)
    target = jnp.clip(state.ball_x + step, 0, 9)
    return jnp.where(target < state.pos, 1, jnp.where(target > state.pos, 2, 0))


# ------------------------------------------------------------------ Freeway: 0 noop, 1 up, 2 down
def freeway_up(state):
    return 1


def _car_hits(state, horizon: int) -> jax.Array:
    """`(horizon, 8)`: would a chicken on lane row `i + 1` be hit during step `t` from now?
    The cars move deterministically: one cell every `|speed|` steps, in the speed's sign."""

    def advance(carry, _):
        x, timer = carry
        moves = timer == 0
        x_new = jnp.where(moves, (x + jnp.sign(state.car_speed)) % 10, x)
        hit = (x == 4) | (moves & (x_new == 4))
        return (x_new, jnp.where(moves, jnp.abs(state.car_speed), timer - 1)), hit

    return jax.lax.scan(advance, (state.car_x, state.car_timer), None, length=horizon)[1]


_ROW = np.arange(10)[:, None]  # the chicken's row
_TIMER = np.arange(3)[None, :]  # its move timer


def _blind_car_hits(state, horizon: int, countdowns: str) -> jax.Array:
    """`_car_hits` without the cars' countdowns, which the observation does not show: a hit
    under `"any"` countdown (0 to |speed|), or with each countdown taken as `"half"` its speed."""
    if countdowns not in ("any", "half"):
        raise ValueError(f"countdowns: 'known', 'any' or 'half', not {countdowns!r}")
    speed = jnp.abs(state.car_speed)
    if countdowns == "half":
        return _car_hits(state.replace(car_timer=speed // 2), horizon)
    every = [_car_hits(state.replace(car_timer=jnp.minimum(k, speed)), horizon)
             for k in range(6)]  # |speed| is at most 5
    return jnp.any(jnp.stack(every), axis=0)


def freeway_planner(state, horizon: int = 64, sticky: float = 0.1, player_speed: int = 3,
                    countdowns: str = "known"):
    """The action that minimises the expected steps to cross, by a backward recursion over
    (row, move timer, last action) through the predicted car positions, with the game's 10%
    sticky actions in the model; beyond the horizon, an optimistic `3 * row` steps. The cars'
    countdowns are read from the state (`"known"`) or not (`_blind_car_hits`)."""
    hits = _car_hits(state, horizon) if countdowns == "known" else _blind_car_hits(state, horizon, countdowns)
    v_end = jnp.broadcast_to((player_speed * _ROW + _TIMER).astype(jnp.float32)[..., None], (10, 3, 3))

    def q_values(v_next, hit):  # (row, timer, action): 1 + the steps left after it
        qs = []
        for action in range(3):
            free = _TIMER == 0
            row = jnp.clip(_ROW - (free & (action == 1)) + (free & (action == 2)), 0, 9)
            moved = free & (action != 0)
            timer = jnp.where(moved, player_speed - 1, jnp.maximum(_TIMER - 1, 0)) * np.ones_like(_ROW)
            struck = hit[jnp.clip(row - 1, 0, 7)] & (row >= 1) & (row <= 8)
            after = jnp.where(struck, 9, row)
            qs.append(1.0 + jnp.where(row == 0, 0.0, v_next[after, timer, action]))
        return jnp.stack(qs, axis=-1)

    def back(v_next, hit):
        q = q_values(v_next, hit)  # the last action repeats with probability `sticky`
        return sticky * q + (1 - sticky) * jnp.min(q, axis=-1, keepdims=True), None

    v1, _ = jax.lax.scan(back, v_end, hits[1:], reverse=True)
    return jnp.argmin(q_values(v1, hits[0])[state.pos, jnp.minimum(state.move_timer, 2)])


# ------------------------------------------------------ SpaceInvaders: 0 noop, 1 left, 2 right, 3 fire
def invaders_sweep_fire(state):
    """Fire whenever the gun is cold; otherwise sweep left and right."""
    move = jnp.where((state.time // 5) % 18 < 9, 2, 1)
    return jnp.where(state.shot_timer == 0, 3, move)


def _aliens_step(aliens, direction, timer, interval):
    """The aliens' formation one step later (kills ignored), as the game moves it."""
    move = timer == 0
    new_timer = jnp.where(move, jnp.minimum(jnp.sum(aliens), interval), timer) - 1
    left = direction < 0
    reverse = move & jnp.where(left, jnp.any(aliens[:, 0]), jnp.any(aliens[:, 9]))
    sideways = jnp.where(left, jnp.roll(aliens, -1, axis=1), jnp.roll(aliens, 1, axis=1))
    aliens = jnp.where(reverse, jnp.roll(aliens, 1, axis=0), jnp.where(move, sideways, aliens))
    return aliens, jnp.where(reverse, -direction, direction), new_timer


def _hit_columns(state) -> jax.Array:
    """`(10,)`: would a bullet fired now from this column meet an alien (it is on row
    `8 - j` after `j + 1` steps; the aliens' moves are predicted)?"""
    aliens, direction, timer = state.alien_map, state.alien_dir, state.alien_move_timer
    hit = jnp.zeros(10, bool)
    for j in range(9):
        aliens, direction, timer = _aliens_step(aliens, direction, timer, state.enemy_move_interval)
        hit = hit | aliens[8 - j]
    return hit


def invaders_aim(state):
    """Fire when a bullet fired now would meet an alien, else move towards the nearest
    column where it would (else the nearest column with aliens); never step under an
    enemy bullet on rows 7-8 (it lands within two steps)."""
    cols = jnp.arange(10)
    pos, aliens = state.pos, state.alien_map
    hit = _hit_columns(state)
    dist = jnp.abs(cols - pos)
    target = jnp.where(jnp.any(hit), jnp.argmin(jnp.where(hit, dist, 100)),
                       jnp.argmin(jnp.where(jnp.any(aliens, axis=0), dist, 100)))
    move = jnp.where(target < pos, 1, jnp.where(target > pos, 2, 0))
    want = jnp.where((state.shot_timer == 0) & hit[pos], 3, move)
    after = jnp.clip(pos + jnp.array([0, -1, 1, 0]), 0, 9)
    safe = ~(state.e_bullet_map[8] | state.e_bullet_map[7] | aliens[9])[after]
    cost = jnp.abs(after - target) + jnp.where(safe, 0, 1000) + jnp.array([0.1, 0.2, 0.2, 0.3])
    return jnp.where(safe[want], want, jnp.argmin(cost))


def lookahead_player(env, params, base, num_actions: int, horizon: int = 24, death_penalty: float = 100.0):
    """For each action: play it, then `base`, `horizon` steps in the game itself (no sticky
    actions), and take the action with the most reward (minus `death_penalty` if the game
    ended). A planner with the simulator, for comparison only."""
    model = params.replace(sticky_action_prob=0.0, max_steps_in_episode=2**31 - 1)

    def value(state, first, key):
        def body(carry, k):
            s, ret, dead, t = carry
            a = jnp.where(t == 0, first, base(s))
            _, s, r, _, info = env.step_env(k, s, a, model)
            return (s, ret + jnp.where(dead, 0.0, r), dead | info["terminated"], t + 1), None

        (_, ret, dead, _), _ = jax.lax.scan(body, (state, 0.0, jnp.bool_(False), 0), jax.random.split(key, horizon))
        return ret - jnp.where(dead, death_penalty, 0.0)

    def policy(carry, state, obs, key):
        scores = jax.vmap(lambda a: value(state, a, key))(jnp.arange(num_actions))
        scores = scores + 0.01 * (jnp.arange(num_actions) == base(state))  # ties: the base's action
        return jnp.argmax(scores).astype(jnp.int32), carry

    return policy


# ------------------------------------------- Seaquest: 0 noop, 1 left, 2 up, 3 right, 4 down, 5 fire
def seaquest_dive_sweep(state):
    """Dive to row 4, then fire whenever the gun is cold, else move on, turning at the walls."""
    at_wall = jnp.where(state.sub_right, state.sub_x >= 9, state.sub_x <= 0)
    act = jnp.where(state.shot_timer == 0, 5, jnp.where(state.sub_right ^ at_wall, 3, 1))
    return jnp.where(state.sub_y < 4, 4, act)


def seaquest_heuristic(params, surface_slack: int = 12):
    """`fn(state) -> (action, target row, target column)`: surface with 6 divers, or with a
    diver when the oxygen runs low; else fire at an enemy ahead on the sub's row, turn to one
    behind, or move to the nearest diver (else the nearest enemy's row)."""

    def fn(s):
        x, y, divers = s.sub_x, s.sub_y, s.diver_count
        same_row = s.enemy_active & (s.enemy_y == y)
        ahead = jnp.where(s.sub_right, s.enemy_x > x, s.enemy_x < x)
        surface = (divers >= params.max_divers) | ((divers > 0) & (s.oxygen <= 2 * y + surface_slack))
        d_dist = jnp.where(s.diver_active, 2 * jnp.abs(s.diver_y - y) + jnp.abs(s.diver_x - x), 999)
        e_dist = jnp.where(s.enemy_active, 3 * jnp.abs(s.enemy_y - y) + jnp.abs(s.enemy_x - x), 999)
        di, ei = jnp.argmin(d_dist), jnp.argmin(e_dist)
        diver = (d_dist[di] < 999) & (divers < params.max_divers)
        ty = jnp.where(diver, s.diver_y[di], jnp.where(e_dist[ei] < 999, s.enemy_y[ei], 4))
        tx = jnp.clip(jnp.where(diver, s.diver_x[di], jnp.clip(x, 2, 7)), 1, 8)
        ty = jnp.where(surface, 0, jnp.maximum(ty, 1))
        vertical = jnp.where(ty < y, 2, jnp.where(ty > y, 4, 0))
        move = jnp.where(vertical != 0, vertical, jnp.where(tx < x, 1, jnp.where(tx > x, 3, 0)))
        fire = (s.shot_timer == 0) & jnp.any(same_row & ahead) & (y > 0)
        turn = jnp.any(same_row & ~ahead & (s.enemy_x != x)) & (y > 0)
        act = jnp.where(surface, 2, jnp.where(fire, 5, jnp.where(turn, jnp.where(s.sub_right, 1, 3), move)))
        return act, ty, tx

    return fn


def seaquest_shielded(env, params):
    """The heuristic behind a shield that simulates every action and every follow-up in the
    game itself (no sticky actions) and keeps the preferred action that survives two steps,
    also when repeated, away from the edge columns where enemies spawn. Uses the simulator:
    for comparison only."""
    model = params.replace(sticky_action_prob=0.0, max_steps_in_episode=2**31 - 1)
    heuristic, acts = seaquest_heuristic(params), jnp.arange(6)

    def policy(carry, s, obs, key):
        act, ty, tx = heuristic(s)

        def two_steps(a):
            _, s1, _, _, info = env.step_env(key, s, a, model)
            return info["terminated"], jax.vmap(lambda b: env.step_env(key, s1, b, model)[4]["terminated"])(acts)

        dies_now, dies_next = jax.vmap(two_steps)(acts)
        safe = ~dies_now & jnp.any(~dies_next, axis=1)
        strict = safe & ~dies_next[acts, acts]
        nx = jnp.clip(s.sub_x + jnp.array([0, -1, 0, 1, 0, 0]), 0, 9)
        ny = jnp.clip(s.sub_y + jnp.array([0, 0, -1, 0, 1, 0]), 0, 8)
        cost = (jnp.abs(ny - ty) + jnp.abs(nx - tx)).astype(jnp.float32) - 10.0 * (acts == act)
        cost = cost + 3.0 * (((nx == 0) | (nx == 9)) & (ny > 0))
        cost = cost + jnp.where(strict, 0.0, jnp.where(safe, 100.0, 1000.0))
        return jnp.argmin(cost).astype(jnp.int32), carry

    return policy
