"""Reproduces the references that the zoo configs derive themselves (their `# Reference:`
lines that cite a scripted controller, Thompson sampling, value iteration or a classifier).

    python -m experiments.zoo references                   # all of them (about 10 minutes)
    python -m experiments.zoo references reacher pong      # some, by config name
    python -m experiments.zoo references --episodes 8      # a quick, noisier run

Each reference function returns `[(player, returns thunk), ...]`, the reference first.
Every player is played on popeval's own environment: `episodes` episodes (the config's
count by default) whose keys are `jax.random.split(jax.random.key(0), episodes)`. Every
row prints the value computed here next to the config's `# Reference:` value, then the
other players measured the same way (simple rules, random play, planners that simulate
the game). The MinAtar players are in `experiments.zoo.minatar_players`.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.zoo import minatar_players as mp
from experiments.zoo import results as zoo
from popeval.environments import make


def play(env, params, policy: Callable, episodes: int, num_steps: int, carry=(), seed: int = 0) -> np.ndarray:
    """The returns of `episodes` episodes of `policy(carry, state, obs, key) -> (action,
    carry)`, each stepped until done or `num_steps` (no auto-reset; nothing counts after done)."""

    def episode(key):
        key_reset, key = jax.random.split(key)
        obs, state = env.reset_env(key_reset, params)

        def body(loop, _):
            obs, state, carry, key, done, ret = loop
            key, key_policy, key_step = jax.random.split(key, 3)
            action, carry = policy(carry, state, obs, key_policy)
            next_obs, next_state, reward, now_done, _ = env.step_env(key_step, state, action, params)
            ret = ret + jnp.where(done, 0.0, reward)
            keep = lambda old, new: jnp.where(done, old, new)  # noqa: E731
            return (keep(obs, next_obs), jax.tree.map(keep, state, next_state), carry, key,
                    done | now_done, ret), None

        loop = (obs, state, carry, key, jnp.bool_(False), jnp.float32(0.0))
        return jax.lax.scan(body, loop, None, length=num_steps)[0][-1]

    return np.asarray(jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(seed), episodes)))


# ----------------------------------------------------------------------------- bandits
def thompson_bernoulli(carry, state, obs, key):
    """Thompson sampling with a Beta(1, 1) prior per arm; `carry`: (successes, failures)."""
    wins, losses = carry
    pulled = jax.nn.one_hot(state.last_action, wins.shape[0])  # zeros before the first pull
    wins, losses = wins + pulled * state.last_reward, losses + pulled * (1.0 - state.last_reward)
    return jnp.argmax(jax.random.beta(key, wins + 1.0, losses + 1.0)), (wins, losses)


def thompson_gaussian(mean_std: float, reward_std: float):
    """Thompson sampling with the true prior N(0, mean_std^2) and noise N(0, reward_std^2)."""

    def policy(carry, state, obs, key):
        pulls, total = carry
        pulled = jax.nn.one_hot(state.last_action, pulls.shape[0])
        pulls, total = pulls + pulled, total + pulled * state.last_reward
        precision = 1.0 / mean_std**2 + pulls / reward_std**2
        mean = total / reward_std**2 / precision
        return jnp.argmax(mean + jax.random.normal(key, pulls.shape) / jnp.sqrt(precision)), (pulls, total)

    return policy


def bandit(env_id: str, thompson, episodes: int):
    env, params = make(env_id)
    zeros = (jnp.zeros(env.num_arms), jnp.zeros(env.num_arms))
    steps = params.max_steps_in_episode
    first = lambda carry, s, o, k: (jnp.int32(0), carry)  # noqa: E731
    return [("Thompson sampling", lambda: play(env, params, thompson, episodes, steps, zeros)),
            ("always arm 0", lambda: play(env, params, first, episodes, steps))]


def bernoulli_bandit(episodes=20000):
    return bandit("BernoulliBandit-misc", thompson_bernoulli, episodes)


def gaussian_bandit(episodes=20000):
    params = make("GaussianBandit-misc")[1]
    return bandit("GaussianBandit-misc", thompson_gaussian(params.mean_std, params.reward_std), episodes)


# ----------------------------------------------------------------------------- FrozenLake
def frozen_lake(episodes=100000):
    """The optimal stationary policy by value iteration on the map's transition rule."""
    env, params = make("FrozenLake-misc")
    tiles = np.array([list(row) for row in env.desc]).ravel()
    nrow, ncol = len(env.desc), len(env.desc[0])
    goal, stop = tiles == "G", np.isin(tiles, ["G", "H"])
    moves = [(0, -1), (1, 0), (0, 1), (-1, 0)]  # left, down, right, up
    side = (1.0 - params.success_rate) / 2
    to = np.zeros((tiles.size, 4, tiles.size))
    for s in range(tiles.size):
        r, c = divmod(s, ncol)
        for a in range(4):
            for d, p in (((a - 1) % 4, side), (a, params.success_rate), ((a + 1) % 4, side)):
                to[s, a, min(max(r + moves[d][0], 0), nrow - 1) * ncol + min(max(c + moves[d][1], 0), ncol - 1)] += p
    value = np.zeros(tiles.size)
    for _ in range(10000):  # success probability with unlimited steps
        q = to @ (goal + ~stop * value)
        q[stop] = 0.0
        value = q.max(axis=1)
    table = jnp.asarray(q.argmax(axis=1))
    policy = lambda carry, s, obs, key: (table[s.pos], carry)  # noqa: E731
    return [("value iteration's policy", lambda: play(env, params, policy, episodes, params.max_steps_in_episode))]


# ----------------------------------------------------------------------------- MNISTBandit
def mnist_bandit(episodes=2048):
    """Multinomial logistic regression (the ES policy's linear model) fitted by gradient
    descent on all the bandit's images; then played on the env (+1 right, -1 wrong)."""
    env, params = make("MNISTBandit-bsuite")
    images = np.asarray(params.images, np.float64).reshape(len(params.labels), -1)
    x, y = np.hstack([images, np.ones((len(images), 1))]), np.asarray(params.labels)
    weights, onehot = np.zeros((x.shape[1], 10)), np.eye(10)[y]
    for _ in range(3000):
        z = x @ weights
        p = np.exp(z - z.max(axis=1, keepdims=True))
        weights -= 0.5 * x.T @ (p / p.sum(axis=1, keepdims=True) - onehot) / len(y)
    accuracy = np.mean(np.argmax(x @ weights, axis=1) == y)
    w = jnp.asarray(weights, jnp.float32)
    policy = lambda carry, s, obs, key: (jnp.argmax(jnp.append(obs.ravel(), 1.0) @ w), carry)  # noqa: E731
    return [("logistic regression", lambda: play(env, params, policy, episodes, 1)),
            ("the same, expected 2 * accuracy - 1", lambda: np.array([2 * accuracy - 1]))]


# ----------------------------------------------------------------------------- misc control
def pong(episodes=256):
    """Move the paddle's centre towards the ball's row every step."""
    env, params = make("Pong-misc")

    def track(carry, state, obs, key):
        centre = obs[0] + env.paddle_len // 2
        return jnp.where(obs[2] < centre, 1, jnp.where(obs[2] > centre, 2, 0)), carry

    still = lambda carry, s, o, k: (jnp.int32(0), carry)  # noqa: E731
    steps = params.max_steps_in_episode
    return [("ball tracker", lambda: play(env, params, track, episodes, steps)),
            ("never moving", lambda: play(env, params, still, episodes, steps))]


def reacher(episodes=4096, kp=1.0, kd=0.25):
    """PD control towards the inverse-kinematics angles (the nearer elbow solution); the
    gains come from a grid search over kp 0.5..20 x kd 0..0.8 on 1024 other episodes."""
    env, params = make("Reacher-misc")
    length = params.link_length
    wrap = lambda a: (a + jnp.pi) % (2 * jnp.pi) - jnp.pi  # noqa: E731

    def pd(carry, s, obs, key):
        x, y = s.target
        cos = jnp.clip((x * x + y * y - 2 * length**2) / (2 * length**2), -1.0, 1.0)
        sols = []
        for sign in (1.0, -1.0):
            elbow = sign * jnp.arccos(cos)
            shoulder = jnp.arctan2(y, x) - jnp.arctan2(length * jnp.sin(elbow), length + length * jnp.cos(elbow))
            sols.append(jnp.stack([shoulder, elbow]))
        near = jnp.where(jnp.sum(wrap(sols[0] - s.angles) ** 2) < jnp.sum(wrap(sols[1] - s.angles) ** 2),
                         sols[0], sols[1])
        return jnp.clip(kp * wrap(near - s.angles) - kd * s.velocities, -1.0, 1.0), carry

    zero = lambda carry, s, o, k: (jnp.zeros(2), carry)  # noqa: E731
    steps = params.max_steps_in_episode
    return [("PD controller", lambda: play(env, params, pd, episodes, steps)),
            ("zero torque", lambda: play(env, params, zero, episodes, steps))]


def swimmer(episodes=64, omega=1.7, phi=1.1):
    """A travelling wave: joint rates clip(100 sin(omega t + i phi)), a square wave at full
    speed; omega and phi from a grid search (omega 0.5..4 rad/s, phi over [-pi, pi)) on 8
    other episodes."""
    env, params = make("Swimmer-misc")
    joints = jnp.arange(env.action_space(params).shape[0])

    def wave(direction):
        def policy(t, s, obs, key):
            return jnp.clip(100.0 * jnp.sin(omega * params.dt * t + direction * joints * phi), -1.0, 1.0), t + 1

        return policy

    steps = params.max_steps_in_episode
    return [("travelling wave", lambda: play(env, params, wave(1), episodes, steps, jnp.int32(0))),
            ("the reverse wave", lambda: play(env, params, wave(-1), episodes, steps, jnp.int32(0)))]


def pendulum(episodes=4096, grid=(721, 641), torques=81):
    """Finite-horizon value iteration on a (theta, theta_dot) grid, bilinear interpolation
    of the value (theta periodic), `torques` levels in [-2, 2]; the player then takes, at
    each step, the best of 161 torques by one exact step plus the interpolated value. It
    never beats the optimum, so its mean return is a lower bound of the optimal expected
    return (a 301 x 241 grid with 41 torques gives a return 0.6 lower)."""
    env, params = make("Pendulum-v1")
    top, steps = params.max_speed, params.max_steps_in_episode
    n_th, n_td = grid
    wrap = lambda a: (a + jnp.pi) % (2 * jnp.pi) - jnp.pi  # noqa: E731

    def value(v, th, td):
        a = (wrap(th) + jnp.pi) / (2 * jnp.pi) * n_th
        b = (jnp.clip(td, -top, top) + top) / (2 * top) * (n_td - 1)
        i, j = jnp.floor(a).astype(jnp.int32), jnp.clip(jnp.floor(b).astype(jnp.int32), 0, n_td - 2)
        wa, wb, i0, i1 = a - i, b - j, i % n_th, (i + 1) % n_th
        return ((v[i0, j] * (1 - wa) + v[i1, j] * wa) * (1 - wb) + (v[i0, j + 1] * (1 - wa) + v[i1, j + 1] * wa) * wb)

    def q(v, th, td, u):
        cost = wrap(th) ** 2 + 0.1 * td**2 + 0.001 * u**2
        acc = 3 * params.g / (2 * params.l) * jnp.sin(th) + 3.0 / (params.m * params.l**2) * u
        td_next = jnp.clip(td + acc * params.dt, -top, top)
        return -cost + value(v, th + td_next * params.dt, td_next)

    th = jnp.linspace(-jnp.pi, jnp.pi, n_th, endpoint=False)[:, None, None]
    td = jnp.linspace(-top, top, n_td)[None, :, None]
    us = jnp.linspace(-params.max_torque, params.max_torque, torques)[None, None, :]

    def backup(v, _):
        v = jnp.max(q(v, th, td, us), axis=-1)
        return v, v

    to_go = jax.jit(lambda: jax.lax.scan(backup, jnp.zeros((n_th, n_td)), None, length=steps)[1])
    fine = jnp.linspace(-params.max_torque, params.max_torque, 161)

    def player(values):
        def policy(t, s, obs, key):
            v = jax.lax.dynamic_index_in_dim(values, steps - 2 - t, keepdims=False)
            v = jnp.where(t == steps - 1, jnp.zeros_like(v), v)
            return fine[jnp.argmax(q(v, s.theta, s.theta_dot, fine))][None], t + 1

        return policy

    zero = lambda carry, s, o, k: (jnp.zeros(1), carry)  # noqa: E731
    return [("value iteration", lambda: play(env, params, player(to_go()), episodes, steps, jnp.int32(0))),
            ("zero torque", lambda: play(env, params, zero, episodes, steps))]


# ----------------------------------------------------------------------------- MinAtar
def minatar(env_id: str, players: list, episodes: int, steps: int, **kwargs):
    env, params = make(env_id, **kwargs)
    return [(name, lambda build=build: play(env, params, build(env, params), episodes, steps))
            for name, build in players]


def freeway_minatar(episodes=64):
    players = [("lane planner", lambda e, p: mp.stateless(mp.freeway_planner)),
               ("lane planner, any car countdown",
                lambda e, p: mp.stateless(functools.partial(mp.freeway_planner, countdowns="any"))),
               ("lane planner, countdowns half the speed",
                lambda e, p: mp.stateless(functools.partial(mp.freeway_planner, countdowns="half"))),
               ("always up", lambda e, p: mp.stateless(mp.freeway_up)),
               ("random", lambda e, p: mp.random_player(3))]
    return minatar("Freeway-MinAtar", players, episodes, 2501)  # the whole 2500-frame game


def space_invaders_minatar(episodes=64):
    players = [("aiming heuristic", lambda e, p: mp.stateless(mp.invaders_aim)),
               ("sweep and fire", lambda e, p: mp.stateless(mp.invaders_sweep_fire)),
               ("random", lambda e, p: mp.random_player(4)),
               ("24-step lookahead (simulator)", lambda e, p: mp.lookahead_player(e, p, mp.invaders_aim, 4))]
    return minatar("SpaceInvaders-MinAtar", players, episodes, 1000, max_steps_in_episode=1000)


def seaquest_minatar(episodes=64):
    players = [("heuristic", lambda e, p: mp.stateless(lambda s: mp.seaquest_heuristic(p)(s)[0])),
               ("dive and sweep", lambda e, p: mp.stateless(mp.seaquest_dive_sweep)),
               ("random", lambda e, p: mp.random_player(6)),
               ("heuristic + 2-step shield (simulator)", lambda e, p: mp.seaquest_shielded(e, p))]
    return minatar("Seaquest-MinAtar", players, episodes, 1000, max_steps_in_episode=1000)


REFERENCES = {f.__name__: f for f in (
    bernoulli_bandit, gaussian_bandit, frozen_lake, mnist_bandit, pong, reacher, swimmer, pendulum,
    freeway_minatar, space_invaders_minatar, seaquest_minatar)}


def measure(name: str, episodes: int | None = None, others: bool = True) -> list[tuple[str, float, float]]:
    """`[(player, mean return, standard error), ...]`: the reference, then (`others`) the
    other players."""
    rows = REFERENCES[name]() if episodes is None else REFERENCES[name](episodes)
    out = []
    for player, returns in rows if others else rows[:1]:
        r = returns()
        out.append((player, float(r.mean()), float(r.std() / np.sqrt(r.size))))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.zoo references", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"config names (default: all): {', '.join(REFERENCES)}")
    parser.add_argument("--episodes", type=int, help="episodes per player (default: the config's count)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(REFERENCES))
    if unknown:
        parser.error(f"no derived reference for {', '.join(unknown)}; choose from {', '.join(REFERENCES)}")
    if args.episodes is not None and args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    for name in args.names or REFERENCES:
        start = time.perf_counter()
        rows = measure(name, args.episodes)
        config, _ = zoo.reference(name)
        print(f"{name}: reference {config} in the config, {rows[0][1]:.4g} here ({time.perf_counter() - start:.0f} s)")
        for player, mean, sem in rows:
            print(f"    {player:40s} {mean:10.4g} +- {sem:.2g}")


if __name__ == "__main__":
    main()
