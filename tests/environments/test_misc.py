"""The misc family: FrozenLake against gymnasium, the others against their stated dynamics.

FrozenLake-misc is compared with gymnasium's FrozenLake-v1 exactly: its whole transition
table `P` (every state, action and slip outcome) and trajectories that share gymnasium's
own random draws. The other environments have no installable reference; their tests check
the rules written in their module docstrings (layouts, slip and reward distributions,
shortest-path and oracle returns, scripted policies that must succeed, physical laws).
"""

from __future__ import annotations

import copy
import functools
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.environments import make
from popeval.environments.misc import four_rooms, frozen_lake, meta_maze, pong, reacher, swimmer

KEY = jax.random.key(0)


def keys(n, seed=0):
    return jax.random.split(jax.random.key(seed), n)


def bfs_distances(walls: np.ndarray, goal) -> np.ndarray:
    """Shortest number of moves from every cell to `goal` (inf for walls / unreachable)."""
    dist = np.full(walls.shape, np.inf)
    dist[tuple(goal)] = 0
    queue = deque([tuple(goal)])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0)):
            nr, nc = r + dr, c + dc
            if not walls[nr, nc] and dist[nr, nc] == np.inf:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


# ----------------------------------------------------------------------------- FrozenLake
def _gymnasium():
    return pytest.importorskip("gymnasium", reason="gymnasium (a test extra) is the reference")


LAKE_CASES = [
    ("4x4", True, 1 / 3), ("4x4", False, 1 / 3), ("8x8", True, 1 / 3), ("8x8", False, 1 / 3),
    ("4x4", True, 0.75), ("8x8", True, 0.0),
]


@pytest.mark.parametrize("map_name, slippery, success_rate", LAKE_CASES)
def test_frozen_lake_transition_table_equals_gymnasium(map_name, slippery, success_rate):
    # gymnasium samples entry i of P[s][a] when u = np_random.random() lies in
    # [cumsum_{i-1}, cumsum_i); ours must give that entry for every u in the interval (its
    # ends and middle are checked), which makes the two step distributions identical.
    gym = _gymnasium()
    kwargs = dict(map_name=map_name, is_slippery=slippery, success_rate=success_rate)
    ref = gym.make("FrozenLake-v1", **kwargs).unwrapped
    env, params = make("FrozenLake-misc", **kwargs)
    cases, expected = [], []
    for s, by_action in ref.P.items():
        for a, entries in by_action.items():
            assert sum(e[0] for e in entries) == pytest.approx(1.0)
            low = 0.0
            for prob, s_next, r, term in entries:
                high = low + prob
                if prob > 0:
                    for u in (low, 0.5 * (low + high), high - 1e-6):
                        cases.append((s, a, u))
                        expected.append((s_next, r, term))
                low = high
    s, a, u = (np.array(c) for c in zip(*cases))
    state = frozen_lake.EnvState(pos=jnp.asarray(s, jnp.int32), time=jnp.zeros(len(s), jnp.int32))
    slide = jax.jit(jax.vmap(env.slide, in_axes=(0, 0, 0, None)))
    nxt, reward, term = slide(jnp.asarray(u, jnp.float32), state, jnp.asarray(a, jnp.int32), params)
    exp_s, exp_r, exp_t = (np.array(e) for e in zip(*expected))
    np.testing.assert_array_equal(np.asarray(nxt.pos), exp_s)
    np.testing.assert_array_equal(np.asarray(reward), exp_r.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(term), exp_t)
    assert len(s) >= ref.observation_space.n * 4 * (3 if slippery else 1)


def _greedy_policy(table, gamma=0.99, sweeps=300):
    """Value iteration on gymnasium's table `P`: the action that maximises the return."""
    n = len(table)
    move, gain = np.zeros((n, 4, n)), np.zeros((n, 4))  # P(s' | s, a) without terminal s'
    for s, by_action in table.items():
        for a, entries in by_action.items():
            for p, s2, r, t in entries:
                move[s, a, s2] += p * (not t)
                gain[s, a] += p * r
    v = np.zeros(n)
    for _ in range(sweeps):
        v = (gain + gamma * move @ v).max(1)
    return (gain + gamma * move @ v).argmax(1)


class _DrawFed(frozen_lake.FrozenLake):
    """Takes the slip draw `u` in place of the key, so gymnasium's draws can be fed in."""

    def transition(self, key, state, action, params):
        return self.slide(key, state, action, params)


@pytest.mark.parametrize("map_name, slippery", [("4x4", True), ("4x4", False), ("8x8", True)])
def test_frozen_lake_trajectories_with_gymnasium_draws(map_name, slippery):
    # Play gymnasium's env (with its TimeLimit of 100), recording the slip draw it makes at
    # every step, then replay the same actions and draws through our step_env.
    ref = _gymnasium().make("FrozenLake-v1", map_name=map_name, is_slippery=slippery)
    env, params = make("FrozenLake-misc", map_name=map_name, is_slippery=slippery)
    rng = np.random.default_rng(0)
    best = _greedy_policy(ref.unwrapped.P)
    records, outcomes = [], set()
    for episode in range(90):
        obs, _ = ref.reset(seed=episode)
        assert obs == 0
        while True:
            # Policies: the optimal one (reaches G), uniform, or always left (a
            # non-slippery walker then stays at S until the time limit).
            action = [int(best[obs]), int(rng.integers(4)), 0][episode % 3]
            u = copy.deepcopy(ref.unwrapped.np_random).random()  # the draw gymnasium makes next
            obs, reward, terminated, truncated, _ = ref.step(action)
            records.append((u, action, obs, reward, terminated, truncated))
            if terminated or truncated:
                outcomes.add("goal" if reward else "hole" if terminated else "time limit")
                break
    u, action, *expected = (np.array(column) for column in zip(*records))
    fed = _DrawFed(map_name=map_name)

    @jax.jit
    def replay(u, action):
        first_obs, start = env.reset_env(KEY, params)

        def body(state, x):
            obs, nxt, reward, done, info = fed.step_env(x[0], state, x[1], params)
            nxt = jax.tree.map(lambda s, n: jnp.where(done, s, n), start, nxt)
            return nxt, (obs, reward, info["terminated"], info["truncated"])

        return first_obs, jax.lax.scan(body, start, (u, action))[1]

    first_obs, ours = replay(jnp.asarray(u, jnp.float32), jnp.asarray(action, jnp.int32))
    assert int(first_obs) == 0
    for name, got, want in zip(["obs", "reward", "terminated", "truncated"], ours, expected):
        got = np.asarray(got)
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=name)
    assert len(u) > 1000, len(u)
    assert {"hole", "goal" if slippery else "time limit"} <= outcomes


def test_frozen_lake_transition_draws_uniform_slips():
    env, params = make("FrozenLake-misc")
    state = frozen_lake.EnvState(pos=jnp.int32(5 + 1), time=jnp.int32(0))  # tile (1, 2): F
    step = jax.jit(jax.vmap(env.transition, in_axes=(0, None, None, None)))
    nxt, _, _ = step(keys(30_000), state, jnp.int32(1), params)  # down: left / down / right
    counts = np.bincount(np.asarray(nxt.pos), minlength=16)
    np.testing.assert_allclose(counts[[5, 10, 7]] / 30_000, 1 / 3, atol=0.015)
    assert counts.sum() == counts[[5, 10, 7]].sum()


# ----------------------------------------------------------------------------- FourRooms
def test_four_rooms_layout_and_resets():
    walls = four_rooms.WALLS
    assert walls.shape == (13, 13) and (~walls).sum() == 104
    assert walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()
    env, params = make("FourRooms-misc", random_goal=True)
    _, states = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys(4000), params)
    pos, goal = np.asarray(states.pos), np.asarray(states.goal)
    assert not walls[pos[:, 0], pos[:, 1]].any() and not walls[goal[:, 0], goal[:, 1]].any()
    assert not (pos == goal).all(axis=1).any()
    assert len({tuple(g) for g in goal}) > 95  # goals spread over (nearly) all 104 cells
    env, params = make("FourRooms-misc", random_start=False)
    _, state = jax.jit(env.reset_env)(KEY, params)
    assert state.pos.tolist() == [1, 1] and state.goal.tolist() == [11, 11]


def test_four_rooms_shortest_paths_without_slips():
    # With fail_prob = 0, moving to the neighbour closest to the goal (BFS) must end the
    # episode with reward 1 after exactly the BFS distance, from every free cell.
    env, params = make("FourRooms-misc", fail_prob=0.0)
    goal = (3, 9)
    dist = bfs_distances(four_rooms.WALLS, goal)
    dist_j = jnp.asarray(np.where(np.isinf(dist), 1e9, dist))
    starts = np.argwhere(dist > 0)
    starts = starts[np.isfinite(dist[starts[:, 0], starts[:, 1]])]

    def episode(start):
        state = four_rooms.EnvState(pos=start, goal=jnp.array(goal, jnp.int32), time=jnp.int32(0))

        def body(carry, _):
            state, done = carry
            neighbours = state.pos + jnp.array([[0, -1], [1, 0], [0, 1], [-1, 0]])
            action = jnp.argmin(dist_j[neighbours[:, 0], neighbours[:, 1]]).astype(jnp.int32)
            _, nxt, reward, d, info = env.step_env(KEY, state, action, params)
            return (nxt, done | d), (reward * ~done, info["terminated"] & ~done)

        _, (rewards, terminated) = jax.lax.scan(body, (state, jnp.bool_(False)), None, 40)
        return rewards.sum(), jnp.argmax(terminated) + 1

    returns, lengths = jax.jit(jax.vmap(episode))(jnp.asarray(starts, jnp.int32))
    np.testing.assert_array_equal(np.asarray(returns), 1.0)
    np.testing.assert_array_equal(np.asarray(lengths), dist[starts[:, 0], starts[:, 1]])
    # (1, 1) -> hallway (3, 6): 2 + 5 moves, then 3 more to (3, 9).
    assert dist[1, 1] == 10 and len(starts) == 103


def test_four_rooms_slip_distribution_and_walls():
    env, params = make("FourRooms-misc")  # fail_prob 1/3
    state = four_rooms.EnvState(pos=jnp.array([3, 3]), goal=jnp.array([11, 11]), time=jnp.int32(0))
    step = jax.jit(jax.vmap(env.transition, in_axes=(0, None, None, None)))
    nxt, _, _ = step(keys(36_000), state, jnp.int32(2), params)  # right, in an open room
    moves = np.asarray(nxt.pos) - [3, 3]
    freq = {d: np.mean((moves == d).all(1)) for d in [(0, -1), (1, 0), (0, 1), (-1, 0)]}
    assert freq[(0, 1)] == pytest.approx(2 / 3, abs=0.012)
    for d in [(0, -1), (1, 0), (-1, 0)]:
        assert freq[d] == pytest.approx(1 / 9, abs=0.01)
    # Into the wall on the left of (1, 1) and above it: stay.
    _, params0 = make("FourRooms-misc", fail_prob=0.0)
    corner = state.replace(pos=jnp.array([1, 1]))
    nxt, reward, term = step(keys(2), corner, jnp.int32(0), params0)  # left
    nxt3, reward3, term3 = step(keys(2), corner, jnp.int32(3), params0)  # up
    for n, r, t in [(nxt, reward, term), (nxt3, reward3, term3)]:
        assert (np.asarray(n.pos) == 1).all() and not np.any(r) and not np.any(t)


# ----------------------------------------------------------------------------- MetaMaze
def _maze_state(pos, goal):
    return meta_maze.EnvState(pos=jnp.array(pos), goal=jnp.array(goal), last_action=jnp.int32(-1),
                              last_reward=jnp.float32(0), time=jnp.int32(0))


def test_meta_maze_layout_reset_and_observation():
    walls = meta_maze.maze_walls(11)
    assert (~walls).sum() == 81 - 16 and not walls[5, 5] and walls[2, 2] and walls[0].all()
    assert not meta_maze.maze_walls(9)[4, 4]  # the centre is cleared on 9x9 (even centre)
    env, params = make("MetaMaze-misc")
    obs, states = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys(2000), params)
    goal = np.asarray(states.goal)
    assert (np.asarray(states.pos) == 5).all()
    assert not walls[goal[:, 0], goal[:, 1]].any() and not (goal == 5).all(1).any()
    assert len({tuple(g) for g in goal}) == 64
    np.testing.assert_array_equal(np.asarray(obs[0]), np.r_[walls[4:7, 4:7].ravel(), np.zeros(6)])
    # Bump into a wall: -wall_penalty, no move; the observation reports action and reward.
    state = _maze_state(pos=[1, 3], goal=[9, 9])
    obs, nxt, reward, done, _ = jax.jit(env.step_env)(KEY, state, jnp.int32(3), params)
    assert nxt.pos.tolist() == [1, 3] and float(reward) == pytest.approx(-0.1) and not bool(done)
    expected = np.r_[walls[0:3, 2:5].ravel(), [0, 0, 0, 1], -0.1, 1 / 200]
    np.testing.assert_allclose(np.asarray(obs), expected, rtol=1e-6)


def test_meta_maze_reward_teleports_and_repeats():
    env, params = make("MetaMaze-misc")
    walls = meta_maze.maze_walls(11)
    state = _maze_state(pos=[3, 3], goal=[3, 4])
    step = jax.jit(jax.vmap(env.step_env, in_axes=(0, None, None, None)))
    _, nxt, reward, _, _ = step(keys(4000), state, jnp.int32(2), params)
    pos = np.asarray(nxt.pos)
    np.testing.assert_array_equal(np.asarray(reward), 10.0)
    assert (np.asarray(nxt.goal) == [3, 4]).all()  # the reward stays where it was
    assert not walls[pos[:, 0], pos[:, 1]].any() and not (pos == [3, 4]).all(1).any()
    assert len({tuple(p) for p in pos}) == 64  # teleported anywhere else
    # An oracle that walks the shortest path to the (known) reward collects it many times.
    dist_tables = np.stack([bfs_distances(walls, g) for g in np.argwhere(~walls)])
    cells = {tuple(c): i for i, c in enumerate(np.argwhere(~walls))}
    tables = jnp.asarray(np.where(np.isinf(dist_tables), 1e9, dist_tables))
    index = jnp.asarray(np.vectorize(lambda r, c: cells.get((r, c), 0))(*np.indices(walls.shape)))

    def episode(key):
        _, state = env.reset_env(key, params)

        def body(state, key):
            d = tables[index[state.goal[0], state.goal[1]]]
            nb = state.pos + jnp.array([[0, -1], [1, 0], [0, 1], [-1, 0]])
            action = jnp.argmin(d[nb[:, 0], nb[:, 1]]).astype(jnp.int32)
            _, state, reward, _, _ = env.step_env(key, state, action, params)
            return state, reward

        return jax.lax.scan(body, state, jax.random.split(key, 200))[1].sum()

    returns = jax.jit(jax.vmap(episode))(keys(64))
    assert float(returns.min()) >= 10 * 12  # 200 steps, paths of at most 16 moves


# ----------------------------------------------------------------------------- PointRobot
def test_point_robot_scripted_policy_reaches_goal():
    env, params = make("PointRobot-misc")

    def episode(key):
        _, state = env.reset_env(key, params)

        def body(carry, _):
            state, done = carry
            action = jnp.clip(state.goal - state.pos, -0.1, 0.1)
            obs, nxt, reward, d, info = env.step_env(key, state, action, params)
            dist2 = jnp.sum((nxt.pos - state.goal) ** 2)
            return (nxt, done | d), (reward, dist2, info["terminated"] & ~done, done)

        _, out = jax.lax.scan(body, (state, jnp.bool_(False)), None, 8)
        return state.goal, out

    goal, (reward, dist2, terminated, was_done) = jax.jit(jax.vmap(episode))(keys(512))
    np.testing.assert_allclose(np.asarray(reward), -np.asarray(dist2), rtol=1e-6)
    steps_needed = np.ceil(np.abs(np.asarray(goal)).max(1) / 0.1 - 1e-4)
    length = np.asarray(terminated).argmax(1) + 1
    assert np.asarray(terminated).sum(1).tolist() == [1] * 512  # every episode ends once
    assert (length <= steps_needed).all() and (length >= steps_needed - 1).all()
    assert np.abs(np.asarray(goal)).max() <= 0.5


def test_point_robot_bounds_noise_and_observation():
    env, params = make("PointRobot-misc", noise_std=0.05, goal_radius=0.0)

    def episode(key):
        _, state = env.reset_env(key, params)

        def body(state, key):
            # Random commands far beyond max_action, then a push towards the (+1, +1) corner.
            random = jax.random.uniform(key, (2,), minval=-3, maxval=3)
            action = jnp.where(state.time < 50, random, 5.0)
            obs, state, _, _, _ = env.step_env(key, state, action, params)
            return state, (obs, env.observation_space(params).contains(obs))

        return jax.lax.scan(body, state, jax.random.split(key, 100))[1]

    obs, inside = jax.jit(jax.vmap(episode))(keys(64))
    obs = np.asarray(obs)
    assert inside.all() and np.abs(obs[..., :2]).max() <= 1.0 and (obs[:, -1, :2] > 0.8).all()
    assert (obs[..., :2] == 1.0).any()  # the arena's edge is reached (and held)
    assert np.abs(obs[..., 2:4]).max() <= 0.1 + 1e-7  # last actions are the clipped ones
    # Zero action: the position moves by the noise only, N(0, 0.05^2) per axis.
    state = jax.jit(jax.vmap(env.reset_state, in_axes=(0, None)))(keys(20_000), params)
    step = jax.jit(jax.vmap(env.transition, in_axes=(0, 0, None, None)))
    nxt, _, _ = step(keys(20_000, 1), state, jnp.zeros(2), params)
    assert np.asarray(nxt.pos).std(0) == pytest.approx([0.05, 0.05], rel=0.03)


# ----------------------------------------------------------------------------- bandits
def _oracle_returns(env_id, n, **kwargs):
    """Per-episode returns of always pulling the best arm, and the episodes' arms."""
    env, params = make(env_id, **kwargs)

    def episode(key):
        _, state = env.reset_env(key, params)

        def body(state, key):
            action = jnp.argmax(state.arms).astype(jnp.int32)
            _, state, reward, _, _ = env.step_env(key, state, action, params)
            return state, reward

        step_keys = jax.random.split(key, params.max_steps_in_episode)
        return jax.lax.scan(body, state, step_keys)[1].sum(), state.arms

    return jax.jit(jax.vmap(episode))(keys(n))


def test_bernoulli_bandit_oracle_return_and_observation():
    returns, arms = _oracle_returns("BernoulliBandit-misc", 4096)  # 2 arms, 100 pulls
    # E[max of 2 U(0,1)] = 2/3; per-episode std ~ 24, so the standard error is ~0.4.
    assert float(returns.mean()) == pytest.approx(100 * 2 / 3, abs=1.6)
    # Given the arms, the oracle's mean return is 100 * max(p) (standard error ~0.07 here).
    excess = np.asarray(returns) - 100 * np.asarray(arms).max(1)
    assert float(excess.mean()) == pytest.approx(0, abs=0.3)
    env, params = make("BernoulliBandit-misc", num_arms=3, min_prob=0.2, max_prob=0.4)
    obs, states = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys(3000), params)
    arms = np.asarray(states.arms)
    assert arms.shape == (3000, 3) and arms.min() >= 0.2 and arms.max() <= 0.4 and arms.std() > 0.05
    np.testing.assert_array_equal(np.asarray(obs), np.zeros((3000, 5)))
    state = jax.tree.map(lambda x: x[0], states).replace(arms=jnp.array([0.0, 1.0, 0.0]))
    step = jax.jit(env.step_env)
    obs, state, reward, _, _ = step(KEY, state, jnp.int32(1), params)
    np.testing.assert_allclose(np.asarray(obs), [0, 1, 0, 1, 0.01])
    obs, state, reward, _, _ = step(KEY, state, jnp.int32(2), params)
    np.testing.assert_allclose(np.asarray(obs), [0, 0, 1, 0, 0.02])


def test_gaussian_bandit_oracle_return_and_rewards():
    returns, arms = _oracle_returns("GaussianBandit-misc", 4096)
    best = np.asarray(arms).max(1)
    # Given the arms the oracle earns 100 * max(mu) + N(0, 100); E[max of 2 N(0,1)] = 1/sqrt(pi).
    assert np.abs(np.asarray(returns) - 100 * best).mean() < 12
    assert float(np.mean(np.asarray(returns) - 100 * best)) == pytest.approx(0, abs=0.7)
    assert best.mean() == pytest.approx(1 / np.sqrt(np.pi), abs=0.05)  # ~4 standard errors
    env, params = make("GaussianBandit-misc", num_arms=4, reward_std=0.0, mean_std=2.0)
    state = jax.jit(jax.vmap(env.reset_state, in_axes=(0, None)))(keys(5000), params)
    assert np.asarray(state.arms).std() == pytest.approx(2.0, rel=0.03)
    step = jax.jit(jax.vmap(env.transition, in_axes=(0, 0, None, None)))
    _, reward, _ = step(keys(5000, 1), state, jnp.int32(3), params)
    np.testing.assert_array_equal(np.asarray(reward), np.asarray(state.arms[:, 3]))


# ----------------------------------------------------------------------------- Pong
def _pong_state(ball, velocity, agent_top=3, opponent_top=3, scores=(0, 0)):
    return pong.EnvState(jnp.int32(agent_top), jnp.int32(opponent_top), jnp.array(ball, jnp.int32),
                         jnp.array(velocity, jnp.int32), jnp.int32(scores[0]), jnp.int32(scores[1]),
                         jnp.int32(0))


def test_pong_rules_state_by_state():
    env, params = make("Pong-misc", opponent_skill=0.0)  # 10 x 16, paddles of 3
    step = jax.jit(env.step_env)

    def go(state, action=0):
        _, nxt, reward, done, _ = step(KEY, state, jnp.int32(action), params)
        return nxt, float(reward), bool(done)

    nxt, r, _ = go(_pong_state([0, 8], [-1, 1]))  # top edge: bounce
    assert nxt.ball.tolist() == [1, 9] and nxt.velocity.tolist() == [1, 1] and r == 0
    nxt, r, _ = go(_pong_state([9, 8], [1, -1]))  # bottom edge: bounce
    assert nxt.ball.tolist() == [8, 7] and nxt.velocity.tolist() == [-1, -1]
    for y, vy_after in [(3, -1), (4, 1), (5, 1)]:  # ball arrives at rows 3 / 4 / 5 of paddle 3..5
        nxt, r, _ = go(_pong_state([y - 1, 1], [1, -1]))
        assert nxt.ball.tolist() == [y, 2] and nxt.velocity.tolist() == [vy_after, 1] and r == 0
    nxt, r, _ = go(_pong_state([5, 1], [1, -1]), action=2)  # paddle moves down to 4..6: hit
    assert nxt.agent_top == 4 and nxt.velocity.tolist() == [1, 1] and r == 0
    nxt, r, _ = go(_pong_state([5, 1], [1, -1]))  # paddle stays at 3..5, ball to row 6: miss
    assert r == -1 and nxt.opponent_score == 1 and nxt.ball[1] == 8 and nxt.agent_score == 0
    # The opponent misses the agent's 21st point: the game is over.
    nxt, r, done = go(_pong_state([0, 14], [-1, 1], opponent_top=5, scores=(20, 3)))
    assert r == 1 and nxt.agent_score == 21 and done
    nxt, r, _ = go(_pong_state([2, 14], [1, 1], opponent_top=2))  # opponent returns it
    assert nxt.ball.tolist() == [3, 13] and nxt.velocity.tolist() == [1, -1] and r == 0
    nxt, _, _ = go(_pong_state([0, 5], [1, 1], agent_top=0), action=1)  # paddle clipped at 0
    assert nxt.agent_top == 0


def test_pong_opponent_and_returns():
    # Two match-ups in one batch (vmap over a policy flag and over params): a tracking agent
    # against a motionless opponent (skill 0), a motionless agent against a tracking one.
    env, params = make("Pong-misc", points_to_win=3, max_steps_in_episode=1500)
    n = 48
    tracks = jnp.repeat(jnp.array([True, False]), n)
    batch = params.replace(opponent_skill=jnp.repeat(jnp.array([0.0, 1.0]), n))

    def episode(key, tracks, params):
        _, state = env.reset_env(key, params)

        def body(carry, key):
            state, done = carry
            toward = jnp.sign(state.ball[0] - state.agent_top - 1)  # centre row is top + 1
            action = jnp.where(tracks, jnp.array([1, 0, 2])[toward + 1], 0).astype(jnp.int32)
            obs, nxt, reward, d, _ = env.step_env(key, state, action, params)
            moved = nxt.opponent_top != state.opponent_top
            inside = env.observation_space(params).contains(obs)
            return (nxt, done | d), (reward * ~done, moved, inside)

        _, out = jax.lax.scan(body, (state, jnp.bool_(False)), jax.random.split(key, 1500))
        return jax.tree.map(lambda x: x.mean(0) if x.dtype != jnp.float32 else x.sum(0), out)

    param_axes = pong.EnvParams(opponent_skill=0, points_to_win=None, max_steps_in_episode=None)
    in_axes = (0, 0, param_axes)
    ret, moved, inside = jax.jit(jax.vmap(episode, in_axes))(keys(2 * n), tracks, batch)
    ret, moved = np.asarray(ret).reshape(2, n), np.asarray(moved).reshape(2, n)
    assert np.asarray(inside).all()
    assert moved[0].max() == 0 and moved[1].mean() > 0.2  # skill 0 never moves; skill 1 does
    assert ret[0].mean() > 1  # the tracker beats a motionless opponent
    assert ret[1].mean() < -1  # a motionless agent loses to a tracking opponent


# ----------------------------------------------------------------------------- Reacher
def test_reacher_step_follows_the_stated_equations():
    env, params = make("Reacher-misc", num_links=3)
    p = params
    rng = np.random.default_rng(0)
    q, w = rng.uniform(-4, 4, (256, 3)), rng.uniform(-25, 25, (256, 3))
    target, a = rng.uniform(-0.3, 0.3, (256, 2)), rng.uniform(-1.5, 1.5, (256, 3))
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    state = reacher.EnvState(f32(q), f32(w), f32(target), jnp.zeros(256, jnp.int32))
    step = jax.jit(jax.vmap(env.step_env, in_axes=(None, 0, 0, None)))
    obs, nxt, reward, _, _ = step(KEY, state, jnp.asarray(a, jnp.float32), params)
    a_c = np.clip(a, -1, 1)
    w2 = w + p.dt * (p.max_torque * a_c - p.damping * w) / p.inertia
    w2 = np.clip(w2, -p.max_speed, p.max_speed)
    q2 = q + p.dt * w2
    phi = np.cumsum(q2, axis=1)
    tip = p.link_length * np.stack([np.cos(phi).sum(1), np.sin(phi).sum(1)], 1)
    r = -np.linalg.norm(tip - target, axis=1) - p.ctrl_cost * (a_c**2).sum(1)
    np.testing.assert_allclose(np.asarray(nxt.velocities), w2, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(nxt.angles), q2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(reward), r, rtol=1e-5, atol=1e-5)
    expected_obs = np.concatenate([np.cos(q2), np.sin(q2), w2, target, tip - target], 1)
    np.testing.assert_allclose(np.asarray(obs), expected_obs, rtol=1e-5, atol=1e-4)


def test_reacher_scripted_controller_reaches_every_target():
    env, params = make("Reacher-misc", max_steps_in_episode=100)
    length = params.link_length

    def inverse_kinematics(t):  # two equal links
        c2 = jnp.clip(jnp.sum(t**2) / (2 * length**2) - 1, -1, 1)
        q2 = jnp.arccos(c2)
        return jnp.stack([jnp.arctan2(t[1], t[0]) - jnp.arctan2(jnp.sin(q2), 1 + jnp.cos(q2)), q2])

    def episode(key):
        _, state = env.reset_env(key, params)

        def body(state, _):
            err = (inverse_kinematics(state.target) - state.angles + jnp.pi) % (2 * jnp.pi) - jnp.pi
            _, state, reward, _, _ = env.step_env(key, state, 10 * err - state.velocities, params)
            return state, reward

        state, rewards = jax.lax.scan(body, state, None, 100)
        tip = reacher.fingertip(state.angles, length)
        return jnp.linalg.norm(tip - state.target), jnp.linalg.norm(state.target), rewards[-1]

    dist, target_norm, last_reward = jax.jit(jax.vmap(episode))(keys(256))
    assert float(target_norm.max()) <= 0.2 and float(target_norm.max()) > 0.18
    assert float(dist.max()) < 1e-3 and float(last_reward.min()) > -2e-3


# ----------------------------------------------------------------------------- Swimmer
def _swim(num_links, actions, joints0, **kwargs):
    env, params = make("Swimmer-misc", num_links=num_links, **kwargs)
    m = num_links - 1
    state = swimmer.EnvState(jnp.zeros(3), jnp.full(m, joints0), jnp.zeros(m + 3), jnp.int32(0))

    def body(state, action):
        obs, state, reward, _, _ = env.step_env(KEY, state, action, params)
        return state, (reward, env.observation_space(params).contains(obs))

    state, (rewards, inside) = jax.lax.scan(body, state, actions)
    return state, rewards, inside


def _strokes(*phases, steps=25, cycles=4):
    return jnp.tile(jnp.concatenate([jnp.broadcast_to(jnp.asarray(p, jnp.float32), (steps, len(p)))
                                     for p in phases]), (cycles, 1))


@jax.jit
def _swimmer_experiments():
    purcell = _strokes([1, 0], [0, 1], [-1, 0], [0, -1])  # a square in joint space
    reversed_ = _strokes([0, 1], [1, 0], [0, -1], [-1, 0])
    forward, rewards, inside = _swim(3, purcell, -1.0)
    backward, _, _ = _swim(3, reversed_, -1.0)
    isotropic, _, _ = _swim(3, purcell, -1.0, drag_normal=1.0)
    scallop, _, _ = _swim(2, _strokes([1], [-1]), -1.0)  # one joint flapping: reciprocal
    return forward, rewards, inside, backward, isotropic, scallop


def test_swimmer_physics():
    forward, rewards, inside, backward, isotropic, scallop = _swimmer_experiments()
    # Purcell's three-link swimmer advances with a non-reciprocal stroke and returns to its
    # shape; running the stroke backwards swims the other way.
    assert inside.all()
    np.testing.assert_allclose(np.asarray(forward.joints), [-1, -1], atol=1e-5)
    shift = np.asarray(forward.pose[:2])
    assert np.linalg.norm(shift) > 0.5 and abs(float(forward.pose[2])) < 1e-4  # 4 strokes
    size = np.linalg.norm(shift)
    np.testing.assert_allclose(np.asarray(backward.pose[:2]), -shift, atol=0.02 * size)
    # Reward = the centroid's x velocity (minus a tiny control cost), so it sums to the shift.
    ctrl = 1e-4 * 400  # one joint at full speed in each of the 400 steps
    np.testing.assert_allclose(float(rewards.sum()) * 0.04, shift[0] - ctrl * 0.04, atol=1e-4)
    # Isotropic drag cannot propel (the centroid stays put), nor can a reciprocal stroke
    # (the scallop theorem).
    assert np.abs(np.asarray(isotropic.pose[:2])).max() < 1e-5
    assert np.abs(np.asarray(scallop.pose)).max() < 1e-4


def test_swimmer_joint_limits_and_force_balance():
    env, params = make("Swimmer-misc", num_links=4)
    config = jnp.array([0.3, -0.2, 0.7, 0.5, -1.2, 0.4])
    rates = jnp.array([1.0, -0.5, 2.0])

    @jax.jit
    def kinematics(config, rates):
        dq = jnp.concatenate([swimmer.body_velocity(config, rates, params), rates])
        velocities = jax.jvp(lambda c: swimmer.link_centres(c, 1.0), (config,), (dq,))[1]
        dphi = jax.jvp(swimmer.link_angles, (config,), (dq,))[1]
        return dq, swimmer.link_angles(config), swimmer.link_centres(config, 1.0), velocities, dphi

    dq, phi, centres, velocities, dphi = (np.asarray(x, float) for x in kinematics(config, rates))
    t = np.stack([np.cos(phi), np.sin(phi)], 1)
    n = np.stack([-t[:, 1], t[:, 0]], 1)
    along, across = (velocities * t).sum(1)[:, None], (velocities * n).sum(1)[:, None]
    force = -(1.0 * along * t + 2.0 * across * n)  # c_t = 1, c_n = 2, l = 1
    arm = centres - [0.3, -0.2]
    torque = arm[:, 0] * force[:, 1] - arm[:, 1] * force[:, 0] - 2.0 / 12 * dphi
    np.testing.assert_allclose(force.sum(0), 0, atol=1e-5)
    assert abs(torque.sum()) < 1e-5 and np.linalg.norm(dq[:3]) > 0.1
    np.testing.assert_allclose(centres.mean(0), [0.3, -0.2], atol=1e-6)
    # Joints stay within +-max_angle however hard they are driven.
    state, _, inside = jax.jit(lambda a: _swim(4, a, 0.0))(jnp.ones((60, 3)))
    assert inside.all()
    np.testing.assert_allclose(np.asarray(state.joints), params.max_angle, rtol=1e-6)


# ----------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "env_id, kwargs, word",
    [
        ("FrozenLake-misc", dict(success_rate=1.5), "success_rate"),
        ("FrozenLake-misc", dict(map_name="5x5"), "map_name"),
        ("FrozenLake-misc", dict(desc=["SFX"]), "letters"),
        ("FourRooms-misc", dict(fail_prob=-0.1), "fail_prob"),
        ("FourRooms-misc", dict(goal=(6, 1)), "wall"),
        ("MetaMaze-misc", dict(size=8), "odd"),
        ("MetaMaze-misc", dict(size=3), "size"),
        ("MetaMaze-misc", dict(wall_penalty=-1.0), "wall_penalty"),
        ("PointRobot-misc", dict(noise_std=-0.1), "noise_std"),
        ("PointRobot-misc", dict(max_action=0.0), "max_action"),
        ("PointRobot-misc", dict(goal_range=2.0), "arena"),
        ("BernoulliBandit-misc", dict(max_prob=1.2), "max_prob"),
        ("BernoulliBandit-misc", dict(min_prob=0.8, max_prob=0.2), "min_prob"),
        ("BernoulliBandit-misc", dict(num_arms=0), "num_arms"),
        ("GaussianBandit-misc", dict(reward_std=-1.0), "reward_std"),
        ("Pong-misc", dict(opponent_skill=2.0), "opponent_skill"),
        ("Pong-misc", dict(height=0), "height"),
        ("Pong-misc", dict(paddle_len=20), "paddle_len"),
        ("Reacher-misc", dict(num_links=0), "num_links"),
        ("Reacher-misc", dict(inertia=0.0), "inertia"),
        ("Swimmer-misc", dict(num_links=1), "num_links"),
        ("Swimmer-misc", dict(drag_normal=-2.0), "drag_normal"),
        ("Swimmer-misc", dict(max_steps_in_episode=0), "max_steps_in_episode"),
    ],
)
def test_out_of_range_settings_raise_at_make(env_id, kwargs, word):
    with pytest.raises(ValueError, match=word):
        make(env_id, **kwargs)


def test_params_checks_skip_traced_values_and_accept_batches():
    env, params = make("PointRobot-misc", noise_std=0.1)  # a valid override goes through
    assert params.noise_std == 0.1
    batch = jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * 3), params)
    batch = batch.replace(max_action=jnp.array([0.05, 0.1, 0.2]))
    with pytest.raises(ValueError, match="max_action"):
        batch.replace(max_action=jnp.array([0.05, 0.0, 0.2]))
    # Inside jit the values are traced and not checked; in_axes specs build fine.
    scale = jax.jit(lambda p: p.replace(max_action=p.max_action * -1.0).max_action)(params)
    assert float(scale) == pytest.approx(-0.1)
    obs, _ = jax.vmap(env.reset_env, in_axes=(0, jax.tree.map(lambda _: 0, params)))(keys(3), batch)
    assert obs.shape == (3, 5)
