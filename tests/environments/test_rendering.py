"""Rendering: frames of every registered environment, GIF round trips, the classic-control
geometry, the gymnax `Visualizer` usage, and that importing popeval leaves Pillow unloaded.

Every environment compiles one program (reset plus a short random rollout); the frames are
drawn on the host.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from popeval.environments import Visualizer, make, registered_envs, render, rendering
from popeval.environments.minatar.common import MinAtarEnv
from popeval.environments.rendering.kit import BLACK
from popeval.environments.rendering.minatar import CHANNEL_COLOURS
from tests.helpers import sweep

NUM_STEPS = 6
#: Environments drawn from continuous state geometry: every state change must show.
GEOMETRIC = {
    "CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
    "PointRobot-misc", "Reacher-misc", "Swimmer-misc",
}  # fmt: skip


@functools.cache
def compiled_rollout(env_id):
    """`(env, params, rollout)`: `rollout(key, params)` gives `NUM_STEPS + 1` states of a
    random-action rollout (raw steps, no reset) and their observations, stacked."""
    env, params = make(env_id)

    def rollout(key, params):
        key_reset, key_steps = jax.random.split(key)
        obs, state = env.reset(key_reset, params)

        def step(carry, key):
            key_action, key_step = jax.random.split(key)
            action = env.action_space(params).sample(key_action)
            obs, state, *_ = env.step_env(key_step, carry[1], action, params)
            return (obs, state), (obs, state)

        keys = jax.random.split(key_steps, NUM_STEPS)
        _, (all_obs, states) = jax.lax.scan(step, (obs, state), keys)
        first = lambda x, xs: jnp.concatenate([x[None], xs])  # noqa: E731
        return jax.tree.map(first, state, states), first(obs, all_obs)

    return env, params, jax.jit(rollout)


def random_states(env_id, seed=0):
    """`(env, params, states, obs)` of a random rollout of `env_id` (numpy leaves)."""
    env, params, rollout = compiled_rollout(env_id)
    states, obs = jax.tree.map(np.asarray, rollout(jax.random.key(seed), params))
    return env, params, states, obs


def state_at(states, t):
    return jax.tree.map(lambda x: x[t], states)


def changed(states, t):
    """Whether anything but the step counter differs between states t and t + 1."""
    a, b = (jax.tree.leaves(state_at(states, i).replace(time=0)) for i in (t, t + 1))
    return any(not np.array_equal(x, y) for x, y in zip(a, b))


def read_gif(path):
    """(frames as RGB arrays, per-frame durations in ms) of a GIF file."""
    with Image.open(path) as im:
        frames, durations = [], []
        for i in range(im.n_frames):
            im.seek(i)
            frames.append(np.asarray(im.convert("RGB")))
            durations.append(im.info["duration"])
    return frames, durations


def runs(frames):
    """Number of runs of identical consecutive frames (what a GIF file stores)."""
    return 1 + sum(not np.array_equal(a, b) for a, b in zip(frames, frames[1:]))


@pytest.mark.parametrize("env_id", sweep(registered_envs))
def test_render_every_env(env_id, tmp_path):
    env, params, states, _ = random_states(env_id)
    frames = render(env, params, states)

    assert len(frames) == NUM_STEPS + 1
    shape = frames[0].shape
    assert len(shape) == 3 and shape[2] == 3 and min(shape[:2]) >= 32
    for frame in frames:
        assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.shape == shape
        assert np.any(frame != frame[:1, :1])  # a picture, not a blank
    moved = [changed(states, t) for t in range(NUM_STEPS)]
    if env_id in GEOMETRIC:
        for t in np.flatnonzero(moved):
            assert not np.array_equal(frames[t], frames[t + 1]), f"{env_id}: step {t} not drawn"
    if any(moved):
        assert runs(frames) > 1, f"{env_id}: the state changed but every frame is the same"

    # A list of states draws the same frames as the stacked state.
    as_list = render(env, params, [state_at(states, t) for t in range(NUM_STEPS + 1)])
    assert all(np.array_equal(a, b) for a, b in zip(frames, as_list))

    path = rendering.save_gif(frames, tmp_path / "sub" / f"{env_id}.gif", fps=20)
    back, durations = read_gif(path)
    assert len(back) == runs(frames)  # identical consecutive frames are stored once
    assert sum(durations) == 50 * len(frames)  # ... for their summed duration
    assert back[0].shape == shape
    # GIF palettes are 256 colours: the first frame comes back nearly unchanged.
    assert np.mean(np.abs(back[0].astype(int) - frames[0].astype(int))) < 3.0


def test_minatar_cells_show_the_top_channel():
    env, params, states, obs = random_states("Breakout-MinAtar", seed=1)
    frames = render(env, params, states)
    cell = frames[0].shape[0] // 10
    for frame, o in zip(frames, obs):
        centres = frame[cell // 2 :: cell, cell // 2 :: cell][:10, :10]
        for r in range(10):
            for c in range(10):
                active = np.flatnonzero(o[r, c])
                want = CHANNEL_COLOURS[active[-1]] if len(active) else BLACK
                assert tuple(centres[r, c]) == want, (r, c, active)
    assert isinstance(env, MinAtarEnv) and obs[..., 3].any()  # bricks were among the cells


def mask_centre(frame, colour, tol=40):
    """Mean (row, col) of the pixels within `tol` of `colour`, and their count."""
    close = np.all(np.abs(frame.astype(int) - np.asarray(colour)) <= tol, axis=-1)
    rows, cols = np.nonzero(close)
    return (rows.mean(), cols.mean()) if len(rows) else (np.nan, np.nan), len(rows)


def test_classic_control_geometry():
    """Positions follow gymnasium's screen geometry (y up, 600 / 500 pixel screens)."""
    env, params = make("CartPole-v1")
    state = env.reset(jax.random.key(0), params)[1]
    pole = (202, 152, 101)
    (row0, col0), n0 = mask_centre(render(env, params, state.replace(x=0.0, theta=0.0))[0], pole)
    (row1, col1), _ = mask_centre(render(env, params, state.replace(x=1.2, theta=0.0))[0], pole)
    (_, col2), _ = mask_centre(render(env, params, state.replace(x=0.0, theta=0.2))[0], pole)
    assert n0 > 500 and abs(col0 - 300) < 1 and row0 < 400 - 100  # upright, above the track
    assert abs((col1 - col0) - 1.2 * 600 / 4.8) < 1  # 125 pixels per metre
    assert col2 > col0 + 10  # positive theta leans the pole to the right

    env, params = make("Pendulum-v1")
    state = env.reset(jax.random.key(0), params)[1].replace(last_u=0.0)
    red = (204, 77, 77)
    (up, _), _ = mask_centre(render(env, params, state.replace(theta=0.0))[0], red)
    (down, _), _ = mask_centre(render(env, params, state.replace(theta=np.pi))[0], red)
    assert up < 250 < down  # theta = 0 is upright

    env, params = make("Acrobot-v1")
    state = env.reset(jax.random.key(0), params)[1]
    cyan = (0, 204, 204)
    poses = [state.replace(joint_angle1=a, joint_angle2=0.0) for a in (0.0, np.pi)]
    (hang, _), (swung, _) = (mask_centre(frame, cyan)[0] for frame in render(env, params, poses))
    assert hang > 250 + 100 and swung < 250 - 100  # hangs down at rest

    env, params = make("MountainCar-v0")
    state = env.reset(jax.random.key(0), params)[1]
    left, right = render(env, params, [state.replace(position=-1.0), state.replace(position=0.3)])
    cols = np.nonzero(np.any(left != right, axis=-1))[1]  # the car, in one frame or the other
    assert abs(cols[cols < 300].mean() - 0.2 * 600 / 1.8) < 15  # x = (position - min) * scale
    assert abs(cols[cols >= 300].mean() - 1.5 * 600 / 1.8) < 15
    (_, flag_col), _ = mask_centre(left, (204, 204, 0), 5)
    assert abs(flag_col - (1.7 * 600 / 1.8 + 25 / 3)) < 2  # the flag triangle at goal_position 0.5


def test_visualizer_seed_usage(tmp_path):
    """The gymnax README's Visualizer example, unchanged but for the import."""
    env, env_params = make("CartPole-v1")
    rng = jax.random.PRNGKey(0)
    state_seq, reward_seq = [], []
    rng, rng_reset = jax.random.split(rng)
    obs, env_state = env.reset(rng_reset, env_params)
    while True:
        state_seq.append(env_state)
        rng, rng_act, rng_step = jax.random.split(rng, 3)
        action = env.action_space(env_params).sample(rng_act)
        next_obs, next_env_state, reward, done, info = env.step(rng_step, env_state, action, env_params)
        reward_seq.append(reward)
        if done:
            break
        else:
            obs = next_obs  # noqa: F841 (the seed's loop, as written)
            env_state = next_env_state

    cum_rewards = jnp.cumsum(jnp.array(reward_seq))
    vis = Visualizer(env, env_params, state_seq, cum_rewards)
    path = vis.animate(str(tmp_path / "docs" / "anim.gif"))

    back, _ = read_gif(path)
    assert len(back) == len(state_seq) > 1  # the caption's step counter makes every frame new
    plain = render(env, env_params, state_seq)
    assert back[0].shape[0] > plain[0].shape[0] and back[0].shape[1:] == plain[0].shape[1:]


def test_errors(tmp_path):
    env, params, states, _ = random_states("CartPole-v1")
    batch = jax.tree.map(lambda x: np.stack([x, x], 1), states)  # (T, B): not one episode
    with pytest.raises(ValueError, match="one sequence"):
        render(env, params, batch)
    with pytest.raises(ValueError, match="empty"):
        render(env, params, [])
    with pytest.raises(TypeError, match="no painter"):
        render(object(), None, [])
    with pytest.raises(ValueError, match="no frames"):
        rendering.save_gif([], tmp_path / "x.gif")
    frames = render(env, params, states)
    with pytest.raises(ValueError, match="frames must all be"):
        rendering.save_gif([frames[0], frames[0][:10]], tmp_path / "x.gif")
    with pytest.raises(ValueError, match="reward_seq"):
        Visualizer(env, params, states, reward_seq=[1.0])
