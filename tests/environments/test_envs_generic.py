"""The API contract every registered environment keeps, parametrised over the registry.

Compilation dominates the cost (this file runs over every environment), so each
environment compiles two programs, once, and plays one short episode batch, shared by
the tests through a module cache:
- `reset`: unbatched, on raw `PRNGKey`s;
- `probe`: `vmap` over a batch of params rows (default, `max_steps_in_episode=SHORT`,
  `max_steps_in_episode=1`) and new-style `jax.random.key`s of: a random action, the
  auto-resetting `step`, and next to it the raw `step_env` and `reset_env` that `step`
  must be made of.
Both run under `chex.assert_max_traces(n=1)`; `probe` is driven from Python with the
state fed back, so a state whose dtype or weak type drifts between `reset` and `step` (a
retrace, i.e. a recompilation, on every call) fails.
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
SHORT = 3  # max_steps_in_episode of the second params row


pytestmark = pytest.mark.usefixtures("fast_compilation")


def stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)


@functools.cache
def compiled(env_id):
    """The environment, its params rows and its jitted programs (compiled on first use)."""
    env, params = make(env_id)
    rows = [params, make(env_id, max_steps_in_episode=SHORT)[1], make(env_id, max_steps_in_episode=1)[1]]

    def reset(key, params):
        return env.reset(key, params)

    def probe(key_action, key, state, params):
        action = env.action_space(params).sample(key_action)
        stepped = env.step(key, state, action, params)
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

    # chex counts traces per function source and name: a distinct name per environment.
    reset.__name__, probe.__name__ = f"reset[{env_id}]", f"probe[{env_id}]"
    return SimpleNamespace(
        env=env,
        params=params,
        rows=rows,
        stacked=stack(rows),
        reset=jax.jit(chex.assert_max_traces(reset, n=1)),
        probe=jax.jit(jax.vmap(chex.assert_max_traces(probe, n=1))),
    )


@functools.cache
def episode(env_id):
    """Resets (one unbatched `reset` per row) and `NUM_STEPS` batched random-action `probe`s.

    Returns:
        `(starts, keys, records)`: the per-row `(obs, state)` after reset, the typed keys
        `(NUM_STEPS, 2, rows)` of action and step, and the probe records stacked over
        steps (leading axes `(NUM_STEPS, rows)`).
    """
    c = compiled(env_id)
    reset_keys = jax.random.split(jax.random.PRNGKey(1), len(c.rows))
    starts = [c.reset(k, p) for k, p in zip(reset_keys, c.rows)]
    state = stack([s[1] for s in starts])
    keys = jax.random.split(jax.random.key(2), (NUM_STEPS, 2, len(c.rows)))
    records = []
    for key_action, key in keys:
        records.append(c.probe(key_action, key, state, c.stacked))
        state = records[-1]["step"][1]
    return jax.device_get(starts), keys, jax.tree.map(lambda *x: np.stack(x), *jax.device_get(records))


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
    """`a` where `mask` (flags over the leading axes) else `b`, leaf by leaf."""
    return jax.tree.map(lambda x, y: np.where(mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)), x, y), a, b)


@pytest.fixture(params=registered_envs, scope="module")
def env_id(request):
    """Module-scoped, so pytest runs each environment's tests together (shared compiles)."""
    return request.param


def test_reset_step_contract(env_id):
    c = compiled(env_id)
    obs_space, action_space = c.env.observation_space(c.params), c.env.action_space(c.params)
    starts, _, rec = episode(env_id)
    for obs, state in starts:
        assert_matches_space(obs, obs_space, f"{env_id} reset obs")
        assert obs_space.contains(obs), f"{env_id}: reset obs outside {obs_space}"
        assert state.time.dtype == np.int32 and state.time == 0

    shape = (NUM_STEPS, len(c.rows))
    next_obs, next_state, reward, done, info = rec["step"]
    assert_matches_space(next_obs, obs_space, f"{env_id} step obs", batch_dims=2)
    inside = rec["obs_contained"]
    assert inside.all(), f"{env_id}: obs outside {obs_space} at (step, row) {np.argwhere(~inside).tolist()}"
    assert_matches_space(rec["action"], action_space, f"{env_id} sampled action", batch_dims=2)
    assert rec["action_contained"].all()
    assert reward.shape == shape and reward.dtype == np.float32 and np.isfinite(reward).all()
    assert done.shape == shape and done.dtype == np.bool_
    assert set(info) >= {"terminated", "truncated", "discount"}, sorted(info)
    assert info["terminated"].dtype == info["truncated"].dtype == np.bool_
    assert info["discount"].dtype == np.float32
    np.testing.assert_array_equal(done, info["terminated"] | info["truncated"])
    np.testing.assert_array_equal(info["discount"], 1.0 - info["terminated"])

    # `step_env` does not reset; `step` is `step_env`, replaced by `reset_env` (with the
    # second half of the split key) once the episode has ended.
    raw_obs, raw_state, raw_reward, raw_done, raw_info = rec["step_env"]
    np.testing.assert_array_equal(raw_state.time, rec["state"].time + 1)
    max_steps = np.array([p.max_steps_in_episode for p in c.rows])
    np.testing.assert_array_equal(raw_info["truncated"], raw_state.time >= max_steps)
    rest = {k: v for k, v in info.items() if k != "final_observation"}
    assert_tree_close((reward, done, rest), (raw_reward, raw_done, raw_info), f"{env_id} reward/done/info")
    assert_tree_close(info["final_observation"], raw_obs, f"{env_id} final_observation")  # before the reset
    fresh_obs, fresh_state = rec["reset_env"]
    np.testing.assert_array_equal(fresh_state.time, 0)
    expected = select(done, (fresh_obs, fresh_state), (raw_obs, raw_state))
    assert_tree_close((next_obs, next_state), expected, f"{env_id} step = step_env or reset_env")
    np.testing.assert_array_equal(next_state.time, np.where(done, 0, rec["state"].time + 1))

    # Each row used its own params: episodes of row 1 end at least every SHORT steps,
    # those of row 2 after every step; every end restarted the clock.
    assert done[:, 1].sum() >= NUM_STEPS // SHORT and done[:, 2].all()
    assert (next_state.time[done] == 0).all()


def test_batched_typed_keys_match_unbatched_raw_keys(env_id):
    """`reset_env` under vmap with `jax.random.key`s == unbatched `reset` on its key data."""
    c = compiled(env_id)
    _, keys, rec = episode(env_id)
    for t in (0, NUM_STEPS - 1):
        fresh_keys = jax.vmap(jax.random.split)(keys[t, 1])[:, 1]
        for i, p in enumerate(c.rows):
            unbatched = c.reset(jax.random.key_data(fresh_keys[i]), p)
            batched = jax.tree.map(lambda x: x[t, i], rec["reset_env"])
            assert_tree_close(batched, unbatched, f"{env_id} reset_env step {t} row {i}", 1e-5)


def test_spaces_names_and_stochastic_flag(env_id):
    c = compiled(env_id)
    env = c.env
    assert env.name == env_id and env_id in repr(env)
    action_space = env.action_space(c.params)
    starts, keys, rec = episode(env_id)
    if isinstance(action_space, spaces.Discrete):
        assert env.num_actions == action_space.n
    else:
        assert env.num_actions == int(np.prod(action_space.shape))

    if not env.stochastic:  # a deterministic step ignores its key (same actions, other keys)
        other_keys = jax.random.split(jax.random.key(7), len(c.rows))
        other = c.probe(keys[0, 0], other_keys, stack([s[1] for s in starts]), c.stacked)
        first = jax.tree.map(lambda x: x[0], rec["step_env"])
        assert_tree_close(other["step_env"], first, f"{env_id} is stochastic=False but its step uses the key", 0)


@functools.cache
def step_actions(env_id):
    """`step_env` from one state with one key, vmapped over actions (compiled once)."""
    env = compiled(env_id).env

    def step(key, state, actions, params):
        return jax.vmap(env.step_env, in_axes=(None, None, 0, None))(key, state, actions, params)

    step.__name__ = f"step_actions[{env_id}]"
    return jax.jit(chex.assert_max_traces(step, n=1))


#: The environments whose actions are `Discrete` (the others take continuous `Box` actions).
DISCRETE_IDS = [i for i in registered_envs if isinstance(make(i)[0].action_space(make(i)[1]), spaces.Discrete)]


@pytest.mark.parametrize("discrete_id", DISCRETE_IDS)
def test_out_of_range_discrete_actions_follow_one_rule(discrete_id):
    """`Discrete(n)` actions are clipped into [0, n - 1] (environment.py): n + 3 acts as n - 1
    and -2 as 0. MinAtar keeps minatar's list indexing (documented exception): n + 3 acts as
    n - 1, -2 as n - 2."""
    env_id = discrete_id
    c = compiled(env_id)
    n = c.env.action_space(c.params).n
    assert c.env.clip_discrete_actions == (not env_id.endswith("-MinAtar"))
    low_equivalent = 0 if c.env.clip_discrete_actions else n - 2
    _, keys, rec = episode(env_id)
    for t in (0, NUM_STEPS // 2):  # a fresh and a mid-episode state of the default params
        state = jax.tree.map(lambda x: x[t, 0], rec["state"])
        actions = jnp.array([n + 3, n - 1, -2, low_equivalent, 2**31 - 1], jnp.int32)
        out = jax.device_get(step_actions(env_id)(keys[t, 1, 0], state, actions, c.params))
        high, last, minus_two, low, huge = (jax.tree.map(lambda x, i=i: x[i], out) for i in range(5))
        assert_tree_close(high, last, f"{env_id}: action {n + 3} vs {n - 1} at step {t}", 0)
        assert_tree_close(huge, last, f"{env_id}: action 2**31-1 vs {n - 1} at step {t}", 0)
        assert_tree_close(minus_two, low, f"{env_id}: action -2 vs {low_equivalent} at step {t}", 0)


def test_state_space_contains_visited_states(env_id):
    """`state_space` describes every state: the reset ones and those of random play."""
    c = compiled(env_id)
    starts, _, rec = episode(env_id)
    for i, p in enumerate(c.rows):
        space = c.env.state_space(p)
        assert isinstance(space, spaces.Dict)
        assert bool(space.contains(starts[i][1])), f"{env_id}: reset state outside {space}"
        for t in (0, NUM_STEPS - 1):
            state = jax.tree.map(lambda x: x[t, i], rec["step"][1])
            assert bool(space.contains(state)), f"{env_id}: state of step {t} row {i} outside {space}"
    wrong = starts[0][1].replace(time=np.float32(0.0))  # a float clock is not an EnvState of it
    assert not bool(c.env.state_space(c.params).contains(wrong))


@pytest.mark.parametrize("eager_id", ["Pendulum-v1", "Catch-bsuite", "FourRooms-misc", "Breakout-MinAtar"])
def test_eager_calls_equal_jitted_calls(eager_id):
    """Eager `reset`/`step`/`step_env` (a Python loop) give exactly `jax.jit`'s results,
    through functions compiled once per environment object. (The mechanism is the base
    class's, the same for every environment: one per family is checked.)"""
    env_id = eager_id
    env, params = make(env_id)
    key = jax.random.key(5)
    obs, state = env.reset(key, params)
    assert_tree_close((obs, state), jax.jit(env.reset)(key, params), f"{env_id} eager reset", 0.0)
    step_jit, step_env_jit = jax.jit(env.step), jax.jit(env.step_env)
    for t in range(2):
        k_act, k_step = jax.random.split(jax.random.fold_in(key, t))
        action = env.action_space(params).sample(k_act)
        eager = env.step(k_step, state, action, params)
        assert_tree_close(eager, step_jit(k_step, state, action, params), f"{env_id} eager step {t}", 0.0)
        assert_tree_close(env.step_env(k_step, state, action, params), step_env_jit(k_step, state, action, params),
                          f"{env_id} eager step_env {t}", 0.0)
        state = eager[1]
    cache = env.__dict__["_jit_cache"]
    assert set(cache) >= {"_reset_env", "_step", "_step_env"}
    assert cache["_step"]._cache_size() == 1, "one compile for every eager step of these shapes"
