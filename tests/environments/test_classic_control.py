"""Conformance of the classic-control environments with gymnasium 1.x.

For every environment, thousands of transitions from random states covering the state
space, plus deliberate edge states (walls, goals, termination thresholds, angle wrapping,
clipped velocities and actions, the last step before the time limit), are stepped by our
`step_env` (float32, one jitted vmapped call) and by `gymnasium.make(id)` (float64, the
same float32 state injected into `env.unwrapped.state`, the step counter of its
`TimeLimit` wrapper set to our `time`). Next state, observation, reward, terminated and
truncated must agree. The reset distributions are compared statistically.

Termination is compared exactly, so edge states sit a few hundred float32 ulps (>= 1e-5)
away from each threshold: exactly at a threshold the float32 and float64 sums round to
different sides, which no float32 implementation can match.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.environments import make

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Relative and absolute tolerance of next state, observation and reward per precision of
# our step. float64 shows the equations are gymnasium's (gymnasium keeps
# MountainCarContinuous's state and every observation in float32, hence not 1e-12).
TOL = {"float32": 1e-5, "float64": 1e-6}
NUM_RANDOM = 4000  # random transitions per environment (edge states come on top)
NUM_RESETS = 20_000
PI = math.pi


@dataclasses.dataclass(frozen=True)
class Case:
    fields: tuple[str, ...]  # our EnvState fields, in the order of gymnasium's `state`
    state_low: tuple[float, ...]  # box of the random states
    state_high: tuple[float, ...]
    actions: int | tuple[float, float]  # number of discrete actions, or (low, high) sampled
    reset_low: tuple[float, ...]  # gymnasium's reset distribution: uniform on this box
    reset_high: tuple[float, ...]
    max_steps: int
    edges: Callable[[], tuple[list, list]]  # -> (states, actions), float64
    covers: Callable[..., dict]  # (state, action, ref_next, ref_terminated) -> {name: bool}
    angles: tuple[int, ...] = ()  # state dims compared modulo 2 pi
    tol32: float = TOL["float32"]


def _grid(states, actions):
    """All combinations of the given states and actions."""
    return [s for s in states for _ in actions], [a for _ in states for a in actions]


# ------------------------------------------------------------------------------ CartPole
X_LIM, TH_LIM, TAU = 2.4, 12 * 2 * PI / 360, 0.02


def cartpole_edges():
    states = []
    for sign in (-1.0, 1.0):
        for d in (-1e-3, -1e-5, 1e-5, 1e-3):  # next value just inside (d < 0) / outside
            x, th = sign * (X_LIM + d), sign * (TH_LIM + d)
            states += [
                [x, 0.0, 0.0, 0.0],  # at rest on the threshold
                [x - TAU * sign * 1.5, sign * 1.5, 0.05, -0.3],  # arriving at it
                [0.1, 0.2, th, 0.0],
                [-0.3, -0.5, th - TAU * sign * 0.8, sign * 0.8],
            ]
    return _grid(states, [0, 1])


def cartpole_covers(s, a, nxt, term):
    near = lambda v, lim: (np.abs(v) > lim - 2e-5) & (np.abs(v) < lim + 2e-5)  # noqa: E731
    return {
        "terminated": term.any(),
        "not terminated": (~term).any(),
        **{
            f"{name} within 1e-5 of {side}{lim:.4f}, {'' if t else 'not '}terminated": (
                near(nxt[:, i], lim) & (np.sign(nxt[:, i]) == sign) & (term == t)
            ).any()
            for name, i, lim in (("x", 0, X_LIM), ("theta", 2, TH_LIM))
            for sign, side in ((-1, "-"), (1, "+"))
            for t in (False, True)
        },
    }


# ------------------------------------------------------------------------------ Pendulum
def pendulum_edges():
    thetas = [-20.0, -3 * PI - 0.5, -PI - 1e-3, -PI + 1e-3, 0.0, PI - 1e-3, PI + 1e-3, 2 * PI, 3 * PI + 0.5, 20.0]
    states = [[th, thdot] for th in thetas for thdot in (-8.0, -7.9, 0.0, 7.9, 8.0)]
    return _grid(states, [-5.0, -2.5, -2.0, 0.0, 2.0, 2.5, 5.0])


def pendulum_covers(s, a, nxt, term):
    return {
        "torque beyond +-2": (np.abs(a) > 2).any(),
        "angle beyond 2 pi": (np.abs(s[:, 0]) > 2 * PI).any(),
        "velocity clipped": (np.abs(nxt[:, 1]) == 8.0).any(),
        "never terminates": not term.any(),
    }


# ------------------------------------------------------------------------------- Acrobot
V1, V2 = 4 * PI, 9 * PI


def acrobot_edges():
    near_pi = (-PI + 1e-3, PI - 1e-3)
    states = [
        [a1, a2, v1, v2]
        for a1 in (*near_pi, 0.0)
        for a2 in (*near_pi, 0.3)
        for v1 in (-V1, -0.999 * V1, -3.0, 3.0, 0.999 * V1, V1)
        for v2 in (-V2, -0.999 * V2, 0.0, 0.999 * V2, V2)
    ]
    return _grid(states, [0, 1, 2])


def acrobot_covers(s, a, nxt, term):
    wrapped = lambda i: ((np.abs(s[:, i]) > 3) & (np.sign(s[:, i]) != np.sign(nxt[:, i]))).any()  # noqa: E731
    return {
        "terminated": term.any(),
        "not terminated": (~term).any(),
        "angle 1 wrapped": wrapped(0),
        "angle 2 wrapped": wrapped(1),
        "velocity 1 clipped both ways": set(np.sign(nxt[np.abs(nxt[:, 2]) == V1, 2])) == {-1, 1},
        "velocity 2 clipped both ways": set(np.sign(nxt[np.abs(nxt[:, 3]) == V2, 3])) == {-1, 1},
    }


# -------------------------------------------------------------------- MountainCar(s)
def mountain_car_edges(goal: float, actions: list, accel: Callable[[float], float]):
    states = _grid(
        [[p, v] for p in (-1.2, -1.19) for v in (-0.07, -0.03, -0.001, 0.0, 0.02)]  # left wall
        + [[p, v] for p in (0.6, 0.59) for v in (0.07, 0.03, -0.01)]  # right wall
        + [[goal, v] for v in (-0.001, 0.0, 0.001)],  # on the goal
        actions,
    )
    # States whose next position lands just below / just above the goal, moving right
    # (p below the goal) or left (p above it): solve the velocity update for v.
    for p in (goal - 0.03, goal + 0.03):
        for d in (-1e-3, -1e-5, 1e-5, 1e-3):
            for a in actions:
                v = goal + d - p - accel(a) + 0.0025 * math.cos(3 * p)
                states[0].append([p, v])
                states[1].append(a)
    return states


def mountain_car_covers(goal: float):
    def covers(s, a, nxt, term):
        at_goal = np.abs(nxt[:, 0] - goal) < 2e-5
        wall = nxt[:, 0].astype(np.float32)  # gymnasium keeps MountainCarContinuous in float32
        return {
            "velocity zeroed at left wall": ((wall == np.float32(-1.2)) & (nxt[:, 1] == 0) & (s[:, 1] < 0)).any(),
            "right wall keeps velocity": ((wall == np.float32(0.6)) & (nxt[:, 1] > 0)).any(),
            "just below goal": (at_goal & (nxt[:, 0] < goal) & (nxt[:, 1] > 0)).any(),
            "just at goal, terminated": (at_goal & term).any(),
            "past goal moving left, not terminated": ((nxt[:, 0] >= goal) & (nxt[:, 1] < 0) & ~term).any(),
            "not terminated": (~term).any(),
        }

    return covers


CASES = {
    "CartPole-v1": Case(
        fields=("x", "x_dot", "theta", "theta_dot"),
        state_low=(-2.6, -4.0, -0.25, -4.0),
        state_high=(2.6, 4.0, 0.25, 4.0),
        actions=2,
        reset_low=(-0.05,) * 4,
        reset_high=(0.05,) * 4,
        max_steps=500,
        edges=cartpole_edges,
        covers=cartpole_covers,
    ),
    "Pendulum-v1": Case(
        fields=("theta", "theta_dot"),
        state_low=(-4 * PI, -8.0),
        state_high=(4 * PI, 8.0),
        actions=(-3.0, 3.0),
        reset_low=(-PI, -1.0),
        reset_high=(PI, 1.0),
        max_steps=200,
        edges=pendulum_edges,
        covers=pendulum_covers,
    ),
    "Acrobot-v1": Case(
        fields=("joint_angle1", "joint_angle2", "velocity_1", "velocity_2"),
        state_low=(-PI, -PI, -V1, -V2),
        state_high=(PI, PI, V1, V2),
        actions=3,
        reset_low=(-0.1,) * 4,
        reset_high=(0.1,) * 4,
        max_steps=500,
        edges=acrobot_edges,
        covers=acrobot_covers,
        angles=(0, 1),
        # One RK4 step of dt = 0.2 at velocities up to 9 pi amplifies float32 rounding to
        # ~5e-4 relative on 1% of random states; in float64 the error is ~1e-10.
        tol32=1e-3,
    ),
    "MountainCar-v0": Case(
        fields=("position", "velocity"),
        state_low=(-1.2, -0.07),
        state_high=(0.6, 0.07),
        actions=3,
        reset_low=(-0.6, 0.0),
        reset_high=(-0.4, 0.0),
        max_steps=200,
        edges=lambda: mountain_car_edges(0.5, [0, 1, 2], lambda a: (a - 1) * 0.001),
        covers=mountain_car_covers(0.5),
    ),
    "MountainCarContinuous-v0": Case(
        fields=("position", "velocity"),
        state_low=(-1.2, -0.07),
        state_high=(0.6, 0.07),
        actions=(-2.0, 2.0),
        reset_low=(-0.6, 0.0),
        reset_high=(-0.4, 0.0),
        max_steps=999,
        edges=lambda: mountain_car_edges(
            0.45, [-3.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 3.0], lambda a: min(max(a, -1.0), 1.0) * 0.0015
        ),
        covers=mountain_car_covers(0.45),
    ),
}
ENV_IDS = list(CASES)


def transitions(case: Case, seed: int = 0):
    """Random plus edge `(states, actions, times)`; states/actions are float32-representable."""
    rng = np.random.default_rng(seed)
    states = rng.uniform(case.state_low, case.state_high, (NUM_RANDOM, len(case.fields)))
    if isinstance(case.actions, int):
        actions = rng.integers(0, case.actions, NUM_RANDOM)
    else:
        actions = rng.uniform(*case.actions, NUM_RANDOM)
    edge_states, edge_actions = case.edges()
    states = np.concatenate([states, np.asarray(edge_states, np.float64)]).astype(np.float32)
    actions = np.concatenate([actions, np.asarray(edge_actions)])
    actions = actions.astype(np.int32 if isinstance(case.actions, int) else np.float32)
    # Every fourth transition is the last step before the time limit, every fourth the one
    # before that; the rest are at random times.
    times = rng.integers(0, case.max_steps - 2, len(states))
    times[::4], times[1::4] = case.max_steps - 1, case.max_steps - 2
    return states, actions, times.astype(np.int32)


@functools.cache
def gymnasium_steps(env_id: str, seed: int = 0):
    """Steps gymnasium from each injected state of `transitions(case, seed)`.

    Returns:
        `(states, actions, times)` and gymnasium's `(next_state, obs, reward, terminated,
        truncated)`.
    """
    states, actions, times = transitions(CASES[env_id], seed)
    env = gymnasium.make(env_id)
    env.reset(seed=0)
    inner = env.unwrapped
    out = []
    for s, a, t in zip(states.astype(np.float64), actions, times):
        inner.state = s.copy()
        if env_id == "CartPole-v1":  # it rewards 0 for steps after a termination it has seen
            inner.steps_beyond_terminated = None
        env._elapsed_steps = int(t)  # TimeLimit's counter: truncated once it reaches the limit
        action = int(a) if isinstance(CASES[env_id].actions, int) else np.array([a], np.float32)
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((np.asarray(inner.state, np.float64), obs, reward, terminated, truncated))
    return (states, actions, times), [np.array(x) for x in zip(*out)]


def x64_mode(precision: str):
    """A context in which JAX computes in `precision` (float64 needs x64 enabled)."""
    if precision == "float32":
        return contextlib.nullcontext()
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # jax < 0.7

    return enable_x64()


@functools.cache
def our_env(env_id: str):
    """`(env, params, jitted step_env vmapped over states and actions)`."""
    env, params = make(env_id)
    return env, params, jax.jit(jax.vmap(env.step_env, in_axes=(None, 0, 0, None)))


def our_states(env_id: str, states, times):
    """A batch of our `EnvState`s holding `states` (columns in gymnasium's order)."""
    env, params, _ = our_env(env_id)
    template = env.reset_env(jax.random.PRNGKey(0), params)[1]
    batch = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(states),) + x.shape), template)
    columns = {f: jnp.asarray(states[:, i]) for i, f in enumerate(CASES[env_id].fields)}
    return batch.replace(**columns, time=jnp.asarray(times))


def state_columns(env_id: str, state) -> np.ndarray:
    return np.stack([np.asarray(getattr(state, f), np.float64) for f in CASES[env_id].fields], -1)


def max_error(ours, ref, tol: float) -> float:
    """Largest `|ours - ref| / (tol + tol |ref|)`: <= 1 passes `allclose(rtol=atol=tol)`."""
    return float(np.max(np.abs(ours - ref) / (tol + tol * np.abs(ref))))


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_matches_gymnasium(env_id, precision):
    case = CASES[env_id]
    tol = case.tol32 if precision == "float32" else TOL[precision]
    (states, actions, times), ref = gymnasium_steps(env_id)
    ref_next, ref_obs, ref_reward, ref_term, ref_trunc = ref

    env, params, step = our_env(env_id)
    batch_actions = actions if isinstance(case.actions, int) else actions[:, None]
    with x64_mode(precision):
        obs, next_state, reward, done, info = jax.device_get(
            step(
                jax.random.PRNGKey(0),
                our_states(env_id, states.astype(precision), times),
                batch_actions.astype(batch_actions.dtype if isinstance(case.actions, int) else precision),
                params,
            )
        )
    nxt = state_columns(env_id, next_state)
    assert nxt.dtype == np.float64 and next_state.time.dtype == np.int32
    assert getattr(next_state, case.fields[0]).dtype == precision

    def show(mask):
        i = np.flatnonzero(mask)[:5]
        return f"states {states[i].tolist()}, actions {actions[i].tolist()}, times {times[i].tolist()}"

    np.testing.assert_array_equal(next_state.time, times + 1)
    bad = info["terminated"] != ref_term
    assert not bad.any(), f"{env_id}: terminated differs for {bad.sum()} transitions: {show(bad)}"
    bad = info["truncated"] != ref_trunc
    assert not bad.any(), f"{env_id}: truncated differs for {bad.sum()} transitions: {show(bad)}"
    np.testing.assert_array_equal(done, ref_term | ref_trunc)
    np.testing.assert_array_equal(info["discount"], 1.0 - ref_term)

    diff = nxt - ref_next
    if case.angles:  # wrapped angles may land on opposite sides of +-pi
        diff[:, case.angles] = (diff[:, case.angles] + PI) % (2 * PI) - PI
    errors = {
        "state": max_error(ref_next + diff, ref_next, tol),
        "obs": max_error(obs, ref_obs, tol),
        "reward": max_error(reward, ref_reward, tol),
    }
    print(f"\n{env_id} {precision}: {len(states)} transitions, max error / (tol + tol |ref|), tol={tol}: {errors}")
    for what, err in errors.items():
        assert err <= 1.0, f"{env_id}: {what} differs from gymnasium (error ratio {err:.3g})"
    assert obs.dtype == np.float32 and reward.dtype == np.float32

    # The batch must really exercise every edge the test promises.
    coverage = {
        "truncated": ref_trunc.any(),
        "not truncated": (~ref_trunc).any(),
        **case.covers(states.astype(np.float64), actions, ref_next, ref_term),
    }
    missing = [name for name, hit in coverage.items() if not hit]
    assert not missing, f"{env_id}: no transition covers {missing}"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_distribution_matches_gymnasium(env_id):
    case = CASES[env_id]
    env, params, _ = our_env(env_id)
    keys = jax.random.split(jax.random.PRNGKey(1), NUM_RESETS)
    obs, state = jax.device_get(jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys, params))
    ours = state_columns(env_id, state)
    np.testing.assert_array_equal(state.time, 0)
    np.testing.assert_allclose(obs, np.asarray(jax.vmap(env.get_obs)(state)), rtol=0, atol=0)

    ref_env = gymnasium.make(env_id).unwrapped
    ref_env.reset(seed=1)

    def ref_reset():
        ref_env.reset()
        return np.asarray(ref_env.state, np.float64)

    ref = np.array([ref_reset() for _ in range(NUM_RESETS)])

    low, high = np.array(case.reset_low), np.array(case.reset_high)
    for name, x in (("ours", ours), ("gymnasium", ref)):
        assert (x >= low).all() and (x <= high).all(), f"{env_id}: {name} reset leaves {low}..{high}"
    # The whole box is used, not a smaller one.
    np.testing.assert_allclose(ours.min(0), low, atol=1e-3 * (high - low).max())
    np.testing.assert_allclose(ours.max(0), high, atol=1e-3 * (high - low).max())

    def std_error_of_std(x):
        s = x.std(0)
        m4 = ((x - x.mean(0)) ** 4).mean(0)
        return np.sqrt(np.maximum(m4 - s**4, 0) / len(x)) / (2 * np.where(s > 0, s, 1))

    se_mean = np.sqrt(ours.var(0) / len(ours) + ref.var(0) / len(ref))
    se_std = np.hypot(std_error_of_std(ours), std_error_of_std(ref))
    assert (np.abs(ours.mean(0) - ref.mean(0)) <= 4.5 * se_mean).all(), (ours.mean(0), ref.mean(0))
    assert (np.abs(ours.std(0) - ref.std(0)) <= 4.5 * se_std).all(), (ours.std(0), ref.std(0))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spaces_and_time_limit_match_gymnasium(env_id):
    env, params, _ = our_env(env_id)
    ref = gymnasium.make(env_id)
    assert params.max_steps_in_episode == ref.spec.max_episode_steps == CASES[env_id].max_steps
    for ours, theirs in (
        (env.observation_space(params), ref.observation_space),
        (env.action_space(params), ref.action_space),
    ):
        # Samples are finite members of the space (not inf from float32's largest bounds).
        samples, contained = jax.jit(jax.vmap(lambda k: (ours.sample(k), ours.contains(ours.sample(k)))))(
            jax.random.split(jax.random.PRNGKey(0), 64)
        )
        assert contained.all() and np.isfinite(samples).all(), (ours, samples)
        if isinstance(theirs, gymnasium.spaces.Discrete):
            assert ours.n == theirs.n and ours.shape == () and ours.dtype == jnp.int32
            continue
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        # gymnasium's unbounded CartPole velocities may be float32's largest finite value here.
        for a, b in ((ours.low, theirs.low), (ours.high, theirs.high)):
            a = np.asarray(a, np.float64)
            inf = np.isinf(b)
            np.testing.assert_allclose(a[~inf], b[~inf], rtol=1e-7)
            assert (np.abs(a[inf]) >= np.finfo(np.float32).max).all() and (np.sign(a[inf]) == np.sign(b[inf])).all()
