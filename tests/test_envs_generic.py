"""The API contract every registered environment keeps, parametrised over the registry.

Compilation dominates the cost, so each environment compiles three programs, once, in a
module cache:
- `start`: `reset` plus samples of the observation space (`probe` samples actions);
- `probe`: a random action, the auto-resetting `step`, and next to it the raw `step_env`
  and `reset_env` that `step` must be made of;
- `batched`: `vmap` of reset-then-step over new-style typed keys and a batch of params.
`start` and `probe` run under `chex.assert_max_traces(n=1)` and are driven from Python with
the state fed back, so a state whose dtype or weak type drifts between `reset` and `step`
(a retrace on every call) fails. `batched` is compared row by row with `start` / `probe`
on the equal raw uint32 keys (so both key kinds and determinism across programs are
checked too).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.environments import make, registered_envs, spaces

NUM_STEPS = 12
SHORT = 3  # max_steps_in_episode of the auto-reset checks
NUM_SAMPLES = 16  # space samples checked


@functools.cache
def compiled(env_id):
    """The environment, its default params and its jitted programs (compiled on first use)."""
    env, params = make(env_id)

    def start(key, sample_keys, params):
        obs_samples = jax.vmap(env.observation_space(params).sample)(sample_keys)
        return env.reset(key, params), (obs_samples, jax.vmap(env.observation_space(params).contains)(obs_samples))

    def act_and_step(key_action, key, state, params):
        action = env.action_space(params).sample(key_action)
        return action, env.step(key, state, action, params)

    def probe(key_action, key, state, params):
        action, stepped = act_and_step(key_action, key, state, params)
        key_raw, key_fresh = jax.random.split(key)  # the split `step` documents
        return {
            "state": state,
            "action": action,
            "action_contained": env.action_space(params).contains(action),
            "step": stepped,
            "obs_contained": env.observation_space(params).contains(stepped[0]),
            "step_env": env.step_env(key_raw, state, action, params),
            "reset_env": env.reset_env(key_fresh, params),
        }

    def reset_and_step(key_reset, key_action, key, params):
        obs, state = env.reset(key_reset, params)
        return (obs, state), act_and_step(key_action, key, state, params)

    chex.clear_trace_counter()  # chex counts traces by source code, shared by all envs
    return SimpleNamespace(
        env=env,
        params=params,
        start=jax.jit(chex.assert_max_traces(start, n=1)),
        probe=jax.jit(chex.assert_max_traces(probe, n=1)),
        batched=jax.jit(jax.vmap(reset_and_step)),
    )


def sample_keys():
    return jax.random.split(jax.random.PRNGKey(5), NUM_SAMPLES)


def episode(env_id, params):
    """Reset and `NUM_STEPS` random-action steps through `start` / `probe`."""
    c = compiled(env_id)
    key_reset, key_steps = jax.random.split(jax.random.PRNGKey(0))
    first = (obs, state), _ = c.start(key_reset, sample_keys(), params)
    records = []
    for key in jax.random.split(key_steps, NUM_STEPS):
        records.append(c.probe(*jax.random.split(key), state, params))
        obs, state = records[-1]["step"][:2]
    return jax.device_get(first), jax.tree.map(lambda *x: np.stack(x), *jax.device_get(records))


def assert_tree_close(a, b, what, tol=1e-6):
    """Equal pytrees: integers and booleans exactly, floats to `tol` (relative and absolute)."""
    a, b = jax.device_get((a, b))
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, (what, x.dtype, y.dtype, x.shape, y.shape)
        if np.issubdtype(x.dtype, np.inexact):
            np.testing.assert_allclose(x, y, rtol=tol, atol=tol, err_msg=what)
        else:
            np.testing.assert_array_equal(x, y, err_msg=what)


def assert_matches_space(x, space, what, batch_dims=0):
    """`x` has exactly the structure, shape (after `batch_dims`) and dtype of `space`."""
    if isinstance(space, spaces.Dict):
        assert isinstance(x, dict) and set(x) == set(space.spaces), f"{what}: keys {set(x)} vs {space}"
        for k, s in space.spaces.items():
            assert_matches_space(x[k], s, f"{what}[{k!r}]", batch_dims)
        return
    assert x.shape[batch_dims:] == space.shape, f"{what}: shape {x.shape[batch_dims:]}, space {space}"
    assert x.dtype == space.dtype, f"{what}: dtype {x.dtype}, space {space}"


def select(mask, a, b):
    """`a` where `mask` (one flag per leading index) else `b`, leaf by leaf."""
    return jax.tree.map(lambda x, y: np.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y), a, b)


@pytest.fixture(params=registered_envs, scope="module")
def env_id(request):
    """Module-scoped, so pytest runs each environment's tests together (shared compiles)."""
    return request.param


def test_reset_step_contract(env_id):
    env = compiled(env_id).env
    for p in (compiled(env_id).params, make(env_id, max_steps_in_episode=SHORT)[1]):
        ((obs, state), _), rec = episode(env_id, p)
        obs_space, action_space = env.observation_space(p), env.action_space(p)
        assert_matches_space(obs, obs_space, f"{env_id} reset obs")
        assert obs_space.contains(obs), f"{env_id}: reset obs outside {obs_space}"
        assert state.time.dtype == np.int32 and state.time == 0

        next_obs, next_state, reward, done, info = rec["step"]
        assert_matches_space(next_obs, obs_space, f"{env_id} step obs", batch_dims=1)
        inside = rec["obs_contained"]
        assert inside.all(), f"{env_id}: obs outside {obs_space} at steps {np.flatnonzero(~inside)}"
        assert_matches_space(rec["action"], action_space, f"{env_id} sampled action", batch_dims=1)
        assert rec["action_contained"].all()
        assert reward.shape == (NUM_STEPS,) and reward.dtype == np.float32 and np.isfinite(reward).all()
        assert done.shape == (NUM_STEPS,) and done.dtype == np.bool_
        assert set(info) >= {"terminated", "truncated", "discount"}, sorted(info)
        assert info["terminated"].dtype == info["truncated"].dtype == np.bool_
        assert info["discount"].dtype == np.float32
        np.testing.assert_array_equal(done, info["terminated"] | info["truncated"])
        np.testing.assert_array_equal(info["discount"], 1.0 - info["terminated"])

        # `step_env` does not reset; `step` is `step_env`, replaced by `reset_env` (with
        # the second half of the split key) once the episode has ended.
        raw_obs, raw_state, raw_reward, raw_done, raw_info = rec["step_env"]
        np.testing.assert_array_equal(raw_state.time, rec["state"].time + 1)
        np.testing.assert_array_equal(raw_info["truncated"], raw_state.time >= p.max_steps_in_episode)
        assert_tree_close((reward, done, info), (raw_reward, raw_done, raw_info), f"{env_id} reward/done/info")
        fresh_obs, fresh_state = rec["reset_env"]
        np.testing.assert_array_equal(fresh_state.time, 0)
        expected = select(done, (fresh_obs, fresh_state), (raw_obs, raw_state))
        assert_tree_close((next_obs, next_state), expected, f"{env_id} step = step_env or reset_env")
        np.testing.assert_array_equal(next_state.time, np.where(done, 0, rec["state"].time + 1))

    # With max_steps_in_episode=SHORT (the last `p` above) episodes end at least every
    # SHORT steps, so several auto-resets happened.
    assert done.sum() >= NUM_STEPS // SHORT and (next_state.time[done] == 0).all()


def test_vmap_over_typed_keys_and_params(env_id):
    """vmap(reset, step) over `jax.random.key` keys and stacked params == row by row."""
    c = compiled(env_id)
    # The row with max_steps_in_episode=1 ends its episode: the batched step auto-resets.
    batch = [c.params, make(env_id, max_steps_in_episode=1)[1], c.params.replace(max_steps_in_episode=SHORT)]
    stacked = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *batch)
    key_reset, key_step = jax.random.split(jax.random.key(3), (2, len(batch)))  # typed keys
    key_action = jax.random.split(jax.random.PRNGKey(4), len(batch))
    reset_out, (actions, step_out) = c.batched(key_reset, key_action, key_step, stacked)
    for i, p in enumerate(batch):
        row = jax.tree.map(lambda x: x[i], (reset_out, actions, step_out))
        (obs, state), _ = c.start(jax.random.key_data(key_reset[i]), sample_keys(), p)
        expected = c.probe(key_action[i], jax.random.key_data(key_step[i]), state, p)
        assert_tree_close(row, ((obs, state), expected["action"], expected["step"]), f"{env_id} row {i}", 1e-5)
    done = np.asarray(step_out[3])
    assert done[1] and np.asarray(step_out[1].time)[1] == 0, f"{env_id}: batched params not used per row"


def test_spaces_names_and_stochastic_flag(env_id):
    c = compiled(env_id)
    env, params = c.env, c.params
    assert env.name == env_id and env_id in repr(env)
    action_space, obs_space = env.action_space(params), env.observation_space(params)
    (_, state), (samples, contained) = c.start(jax.random.PRNGKey(0), sample_keys(), params)
    assert_matches_space(samples, obs_space, f"{env_id} {obs_space} sample", batch_dims=1)
    assert contained.all(), f"{env_id}: {obs_space}.sample leaves the space"
    if isinstance(action_space, spaces.Discrete):
        assert env.num_actions == action_space.n
    else:
        assert env.num_actions == int(np.prod(action_space.shape))

    if not env.stochastic:  # a deterministic step ignores its key
        a, b = (c.probe(jax.random.PRNGKey(6), jax.random.PRNGKey(k), state, params) for k in (1, 2))
        assert_tree_close(a["step_env"], b["step_env"], f"{env_id} is stochastic=False but its step uses the key", 0)
