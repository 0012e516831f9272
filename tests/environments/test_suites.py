"""The adapters of `popeval.environments.suites` (Craftax, Jumanji, Navix, XLand-MiniGrid) against the suites.

For each adapter: reset and raw steps agree with the suite's own environment (same keys, same
actions, until an episode ends), termination and truncation are told apart, the time limit
truncates, and `RolloutWrapper` runs a small MLP policy population on it, its fitness path
returning exactly the trajectory path's `cum_return`, with lengths that stop where episodes
end. Each suite is skipped when it is not installed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.policies import MLPPolicy
from popeval.rollout import RolloutWrapper

pytestmark = pytest.mark.usefixtures("fast_compilation")


def stack(*trees):
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)


def check_step(out, ref_obs, ref_reward, done, terminated, truncated, rtol=0.0):
    """One raw step's `(obs, state, reward, done, info)` against the reference's values."""
    obs, _, reward, got_done, info = out
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=0), obs, ref_obs)
    assert float(reward) == float(ref_reward)
    flags = (bool(got_done), bool(info["terminated"]), bool(info["truncated"]))
    assert flags == (done, terminated, truncated)
    assert float(info["discount"]) == (0.0 if terminated else 1.0)


def check_rollouts(env, num_steps: int, short: int):
    """2 MLP policies x 2 limits (`short`, the default) x 2 episodes: fitness == trajectories."""
    policy = MLPPolicy.for_env(env, hidden_sizes=(8,))
    pop = jax.vmap(lambda k: policy.init_params(k, env))(jax.random.split(jax.random.key(0), 2))
    params = stack(env.default_params.replace(max_steps_in_episode=short), env.default_params)
    manager = RolloutWrapper(policy.apply, env=env, num_env_steps=num_steps, compaction=False)
    keys = jax.random.split(jax.random.key(7), 2)
    fit = manager.population_fitness(keys, pop, params)
    obs, action, reward, _, done, cum_return = manager.population_rollout(keys, pop, params)
    assert fit.returns.shape == (2, 2, 2)
    np.testing.assert_array_equal(fit.returns, cum_return)
    np.testing.assert_array_equal(cum_return, reward.sum(-1))
    done = np.asarray(done)
    first_done = np.where(done.any(-1), done.argmax(-1) + 1, num_steps)
    np.testing.assert_array_equal(fit.lengths, first_done)
    # The short limit stops every episode early; some run past it under the default limit.
    assert (np.asarray(fit.lengths[:, 0]) <= short).all() and (np.asarray(fit.lengths[:, 1]) > short).any()
    # The observations acted on (a final one may leave the space: Snake's step_count reaches
    # time_limit, one past its DiscreteArray spec) and every action.
    acted_on = np.arange(num_steps) < np.asarray(fit.lengths)[..., None]
    contains = jax.vmap(env.observation_space().contains)(obs.reshape((-1,) + obs.shape[4:]))
    assert np.asarray(contains).reshape(acted_on.shape)[acted_on].all()
    assert bool(jax.vmap(env.action_space().contains)(action.reshape(-1)).all())


# ---------------------------------------------------------------------------------- Jumanji
#: Each observation field, in the spec's order: what the flattened observation concatenates.
JUMANJI_FIELDS = {
    "Snake-v1": ("grid", "step_count", "action_mask"),
    "Maze-v0": ("agent_position.row", "agent_position.col", "target_position.row",
                "target_position.col", "walls", "step_count", "action_mask"),
}
#: `make` arguments: time limits short enough for random play to reach Maze's and for the
#: time-limit test to reach Snake's.
JUMANJI_KWARGS = {"Snake-v1": {"time_limit": 12}, "Maze-v0": {"time_limit": 12}}
#: How the random episode of `test_jumanji_matches_reference` ends: the snake hits a wall at
#: step 9; the maze runs into its time limit.
JUMANJI_ENDS = {"Snake-v1": "terminated", "Maze-v0": "truncated"}


def flat(env_id, observation):
    def field(path):
        value = observation
        for name in path.split("."):
            value = getattr(value, name)
        return jnp.ravel(value).astype(jnp.float32)

    return jnp.concatenate([field(p) for p in JUMANJI_FIELDS[env_id]])


@functools.cache
def _jumanji_pair(env_id):
    import jumanji

    from popeval.environments.suites import jumanji_env

    ref = jumanji.make(env_id, **JUMANJI_KWARGS[env_id])
    return jumanji_env(env_id, **JUMANJI_KWARGS[env_id]), ref, jax.jit(ref.reset), jax.jit(ref.step)


def jumanji_pair(env_id):
    """`(adapter, reference, jitted reference reset, step)`, built once per module run."""
    pytest.importorskip("jumanji")
    return _jumanji_pair(env_id)


@pytest.mark.parametrize("env_id", sorted(JUMANJI_FIELDS))
def test_jumanji_matches_reference(env_id):
    env, ref, ref_reset, ref_step = jumanji_pair(env_id)
    assert env.default_params.max_steps_in_episode == ref.time_limit
    assert env.action_space().n == ref.action_spec.num_values
    key = jax.random.key(2)
    obs, state = env.reset(key)
    ref_state, ts = ref_reset(key)
    np.testing.assert_array_equal(obs, flat(env_id, ts.observation))
    rng = np.random.default_rng(2)
    for t in range(1, 101):
        action = jnp.int32(rng.integers(4))
        ref_state, ts = ref_step(ref_state, action)
        out = env.step_env(jax.random.key(t), state, action)
        last = bool(ts.last())
        # Jumanji ends its time limit with discount 0 too; popeval calls it a truncation.
        terminated = last and float(ts.discount) == 0.0 and t < ref.time_limit
        check_step(out, flat(env_id, ts.observation), ts.reward, last, terminated, last and not terminated)
        assert bool(env.observation_space().contains(out[0]))
        state = out[1]
        if last:
            break
    assert last and t >= 3, "the reference episode did not end after several steps"
    assert bool(out[4][JUMANJI_ENDS[env_id]])


def test_jumanji_structured_observation():
    """Maze's observation nests `Position`s, and its spec orders the fields differently from
    the observation NamedTuple: the dict follows the spec, as the flat vector does."""
    env_id = "Maze-v0"
    _, ref, ref_reset, _ = jumanji_pair(env_id)
    from popeval.environments.suites import jumanji_env

    env = jumanji_env(ref, flatten=False)
    obs, _ = env.reset(jax.random.key(5))
    _, ts = ref_reset(jax.random.key(5))
    top_level = dict.fromkeys(path.split(".")[0] for path in JUMANJI_FIELDS[env_id])
    assert list(env.observation_space().spaces) == list(top_level)
    for path in JUMANJI_FIELDS[env_id]:
        got, want = obs, ts.observation
        for name in path.split("."):
            got, want = got[name], getattr(want, name)
        np.testing.assert_array_equal(got, want)
    assert bool(env.observation_space().contains(obs))


def test_jumanji_time_limits():
    env_id = "Snake-v1"
    env, ref, ref_reset, ref_step = jumanji_pair(env_id)
    assert env.default_params.max_steps_in_episode == ref.time_limit == 12
    for limit, end in ((12, 12), (5, 5), (30, 12)):  # popeval's limit; jumanji's stays 12
        params = env.default_params.replace(max_steps_in_episode=limit)
        _, state = env.reset(jax.random.key(0), params)
        ref_state, ts = ref_reset(jax.random.key(0))
        for t in range(1, end + 1):
            # A move the snake survives, so only the time limits can end the episode.
            action = jnp.int32(np.flatnonzero(np.asarray(ts.observation.action_mask))[0])
            ref_state, ts = ref_step(ref_state, action)
            out = env.step_env(jax.random.key(t), state, action, params)
            check_step(out, flat(env_id, ts.observation), ts.reward, t == end, False, t == end)
            state = out[1]
        assert bool(ts.last()) == (end == 12) and float(ts.discount) == (0.0 if end == 12 else 1.0)


def test_jumanji_rollouts():
    env, *_ = jumanji_pair("Snake-v1")
    check_rollouts(env, num_steps=16, short=4)


# ------------------------------------------------------------------------------------ Navix
NAVIX_ID = "Navix-Empty-5x5-v0"
#: Turn left and back, two forward, turn right, two forward: onto the goal at (3, 3).
NAVIX_ROUTE = (0, 1, 2, 2, 1, 2, 2)


@pytest.fixture(scope="module")
def navix_pair():
    navix = pytest.importorskip("navix", reason="navix is the suites extra: pip install -e '.[suites]'")
    from popeval.environments.suites import navix_env

    ref = navix.make(NAVIX_ID, max_steps=20)
    return navix_env(NAVIX_ID, max_steps=20), ref, jax.jit(ref.reset), jax.jit(ref.step)


@pytest.mark.slow  # navix: the suites extra
def test_navix_matches_reference(navix_pair):
    env, ref, ref_reset, ref_step = navix_pair
    assert env.default_params.max_steps_in_episode == ref.max_steps == 20
    assert env.action_space().n == 7
    key = jax.random.key(4)
    obs, state = env.reset(key)
    ts = ref_reset(key)
    np.testing.assert_array_equal(obs, ts.observation)
    assert bool(env.observation_space().contains(obs))
    for t, action in enumerate(NAVIX_ROUTE, start=1):
        ts = ref_step(ts, jnp.int32(action))
        out = env.step_env(jax.random.key(t), state, jnp.int32(action))
        end = t == len(NAVIX_ROUTE)
        assert int(ts.step_type) == (2 if end else 0)  # navix's termination on the goal
        check_step(out, ts.observation, ts.reward, end, end, False)
        state = out[1]
    assert float(ts.reward) > 0
    assert bool(env.state_space().contains(state))  # navix's state carries typed keys
    assert not bool(env.state_space().contains(state.replace(time=jnp.float32(0))))


@pytest.mark.slow  # navix: the suites extra
def test_navix_time_limits(navix_pair):
    env, _, ref_reset, ref_step = navix_pair
    for limit, end in ((3, 3), (40, 20)):  # popeval's limit; navix's max_steps stays 20
        params = env.default_params.replace(max_steps_in_episode=limit)
        _, state = env.reset(jax.random.key(0), params)
        ts = ref_reset(jax.random.key(0))
        for t in range(1, end + 1):
            action = jnp.int32(t % 2)  # turning on the spot: never the goal
            ts = ref_step(ts, action)
            out = env.step_env(jax.random.key(t), state, action, params)
            check_step(out, ts.observation, ts.reward, t == end, False, t == end)
            state = out[1]
        assert int(ts.step_type) == (1 if end == 20 else 0)  # navix's own truncation


@pytest.mark.slow  # navix: the suites extra
def test_navix_rollouts(navix_pair):
    env, *_ = navix_pair
    check_rollouts(env, num_steps=12, short=3)


@pytest.mark.slow  # navix: the suites extra
def test_fitness_memory_does_not_grow_with_episode_length(navix_pair):
    """An adapted suite keeps the fitness path's O(P x B x state) memory: XLA's buffers are
    the same for 10 and 200 steps, where the trajectory path's grow with T."""
    env, *_ = navix_pair
    policy = MLPPolicy.for_env(env, hidden_sizes=(8,))
    pop = jax.vmap(lambda k: policy.init_params(k, env))(jax.random.split(jax.random.key(0), 4))
    keys = jax.random.split(jax.random.key(1), 2)

    def xla_bytes(num_steps, method):
        w = RolloutWrapper(policy.apply, env=env, env_params={"max_steps_in_episode": 200}, num_env_steps=num_steps)
        mem = jax.jit(getattr(w, method)).lower(keys, pop).compile().memory_analysis()
        return mem.temp_size_in_bytes + mem.output_size_in_bytes

    assert xla_bytes(200, "population_fitness") <= 1.05 * xla_bytes(10, "population_fitness") + 65_536
    assert xla_bytes(200, "population_rollout") > 5 * xla_bytes(10, "population_rollout")


# -------------------------------------------------------------------------------- xminigrid
XMINIGRID_ID = "MiniGrid-Empty-5x5"
#: Two forward, turn right, two forward: onto the goal at (3, 3).
XMINIGRID_ROUTE = (0, 0, 1, 0, 0)


@pytest.fixture(scope="module")
def xminigrid_pair():
    xminigrid = pytest.importorskip("xminigrid", reason="xminigrid is the suites extra: pip install -e '.[suites]'")
    from popeval.environments import make

    ref, ref_params = xminigrid.make(XMINIGRID_ID, max_steps=20)
    env, _ = make(f"xminigrid/{XMINIGRID_ID}", max_steps=20)
    return env, ref, ref_params, jax.jit(ref.reset, static_argnums=0), jax.jit(ref.step, static_argnums=0)


@pytest.mark.slow  # xminigrid: the suites extra
def test_xminigrid_matches_reference(xminigrid_pair):
    """The route to the goal, each step from the adapter's own state, then a random walk."""
    env, ref, ref_params, ref_reset, ref_step = xminigrid_pair
    assert env.default_params.max_steps_in_episode == ref_params.max_steps == 20
    assert env.action_space().n == 6
    obs, state = env.reset(jax.random.key(4))
    np.testing.assert_array_equal(obs, ref_reset(ref_params, jax.random.key(4)).observation)
    assert bool(env.observation_space().contains(obs))
    for t, action in enumerate(XMINIGRID_ROUTE, start=1):
        ts = ref_step(ref_params, state.inner, jnp.int32(action))
        out = env.step_env(jax.random.key(t), state, jnp.int32(action))
        end = t == len(XMINIGRID_ROUTE)
        check_step(out, ts.observation, ts.reward, end, end, False)
        assert bool(env.observation_space().contains(out[0]))
        state = out[1]
    assert float(ts.reward) > 0  # the goal pays


@pytest.mark.slow  # xminigrid: the suites extra
def test_xminigrid_time_limits(xminigrid_pair):
    env, _, ref_params, ref_reset, ref_step = xminigrid_pair
    for limit, end in ((3, 3), (40, 20)):  # popeval's limit; xminigrid's max_steps stays 20
        params = env.default_params.replace(max_steps_in_episode=limit)
        _, state = env.reset(jax.random.key(0), params)
        ts = ref_reset(ref_params, jax.random.key(0))
        for t in range(1, end + 1):
            action = jnp.int32(1 + t % 2)  # turning on the spot: never the goal
            ts = ref_step(ref_params, ts, action)
            out = env.step_env(jax.random.key(t), state, action, params)
            check_step(out, ts.observation, ts.reward, t == end, False, t == end)
            state = out[1]
        assert bool(ts.last()) == (end == 20)  # xminigrid's own truncation


@pytest.mark.slow  # xminigrid: the suites extra
def test_xminigrid_rollouts(xminigrid_pair):
    env, *_ = xminigrid_pair
    check_rollouts(env, num_steps=12, short=3)


# ---------------------------------------------------------------------------------- Craftax
#: The observation's light level is a float computed in two programs: equal up to the last bit.
CRAFTAX_RTOL = 1e-6


@pytest.fixture(scope="module")
def craftax_pair():
    pytest.importorskip("craftax")
    from craftax.craftax_env import make_craftax_env_from_name

    from popeval.environments.suites import craftax_classic

    return craftax_classic(), make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=False)


@pytest.mark.slow  # Craftax's step takes ~10 s of CPU to compile, per program
def test_craftax_matches_reference(craftax_pair):
    env, ref = craftax_pair
    ref_params = ref.default_params
    assert env.default_params.max_steps_in_episode == ref_params.max_timesteps == 10000
    assert env.action_space().n == 17
    key = jax.random.key(1)
    obs, state = env.reset(key)
    ref_obs, ref_state = ref.reset(key, ref_params)
    np.testing.assert_allclose(obs, ref_obs, rtol=CRAFTAX_RTOL)
    rng = np.random.default_rng(1)
    for t in range(1, 6):
        action = jnp.int32(rng.integers(17))
        ref_obs, ref_state, ref_reward, ref_done, _ = ref.step(jax.random.key(t), ref_state, action, ref_params)
        out = env.step_env(jax.random.key(t), state, action)
        check_step(out, ref_obs, ref_reward, False, False, False, CRAFTAX_RTOL)
        assert not bool(ref_done)
        state = out[1]
    # Death ends the episode: terminated. The same state at zero health, one more step.
    zero_health = jnp.zeros_like(state.inner.player_health)
    dead = state.replace(inner=state.inner.replace(player_health=zero_health))
    ref_dead = ref_state.replace(player_health=jnp.zeros_like(ref_state.player_health))
    ref_obs, _, ref_reward, ref_done, _ = ref.step(jax.random.key(9), ref_dead, jnp.int32(0), ref_params)
    assert bool(ref_done)
    out = env.step_env(jax.random.key(9), dead, jnp.int32(0))
    check_step(out, ref_obs, ref_reward, True, True, False, CRAFTAX_RTOL)


@pytest.mark.slow  # Craftax's step takes ~10 s of CPU to compile, per program
def test_craftax_time_limit(craftax_pair):
    """Craftax's `max_timesteps` is popeval's time limit: a truncation, where craftax says done."""
    env, ref = craftax_pair
    params = env.default_params.replace(max_steps_in_episode=3)
    ref_params = ref.default_params.replace(max_timesteps=3)
    _, state = env.reset(jax.random.key(2), params)
    _, ref_state = ref.reset(jax.random.key(2), ref_params)
    for t in range(1, 4):
        ref_obs, ref_state, ref_reward, ref_done, info = ref.step(
            jax.random.key(t), ref_state, jnp.int32(0), ref_params)
        assert bool(ref_done) == (t == 3) and float(info["discount"]) == (0.0 if t == 3 else 1.0)
        out = env.step_env(jax.random.key(t), state, jnp.int32(0), params)
        check_step(out, ref_obs, ref_reward, t == 3, False, t == 3, CRAFTAX_RTOL)
        state = out[1]


@pytest.mark.slow  # Craftax's step takes ~10 s of CPU to compile, per program
def test_craftax_rollouts(craftax_pair):
    env, _ = craftax_pair
    check_rollouts(env, num_steps=5, short=2)


@pytest.fixture(scope="module")
def craftax_full():
    """The full game's adapter, craftax's own environment, and its jitted reset and step."""
    pytest.importorskip("craftax")
    from craftax.craftax_env import make_craftax_env_from_name

    from popeval.environments.suites import craftax_env

    ref = make_craftax_env_from_name("Craftax-Symbolic-v1", auto_reset=False)
    return craftax_env("Craftax-Symbolic-v1"), ref, jax.jit(ref.reset), jax.jit(ref.step)


@pytest.mark.slow  # the full game's step takes longer still to compile
def test_craftax_full_game_steps_as_craftax(craftax_full):
    """Every step from the adapter's own state and with the same key as craftax's step from that
    state: random play, then death (terminated) and craftax's time limit (truncated here)."""
    env, ref, ref_reset, ref_step = craftax_full
    ref_params = ref.default_params
    assert env.name == "Craftax-Symbolic-v1"
    assert env.default_params.max_steps_in_episode == ref_params.max_timesteps
    assert env.action_space().n == ref.num_actions
    obs, state = env.reset(jax.random.key(3))
    np.testing.assert_allclose(obs, ref_reset(jax.random.key(3), ref_params)[0], rtol=CRAFTAX_RTOL)
    rng = np.random.default_rng(3)
    for t in range(1, 9):
        action = jnp.int32(rng.integers(ref.num_actions))
        ref_obs, _, ref_reward, ref_done, _ = ref_step(jax.random.key(t), state.inner, action, ref_params)
        out = env.step_env(jax.random.key(t), state, action)
        check_step(out, ref_obs, ref_reward, bool(ref_done), bool(ref_done), False, CRAFTAX_RTOL)
        assert bool(env.observation_space().contains(out[0]))
        state = out[1]
    dead = state.inner.replace(player_health=jnp.zeros_like(state.inner.player_health))
    ref_obs, _, ref_reward, ref_done, _ = ref_step(jax.random.key(20), dead, jnp.int32(0), ref_params)
    assert bool(ref_done)
    check_step(env.step_env(jax.random.key(20), state.replace(inner=dead), jnp.int32(0)),
               ref_obs, ref_reward, True, True, False, CRAFTAX_RTOL)
    # Craftax's limit one step away: done there, a truncation here.
    ref_limit = ref_params.replace(max_timesteps=int(state.inner.timestep) + 1)
    ref_obs, _, ref_reward, ref_done, info = ref_step(jax.random.key(21), state.inner, jnp.int32(0), ref_limit)
    assert bool(ref_done) and float(info["discount"]) == 0.0
    limit = env.default_params.replace(max_steps_in_episode=int(state.time) + 1)
    check_step(env.step_env(jax.random.key(21), state, jnp.int32(0), limit),
               ref_obs, ref_reward, True, False, True, CRAFTAX_RTOL)
