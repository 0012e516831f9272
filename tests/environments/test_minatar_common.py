"""What the MinAtar games share (environments/minatar/common.py), tested per game: resets
against the `minatar` package, sticky actions, out-of-range actions, action sets,
observation spaces and vmap over params. (The API contract itself, for every registered id,
is tests/environments/test_envs_generic.py's; each game's conformance is in its own test file.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from minatar import Environment as MinAtarReference

from popeval.environments import make
from tests.environments.minatar_helpers import (
    BATCH,
    FIRE,
    LEFT,
    NOOP,
    RIGHT,
    asterix_state,
    breakout_state,
    cycle,
    fill,
    freeway_state,
    reference,
    step_many,
)

BREAKOUT_ASTERIX_FREEWAY = ("Breakout-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar")
SPACE_INVADERS_SEAQUEST = ("SpaceInvaders-MinAtar", "Seaquest-MinAtar")


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
    state = state.replace(last_action=jnp.int32(LEFT))
    keys = jax.random.split(jax.random.key(1), 8192)
    step = jax.jit(jax.vmap(env.step_env, in_axes=(0, None, None, None)))
    _, nxt, *_ = step(keys, state, jnp.int32(2), params)  # minimal action 2 is `r`
    sticky = np.asarray(nxt.last_action) == LEFT
    assert set(np.asarray(nxt.last_action).tolist()) == {LEFT, RIGHT}
    np.testing.assert_array_equal(np.asarray(nxt.pos), np.where(sticky, 3, 5))
    assert abs(sticky.mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / sticky.size)
    for p, expect in ((0.0, RIGHT), (1.0, LEFT)):
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
@pytest.mark.parametrize("env_id", BREAKOUT_ASTERIX_FREEWAY)
def test_action_sets_spaces_and_vmapped_params(env_id):
    """(jit / vmap over keys / spaces / retracing: tests/environments/test_envs_generic.py.)"""
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


@pytest.mark.parametrize("env_id", SPACE_INVADERS_SEAQUEST)
def test_spaces_and_action_sets(env_id):
    """(The API contract itself is tests/environments/test_envs_generic.py's, for every registered id.)"""
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


@pytest.mark.parametrize("env_id", SPACE_INVADERS_SEAQUEST)
def test_sticky_actions(env_id):
    """`l` after `r`: with probability `sticky_action_prob` the previous `r` is repeated."""
    env, params = make(env_id)
    keys = jax.random.split(jax.random.key(0), BATCH)
    state = env.reset(keys[0], params)[1].replace(last_action=jnp.int32(RIGHT))
    left = cycle(env.action_set.index(LEFT), jnp.int32)
    probs = cycle([0.0] * 10 + [1.0] * 10 + [0.25] * (BATCH - 20), jnp.float32)
    batch = fill(params).replace(sticky_action_prob=probs)
    nxt = step_many(env_id)(keys, fill(state), left, batch)[1]
    pos = np.asarray(nxt.pos if env_id.startswith("Space") else nxt.sub_x)
    repeated = np.asarray(nxt.last_action) == RIGHT
    assert not repeated[:10].any() and repeated[10:20].all()
    np.testing.assert_array_equal(pos, np.where(repeated, 6, 4))
    assert abs(repeated[20:].mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / (BATCH - 20))


@pytest.mark.parametrize("env_id", SPACE_INVADERS_SEAQUEST)
def test_out_of_range_actions_are_clipped(env_id):
    env, params = make(env_id, sticky_action_prob=0.0)
    key = jax.random.key(3)
    state = env.reset(key, params)[1]
    actions = cycle([env.num_actions, 100, -1, -100], jnp.int32)
    nxt = step_many(env_id)(jax.random.split(key, BATCH), fill(state), actions, fill(params))[1]
    first, last = env.action_set[0], env.action_set[-1]
    # -1 counts from the end, as in numpy
    np.testing.assert_array_equal(nxt.last_action[:4], [last, last, last, first])
    with pytest.raises(TypeError):
        env.step_env(key, state, jnp.float32(1.0), params)
