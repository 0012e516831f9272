"""`RolloutWrapper`: the seed-compatible API, the fitness path and its equivalences.

Compilation dominates the cost (two programs per wrapper: fitness and trajectory), so the
registry sweep runs the default configuration (MLP policy, compaction on) on one environment
of each family by default and on every environment under `-m slow`, where the other
combinations (compaction off, random policy) run too; the other tests cover those
combinations on CartPole, Pendulum and FourRooms.

Reference semantics checked here (see `popeval/rollout.py`): an episode key splits into a
reset key and an episode key; step `t` uses `fold_in(episode_key, t)` split into a policy
key and an environment key; rewards after `done` are masked; `done` stays true;
`lengths` counts the steps up to and including the one that ended the episode.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import compiler, layouts, normalization
from popeval.environments import make, registered_envs
from popeval.policies import LSTMPolicy, MLPPolicy
from popeval.rollout import FitnessResult, RolloutWrapper
from tests.helpers import sweep

P, B = 12, 4  # population and episodes per member in the registry sweep (chunks of 16 and 8 members)


# ----------------------------------------------------------------------------- helpers
def both(wrapper, keys, pop_params, **kwargs):
    """`(population_fitness, population_rollout)` through the public methods.

    Two programs, as a user compiles them. (One outer `jax.jit` around both calls was seen to
    change the last bit of continuous-control returns: XLA then fuses, and contracts
    multiply-adds into FMAs, differently.)
    """
    return jax.device_get((
        wrapper.population_fitness(keys, pop_params, **kwargs),
        wrapper.population_rollout(keys, pop_params, **kwargs),
    ))


def episode_lengths(done):
    """Steps up to and including the first `done` (T where an episode never ends)."""
    done = np.asarray(done)
    return np.where(done.any(-1), done.argmax(-1) + 1, done.shape[-1])


def alive_mask(done):
    """True at the steps an episode takes before (and including) its first `done`."""
    t = np.arange(np.shape(done)[-1])
    return t < episode_lengths(done)[..., None]


def mlp_population(env, env_params, size, seed=1, **kwargs):
    """An `MLPPolicy` for `env` and `size` randomly initialised members (stacked)."""
    policy = MLPPolicy.for_env(env, env_params, **kwargs)
    keys = jax.random.split(jax.random.key(seed), size)
    return policy, init_population(lambda k: policy.init_params(k, env, env_params), keys)


def init_population(init, keys):
    """`init(key)` for every key, stacked: one program, compiled with popeval's options (quicker
    to compile than XLA's defaults; the same parameters, bit for bit)."""
    return jax.jit(jax.vmap(init), compiler_options=compiler.options())(keys)


def dummy_population(size):
    """`pop_params` for `model_forward=None` (only its leading axis matters)."""
    return {"unused": jnp.zeros((size,))}


def assert_fitness_matches_rollout(fit, traj, what, exact=True):
    """The fitness path's returns equal the trajectory path's (to the bit); lengths agree.

    `exact=False` allows the last bit: XLA on CPUs with FMA contracts multiply-adds per
    fusion, and the two paths are different programs with different fusions. Seen with a
    recurrent policy on Pendulum (1 ulp in ~15% of episodes); gone with
    `XLA_FLAGS=--xla_cpu_max_isa=AVX` (no FMA).
    """
    obs, action, reward, next_obs, done, cum_return = traj
    if exact:
        np.testing.assert_array_equal(fit.returns, cum_return, err_msg=f"{what}: fitness vs trajectory")
    else:
        np.testing.assert_allclose(fit.returns, cum_return, rtol=1e-6, err_msg=f"{what}: fitness vs trajectory")
    np.testing.assert_array_equal(fit.lengths, episode_lengths(done), err_msg=f"{what}: lengths")
    assert fit.returns.dtype == np.float32 and fit.lengths.dtype == np.int32, what
    # Masking: the return is the sum of the rewards up to the end of the episode.
    manual = np.where(alive_mask(done), reward, 0.0).sum(-1, dtype=np.float64)
    np.testing.assert_allclose(cum_return, manual, rtol=1e-5, atol=1e-5, err_msg=f"{what}: masked sum")
    assert not np.any(np.where(alive_mask(done), 0.0, reward)), f"{what}: reward after done"
    # `done` turns true at the episode's last step and stays true.
    t = np.arange(done.shape[-1])
    expected = done.any(-1)[..., None] & (t >= (episode_lengths(done) - 1)[..., None])
    np.testing.assert_array_equal(done, expected, err_msg=f"{what}: done must stay true")


# ----------------------------------------------------------------------------- seed API
class GymnaxNotebookMLP(nn.Module):
    """A flax MLP written like the gymnax notebook's: `apply(params, obs, rng)`."""

    @nn.compact
    def __call__(self, x, rng):
        x = nn.relu(nn.Dense(16)(x))
        return 2.0 * jnp.tanh(nn.Dense(1)(x))


@functools.cache
def pendulum_seed_api():
    network = GymnaxNotebookMLP()
    params = network.init(jax.random.PRNGKey(0), jnp.zeros(3), None)
    pop_params = jax.tree.map(
        lambda x: x[None] + 0.1 * jnp.arange(3.0).reshape((3,) + (1,) * x.ndim), params
    )
    manager = RolloutWrapper(network.apply, env_name="Pendulum-v1")
    keys = jax.random.split(jax.random.PRNGKey(1), 2)

    @jax.jit
    def run(keys, params, pop_params):
        return (
            manager.single_rollout(keys[0], params),
            manager.batch_rollout(keys, params),
            manager.population_rollout(keys, pop_params),
        )

    return manager, params, pop_params, keys, jax.device_get(run(keys, params, pop_params))


def test_seed_api_shapes_and_consistency():
    manager, params, pop_params, keys, (single, batch, pop) = pendulum_seed_api()
    assert manager.num_env_steps == 200  # defaults to max_steps_in_episode
    assert manager.input_shape == (3,)
    T = 200
    shapes = [(3,), (1,), (), (3,), ()]
    for out, lead in ((single, ()), (batch, (2,)), (pop, (3, 2))):
        assert len(out) == 6
        for x, s in zip(out[:5], shapes):
            assert x.shape == lead + (T,) + s
        assert out[5].shape == lead
    assert single[4].dtype == np.bool_ and single[2].dtype == np.float32
    # batch member 0 is the single rollout of key 0; population member 0 has params + 0.
    for a, b in zip(single, batch):
        np.testing.assert_allclose(a, b[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(batch, pop):
        np.testing.assert_allclose(a, b[0], rtol=1e-5, atol=1e-5)
    assert not np.allclose(pop[5][0], pop[5][1]), "members with different params must differ"
    # Observations chain: next_obs[t] == obs[t + 1]; returns are the sum of the T rewards.
    np.testing.assert_array_equal(single[3][:-1], single[0][1:])
    np.testing.assert_allclose(pop[5], pop[2].sum(-1, dtype=np.float64), rtol=1e-5)
    assert np.all(np.abs(single[1]) <= 2.0)
    # The action is the network's output for the observation the policy saw.
    np.testing.assert_allclose(
        single[1][:5], jax.vmap(lambda o: manager.model_forward(params, o, None))(single[0][:5]), rtol=1e-5
    )


def test_num_env_steps_honoured():
    manager, params, _, keys, (_, batch200, _) = pendulum_seed_api()
    short = RolloutWrapper(manager.model_forward, env_name="Pendulum-v1", num_env_steps=37)
    out = jax.device_get(short.batch_rollout(keys, params))
    assert short.num_env_steps == 37 and out[0].shape == (2, 37, 3) and out[5].shape == (2,)
    # Same key schedule: the 37 steps are the first 37 of the 200-step rollout.
    for a, b in zip(out[:5], batch200[:5]):
        np.testing.assert_allclose(a, b[:, :37], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[5], batch200[2][:, :37].sum(-1, dtype=np.float64), rtol=1e-5)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_env_steps"):
            RolloutWrapper(None, env_name="Pendulum-v1", num_env_steps=bad)
    # MinAtar has no time limit: rollouts default to the environment's practical cap.
    assert RolloutWrapper(None, env_name="Breakout-MinAtar").num_env_steps == 1000
    assert RolloutWrapper(None, env_name="Freeway-MinAtar").num_env_steps == 2501
    unbounded, _ = make("CartPole-v1")
    with pytest.raises(ValueError, match="num_env_steps"):  # no practical limit and no default
        RolloutWrapper(None, env=unbounded, env_params={"max_steps_in_episode": 2**31 - 1})


def test_masking_after_done_and_time_limit():
    """Random CartPole episodes end early; rewards after the end are masked, done stays true."""
    w = RolloutWrapper(None, env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 25},
                       num_env_steps=40, common_random_numbers=False, compaction=False)
    fit, traj = both(w, jax.random.split(jax.random.key(3), 16), dummy_population(2))
    obs, action, reward, next_obs, done, ret = traj
    lengths = episode_lengths(done)
    assert lengths.min() < 25 and lengths.max() == 25, "need terminated and truncated episodes"
    assert np.all(lengths <= 25), "the time limit (25) is honoured inside a 40-step rollout"
    np.testing.assert_array_equal(ret, lengths)  # CartPole: +1 per step, the last one included
    assert_fitness_matches_rollout(fit, traj, "CartPole random")
    # Trajectories freeze the state after the end: observations repeat the last one.
    last = np.broadcast_to(np.take_along_axis(next_obs, (lengths - 1)[..., None, None], axis=-2), next_obs.shape)
    after = ~alive_mask(done)
    assert after.any()
    np.testing.assert_array_equal(next_obs[after], last[after])
    np.testing.assert_array_equal(obs[after], last[after])


# ----------------------------------------------------------------------------- registry
def registry_setup(env_id):
    """(wrapper kwargs, env, params) with a short horizon for `env_id`."""
    env, params = make(env_id)
    limit = int(params.max_steps_in_episode)
    if limit > 100_000:  # MinAtar: no time limit
        return {"num_env_steps": 200}, env, params
    if limit > 100:
        env, params = make(env_id, max_steps_in_episode=100)
        return {"env_kwargs": {"max_steps_in_episode": 100}}, env, params
    return {}, env, params


@functools.cache
def registry_population(env_id):
    kwargs, env, params = registry_setup(env_id)
    return kwargs, mlp_population(env, params, P, hidden_sizes=(8,))


@pytest.mark.parametrize(
    "kind,compaction",
    [
        ("mlp", True),  # the default configuration
        pytest.param("mlp", False, marks=pytest.mark.slow),
        pytest.param("random", True, marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("env_id", sweep(registered_envs))
def test_fitness_equals_trajectory_on_every_env(env_id, kind, compaction):
    """Early exit (and compaction) == the fixed-length scan, to the bit, on every env.

    MLP members share `(B,)` keys (common random numbers); random-policy members get their
    own `(P, B)` keys. The two non-default combinations per env are marked slow (each
    combination compiles two programs per environment); random members without compaction
    add nothing the two cover (the keys' shape is handled before the layout).
    """
    kwargs, (policy, mlp_params) = registry_population(env_id)
    if kind == "mlp":
        w = RolloutWrapper(policy.apply, env_name=env_id, compaction=compaction, **kwargs)
        keys, pop = jax.random.split(jax.random.key(0), B), mlp_params
    else:
        w = RolloutWrapper(None, env_name=env_id, compaction=compaction, **kwargs)
        keys, pop = jax.random.split(jax.random.key(1), (P, B)), dummy_population(P)
    fit, traj = both(w, keys, pop)
    assert isinstance(fit, FitnessResult) and fit.obs_stats is None
    assert fit.returns.shape == (P, B) and traj[4].shape == (P, B, w.num_env_steps)
    assert_fitness_matches_rollout(fit, traj, f"{env_id} {kind} compaction={compaction}")
    if kind == "random":  # distinct keys: not every episode takes the same actions
        action = traj[1]
        assert not np.all(action == action[:1, :1]), f"{env_id}: random actions are all identical"


def test_small_populations_run_in_small_chunks():
    """Fewer members than a full chunk run in the power of two that holds them (at least
    `LANES` episodes), so a small population (or an evaluation of two policies) is not padded
    to ~256 episodes."""
    assert [layouts.chunk_members(2, n) for n in (1, 2, 3, 10, 64, 65, 256, 1000)] == [8, 8, 8, 16, 64, 128, 128, 128]
    assert [layouts.chunk_members(3, n) for n in (1, 5, 10, 37, 1000)] == [32, 32, 32, 64, 64]
    assert layouts.chunk_members(64, 2) == 2 and layouts.chunk_members(1024, 5) == 1
    typed = jax.random.split(jax.random.key(0), (300, 8))  # raw PRNGKeys make the same chunks
    for keys in (typed, jax.random.key_data(typed)):
        assert layouts._chunked(keys, jnp.zeros(300), layouts.CPU)[:2] == (32, 10)
    env, params = make("CartPole-v1")
    policy, pop = mlp_population(env, params, 10, seed=2, hidden_sizes=(8,))
    w = RolloutWrapper(policy.apply, env_name="CartPole-v1", devices=1)
    keys = jax.random.split(jax.random.key(4), 3)
    fit, traj = both(w, keys, pop)
    assert fit.returns.shape == (10, 3)
    assert_fitness_matches_rollout(fit, traj, "CartPole P=10 B=3")
    # Raw keys play the typed keys' episodes: test_common_random_numbers.


@pytest.mark.parametrize("env_id", [pytest.param("Acrobot-v1", marks=pytest.mark.slow), "CartPole-v1"])
def test_a_member_rounds_alike_in_every_population_size(env_id):
    """3 episodes a member: P=5, 37 and 200 run in chunks of 32, 64 and 64 members (every
    width a multiple of `LANES` episodes; chunks of 8 members, 24 episodes, rounded Acrobot's
    states differently): the first 5 members' trajectories are the
    same to the bit in each, and so are the 37 members' when the population is rotated. The
    fitness path too, 8 episodes a member in one chunk of 8 (P=5) and in two of 32 (P=64): returns,
    lengths and the observation statistics, which see every state (one chunk's reset once
    rounded Acrobot's initial states differently from a loop of chunks')."""
    env, params = make(env_id)
    policy, pop = mlp_population(env, params, 200, seed=3, hidden_sizes=(16,))
    w = RolloutWrapper(policy.apply, env_name=env_id, devices=1, common_random_numbers=False, num_env_steps=120)
    keys = jax.random.split(jax.random.key(5), (200, 3))
    first = lambda n: jax.tree.map(lambda x: x[:n], (keys, pop))  # noqa: E731
    full = w.population_rollout(*first(200))[0]
    for n in (5, 37):
        np.testing.assert_array_equal(np.asarray(w.population_rollout(*first(n))[0]), np.asarray(full[:n]), f"P={n}")
    rotated = jax.tree.map(lambda x: jnp.roll(x, 17, axis=0), first(37))
    np.testing.assert_array_equal(np.asarray(w.population_rollout(*rotated)[0]), np.roll(np.asarray(full[:37]), 17, 0))
    w = RolloutWrapper(policy.apply, env_name=env_id, devices=1, threads=1, num_env_steps=60, obs_normalization=True)
    keys = jax.random.split(jax.random.key(1), 8)
    full = jax.tree.map(np.asarray, w.population_fitness(keys, first(64)[1]))
    part = jax.tree.map(np.asarray, w.population_fitness(keys, first(5)[1]))
    for x, y in zip(jax.tree.leaves(part), jax.tree.leaves(full)):
        np.testing.assert_array_equal(x, y[:5], "fitness P=5")


def test_the_tail_runs_in_half_chunks_of_at_least_eight_members():
    assert layouts.widths(64) == (64, 32) and layouts.widths(16) == (16, 8)
    assert layouts.widths(8) == (8,) and layouts.widths(1) == (1,) and layouts.widths(64, compaction=False) == (64,)
    assert layouts.chunk_members(B, P) == 16  # the registry sweep runs both widths


@functools.cache
def default_run(env_id):
    """`(policy, pop, wrapper, keys, fitness)`: the default one-device `RolloutWrapper` on
    `env_id`, P=200 members with 16 hidden units, B=8 episode keys; computed once for the
    compaction and batching tests."""
    env, params = make(env_id)
    policy, pop = mlp_population(env, params, 200, seed=7, hidden_sizes=(16,))
    w = RolloutWrapper(policy.apply, env_name=env_id, devices=1)
    keys = jax.random.split(jax.random.key(11), 8)
    return policy, pop, w, keys, jax.device_get(w.population_fitness(keys, pop))


def test_compaction_cartpole():
    """P=200, B=8: seven chunks of 32 members (the last padded), compacted as members finish;
    fitness == trajectory == the fitness path without compaction, to the bit."""
    policy, pop, w, keys, fit = default_run("CartPole-v1")
    assert layouts.chunk_members(8) == 32 == layouts.chunk_members(8, 200)
    traj = jax.device_get(w.population_rollout(keys, pop))
    assert fit.returns.shape == (200, 8)
    assert_fitness_matches_rollout(fit, traj, "CartPole P=200 B=8")
    plain = RolloutWrapper(policy.apply, env_name="CartPole-v1", compaction=False, devices=1)
    plain = plain.population_fitness(keys, pop)
    np.testing.assert_array_equal(fit.returns, plain.returns)
    np.testing.assert_array_equal(fit.lengths, plain.lengths)
    # Members finish at very different times, so the passes do compact.
    member_lengths = np.sort(np.asarray(fit.lengths).max(axis=1))
    assert member_lengths[100] < 50 and member_lengths[-1] > 200, member_lengths
    # A step budget below the episode limit: chunks mix members at different step counts,
    # and those that used up the budget must stop counting while others run on. The episodes
    # are the full ones' first 60 steps (CartPole's rewards are ones: the sums are exact).
    short = RolloutWrapper(policy.apply, env_name="CartPole-v1", num_env_steps=60, devices=1)
    short = jax.device_get(short.population_fitness(keys, pop))
    reward, done = traj[2][..., :60], traj[4][..., :60]
    np.testing.assert_array_equal(short.lengths, episode_lengths(done))
    np.testing.assert_array_equal(short.returns, np.where(alive_mask(done), reward, 0.0).sum(-1))
    assert int(np.max(short.lengths)) == 60 and int(np.min(short.lengths)) < 60


@pytest.mark.parametrize("env_id,num_steps", [
    ("CartPole-v1", 61),
    pytest.param("Pendulum-v1", 67, marks=pytest.mark.slow),
    pytest.param("Breakout-MinAtar", 203, marks=pytest.mark.slow),
])
def test_the_accelerator_layout_gives_the_same_bits(env_id, num_steps, monkeypatch):
    """GPUs and TPUs run a device's members in one chunk that checks whether it may stop every
    8 steps (`layouts.ACCELERATOR`), CPUs in chunks of ~256 episodes that check every step
    (`layouts.CPU`). Each forced in turn on this platform: fitness == trajectory == the other
    layout, to the bit, with and without compaction, with a step budget that is no multiple of
    8 (members that used it up ride along for the rest of the 8 steps and must not count)."""
    assert layouts.for_platform("cpu") == layouts.CPU
    assert layouts.for_platform("gpu") == layouts.for_platform("tpu") == layouts.ACCELERATOR
    assert layouts.chunk_members(8, 37, None) == 64 and layouts.chunk_members(8, 4096, None) == 4096
    platform = jax.local_devices()[0].platform
    assert RolloutWrapper(None, env_name=env_id, devices=1).layout == layouts.for_platform(platform)
    env, params = make(env_id)
    policy, pop = mlp_population(env, params, 37, seed=8, hidden_sizes=(16,))
    keys = jax.random.split(jax.random.key(6), 4)

    def wrapper(layout, compaction=True):
        monkeypatch.setattr(layouts, "for_platform", lambda platform: layout)
        w = RolloutWrapper(policy.apply, env_name=env_id, num_env_steps=num_steps, compaction=compaction, devices=1)
        assert w.layout == layout
        return w

    cpu = jax.device_get(wrapper(layouts.CPU).population_fitness(keys, pop))
    lengths = np.asarray(cpu.lengths)
    early, budget = lengths.min() < num_steps, lengths.max() == num_steps
    assert (early, budget) == {"CartPole-v1": (True, True), "Pendulum-v1": (False, True),
                               "Breakout-MinAtar": (True, False)}[env_id], (env_id, lengths.min(), lengths.max())
    for compaction in (True, False):
        fit, traj = both(wrapper(layouts.ACCELERATOR, compaction), keys, pop)
        assert_fitness_matches_rollout(fit, traj, f"{env_id} accelerator layout compaction={compaction}")
        np.testing.assert_array_equal(fit.returns, cpu.returns, err_msg=f"{env_id}: accelerator vs CPU layout")
        np.testing.assert_array_equal(fit.lengths, cpu.lengths)


@pytest.mark.parametrize("env_id", ["CartPole-v1", pytest.param("Acrobot-v1", marks=pytest.mark.slow)])
def test_results_do_not_depend_on_how_members_are_batched(env_id):
    """A member's returns are the same bits whatever the other members are and wherever it
    sits in the population (which chunk and slot it runs in)."""
    policy, pop, w, keys, base = default_run(env_id)
    env, params = make(env_id)
    _, others = mlp_population(env, params, 200, seed=4, hidden_sizes=(16,))
    assert int(np.max(base.lengths)) > 100, "no long episode: the test would be too easy"
    perm = np.random.RandomState(0).permutation(200)
    shuffled = w.population_fitness(keys, jax.tree.map(lambda x: x[perm], pop))
    np.testing.assert_array_equal(shuffled.returns, np.asarray(base.returns)[perm])
    mixed = jax.tree.map(lambda a, b: a.at[::2].set(b[::2]), pop, others)  # odd members kept
    np.testing.assert_array_equal(w.population_fitness(keys, mixed).returns[1::2], base.returns[1::2])
    # Another population size runs other chunk fillings and passes: the same code on the same
    # shapes, but not the same bits everywhere (docs/exactness.md): at most 1% of episodes
    # may differ (seen: 1 episode of 400 of Acrobot's at P=100 of another population of 150).
    for n in (1, 100):  # P=5 against 64, to the bit: test_a_member_rounds_alike_in_every_population_size
        part = np.asarray(w.population_fitness(keys, jax.tree.map(lambda x: x[:n], pop)).returns)
        same = part == np.asarray(base.returns)[:n]
        assert same.mean() >= 0.99, f"P={n}: {np.sum(~same)} of {same.size} episodes differ"


# ----------------------------------------------------------------------------- key schedule
def reference_episodes(env, env_params, act, keys, pop_params, num_steps):
    """A plain Python loop over `step_env`, with the wrapper's documented key schedule, for
    every member `p` and episode key `keys[p, b]`: `[[(observations, return), ...], ...]`."""

    @jax.jit
    def step(params, key_episode, t, obs, state):
        key_policy, key_env = jax.random.split(jax.random.fold_in(key_episode, t))
        return env.step_env(key_env, state, act(params, obs, key_policy), env_params)

    out = []
    for p in range(keys.shape[0]):
        params = jax.tree.map(lambda x: x[p], pop_params)
        out.append([])
        for key in keys[p]:
            key_reset, key_episode = jax.random.split(key)
            obs, state = env.reset_env(key_reset, env_params)
            observations, total = [], 0.0
            for t in range(num_steps):
                observations.append(np.asarray(obs))
                obs, state, reward, done, _ = step(params, key_episode, t, obs, state)
                total += float(reward)
                if bool(done):
                    break
            out[-1].append((np.stack(observations), total))
    return out


@pytest.mark.parametrize("case", ["FourRooms-random", "Pendulum-noisy-mlp"])
def test_python_loop_reference(case):
    if case == "FourRooms-random":  # stochastic env (slips) and a random policy
        env, params = make("FourRooms-misc", max_steps_in_episode=60)
        w = RolloutWrapper(None, env_name="FourRooms-misc", env_kwargs={"max_steps_in_episode": 60},
                           env_params={"fail_prob": 0.5})
        params = params.replace(fail_prob=0.5)
        pop = dummy_population(2)

        def act(p, obs, key):
            return env.action_space(params).sample(key)

    else:  # the policy uses its key
        env, params = make("Pendulum-v1")
        policy, pop = mlp_population(env, params, 2, hidden_sizes=(8,))

        def act(p, obs, key):
            return policy.apply(p, obs, key) + 0.5 * jax.random.normal(key, (1,))

        w = RolloutWrapper(act, env_name="Pendulum-v1", num_env_steps=40, compaction=False)
    keys = jax.random.split(jax.random.key(5), (2, 2))
    fit, traj = both(w, keys, pop)
    assert_fitness_matches_rollout(fit, traj, case)
    reference = reference_episodes(env, params, act, keys, pop, w.num_env_steps)
    for p in range(2):
        for b in range(2):
            obs, total = reference[p][b]
            n = len(obs)
            assert fit.lengths[p, b] == n, (case, p, b)
            np.testing.assert_allclose(traj[0][p, b, :n], obs, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(fit.returns[p, b], total, rtol=1e-5, atol=1e-5)
    if case == "FourRooms-random":  # the env key matters: distinct keys give distinct paths
        assert len({traj[0][p, b].tobytes() for p in range(2) for b in range(2)}) == 4


# ----------------------------------------------------------------------------- env params
def stack_params(params, num_sets, **fields):
    """`num_sets` copies of `params` stacked on a leading axis, with `fields` set per copy."""
    batch = jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * num_sets), params)
    return batch.replace(**{k: jnp.asarray(v) for k, v in fields.items()})


def test_env_param_batch_cartpole_gravity():
    env, params = make("CartPole-v1")
    gravity = [9.8, 2.0, 30.0]
    batch = stack_params(params, 3, gravity=gravity)
    meta = RolloutWrapper(None, env_name="CartPole-v1", env_params=batch, num_env_steps=200,
                          common_random_numbers=False)
    keys = jax.random.split(jax.random.key(2), 8)
    fit, traj = both(meta, keys, dummy_population(3))
    assert fit.returns.shape == (3, 3, 8) and fit.lengths.shape == (3, 3, 8)
    assert traj[0].shape == (3, 3, 8, 200, 4) and traj[5].shape == (3, 3, 8)
    assert_fitness_matches_rollout(fit, traj, "CartPole gravity batch")
    assert fit.lengths[:, 1].mean() > fit.lengths[:, 0].mean() > fit.lengths[:, 2].mean(), (
        "weaker gravity must keep a randomly pushed pole up longer"
    )
    single = RolloutWrapper(None, env_name="CartPole-v1", env_params={"gravity": gravity[0]},
                            num_env_steps=200, common_random_numbers=False)
    for m, g in enumerate(gravity):
        got = single.population_fitness(keys, dummy_population(3), env_params=params.replace(gravity=g))
        np.testing.assert_array_equal(got.lengths, fit.lengths[:, m])
        np.testing.assert_array_equal(got.returns, fit.returns[:, m])


def test_env_param_batch_pendulum_mass():
    env, params = make("Pendulum-v1")
    mass = [0.5, 1.0, 2.0]
    policy, pop = mlp_population(env, params, 2, hidden_sizes=(8,))
    meta = RolloutWrapper(policy.apply, env_name="Pendulum-v1", env_params=stack_params(params, 3, m=mass),
                          num_env_steps=50)
    keys = jax.random.split(jax.random.key(4), 3)
    fit = jax.device_get(meta.population_fitness(keys, pop))
    assert fit.returns.shape == (2, 3, 3)
    singles = [RolloutWrapper(policy.apply, env_name="Pendulum-v1", env_params={"m": m}, num_env_steps=50)
               for m in mass]
    for m, w in enumerate(singles):
        got = w.population_fitness(keys, pop)
        np.testing.assert_allclose(got.returns, fit.returns[:, m], rtol=1e-5)
    assert not np.allclose(fit.returns[:, 0], fit.returns[:, 2]), "the mass must matter"
    with pytest.raises(ValueError, match="leading axis"):
        bad = params.replace(m=jnp.asarray(mass))  # only one leaf batched
        meta.population_fitness(keys, pop, env_params=bad)


# ----------------------------------------------------------------------------- keys
@functools.cache
def random_cartpole(crn):
    return RolloutWrapper(None, env_name="CartPole-v1", common_random_numbers=crn)


def test_common_random_numbers():
    pop = dummy_population(4)
    keys = jax.random.split(jax.random.key(9), 3)
    crn = random_cartpole(True).population_fitness(keys, pop)
    assert crn.returns.shape == (4, 3)
    assert np.all(crn.returns == crn.returns[:1]), "CRN: identical members, identical returns"
    assert len(set(np.asarray(crn.returns[0]).tolist())) > 1, "the B episodes differ"
    # Old-style uint32 keys give the same episodes as typed keys.
    raw = random_cartpole(True).population_fitness(jax.random.split(jax.random.PRNGKey(9), 3), pop)
    np.testing.assert_array_equal(raw.returns, crn.returns)

    indep = random_cartpole(False).population_fitness(keys, pop)
    assert not np.all(indep.returns == indep.returns[:1]), "without CRN members see other episodes"
    folded = jax.vmap(lambda p: jax.vmap(lambda k: jax.random.fold_in(k, p))(keys))(jnp.arange(4))
    np.testing.assert_array_equal(random_cartpole(True).population_fitness(folded, pop).returns, indep.returns)

    # (P, B) keys are used as given.
    other = jax.random.split(jax.random.key(10), 3)
    given = jnp.stack([keys, keys, other, other])
    out = random_cartpole(False).population_fitness(given, pop).returns
    np.testing.assert_array_equal(out[0], crn.returns[0])
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[2], out[3])
    assert not np.array_equal(out[0], out[2])


# ----------------------------------------------------------------------------- recurrence
def test_lstm_policy():
    env, params = make("CartPole-v1")
    policy = LSTMPolicy.for_env(env, params, hidden_size=8)
    pop = init_population(lambda k: policy.init_params(k, env, params), jax.random.split(jax.random.key(0), 4))
    w = RolloutWrapper(policy.apply, env_name="CartPole-v1", init_carry=policy.initialize_carry(),
                       num_env_steps=120)
    assert w.recurrent
    fit, traj = both(w, jax.random.split(jax.random.key(1), 3), pop)
    assert fit.returns.shape == (4, 3) and traj[1].shape == (4, 3, 120) and traj[1].dtype == np.int32
    assert_fitness_matches_rollout(fit, traj, "LSTM CartPole")


def test_recurrent_carry_is_threaded():
    """A policy whose action is scale * (its step counter): the carry counts up, then freezes."""

    def counting(params, obs, count, key):
        return params["scale"] * count.astype(jnp.float32)[None], count + 1

    w = RolloutWrapper(counting, env_name="Pendulum-v1", env_kwargs={"max_steps_in_episode": 8},
                       num_env_steps=12, init_carry=jnp.int32(5))
    scale = jnp.asarray([0.01, 0.02, 0.05], jnp.float32)
    fit, traj = both(w, jax.random.split(jax.random.key(0), 2), {"scale": scale})
    assert_fitness_matches_rollout(fit, traj, "counting policy", exact=False)  # see the helper
    np.testing.assert_array_equal(fit.lengths, 8)
    count = 5 + np.minimum(np.arange(12), 8)  # frozen after the episode ends at step 8
    expected = np.asarray(scale)[:, None, None] * count.astype(np.float32)
    np.testing.assert_allclose(traj[1][..., 0], np.broadcast_to(expected, (3, 2, 12)), rtol=1e-6)


# ----------------------------------------------------------------------------- normalisation
def test_observation_normalisation():
    """The policy sees normalised observations; the fitness path returns per-member statistics
    of exactly the observations seen while alive (episodes of different lengths)."""

    def lean(params, x, key):  # push towards the side the (normalised) pole leans to
        return (params["gain"] * x[2] + x[3] + params["bias"] > 0).astype(jnp.int32)

    w = RolloutWrapper(lean, env_name="CartPole-v1", num_env_steps=60, obs_normalization=True)
    pop = {"gain": jnp.asarray([1.0, 3.0, 0.5]), "bias": jnp.asarray([0.0, 0.05, 3.0])}
    keys = jax.random.split(jax.random.key(6), 4)
    stats = normalization.ObsStats(
        count=jnp.float32(10.0),
        mean=jnp.asarray([0.1, -0.2, 0.01, 0.02], jnp.float32),
        m2=jnp.asarray([2.5, 40.0, 0.1, 1.0], jnp.float32),  # var = [0.25, 4, 0.01, 0.1]
    )
    for given in (stats, normalization.init((4,))):
        fit, traj = both(w, keys, pop, obs_stats=given)
        assert_fitness_matches_rollout(fit, traj, "obs normalisation")
        obs, action, done = traj[0], traj[1], traj[4]
        lengths = episode_lengths(done)
        assert lengths.min() < 20 and lengths.max() == 60, "need short and long episodes"
        # The policy saw (obs - mean) / std (the identity for empty statistics) ...
        z = np.asarray(jax.vmap(normalization.normalize, in_axes=(None, 0))(given, obs.reshape(-1, 4)))
        score = np.asarray(pop["gain"])[:, None, None] * z.reshape(obs.shape)[..., 2] + z.reshape(obs.shape)[..., 3]
        score = score + np.asarray(pop["bias"])[:, None, None]
        expected = (score > 0).astype(np.int32)
        assert np.all((action == expected) | (np.abs(score) < 1e-4)), "policy input is not the normalised obs"
        # ... and the statistics count each observation an alive episode saw, once.
        s = fit.obs_stats
        assert s.count.shape == (3,) and s.mean.shape == (3, 4) and s.m2.shape == (3, 4)
        alive = alive_mask(done)
        np.testing.assert_array_equal(s.count, lengths.sum(-1))
        for p in range(3):
            member = jax.tree.map(lambda x: x[p], s)  # `.var` is defined for one set of stats
            seen = obs[p][alive[p]].astype(np.float64)
            np.testing.assert_allclose(member.mean, seen.mean(0), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(member.var, seen.var(0), rtol=1e-4, atol=1e-5)
        merged = normalization.merge_stacked(s)
        seen = obs[alive].astype(np.float64)
        np.testing.assert_allclose(merged.count, len(seen))
        np.testing.assert_allclose(merged.mean, seen.mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(merged.var, seen.var(0), rtol=1e-4, atol=1e-5)
    # Normalisation changed the episodes; no obs_stats means empty statistics (the identity).
    assert not np.array_equal(both(w, keys, pop, obs_stats=stats)[0].lengths, fit.lengths)
    np.testing.assert_array_equal(w.population_fitness(keys, pop).returns, fit.returns)


# ----------------------------------------------------------------------------- bad input
def test_bad_input_errors():
    env, params = make("CartPole-v1")
    policy, pop = mlp_population(env, params, 3, hidden_sizes=(4,))
    w = RolloutWrapper(policy.apply, env_name="CartPole-v1", num_env_steps=5)
    keys = jax.random.split(jax.random.key(0), 2)
    mixed = jax.tree.map(lambda x: x, pop)
    mixed["params"]["Dense_0"]["bias"] = mixed["params"]["Dense_0"]["bias"][:2]
    with pytest.raises(ValueError, match="leading .*axis P"):
        w.population_fitness(keys, mixed)
    with pytest.raises(ValueError, match=r"\(2, 3\).*uint32"):
        w.population_fitness(jnp.zeros((2, 3), jnp.uint32), pop)
    with pytest.raises(ValueError, match=r"population size P=3"):
        w.population_rollout(jax.random.split(jax.random.key(0), (4, 2)), pop)
    with pytest.raises(ValueError, match="single_rollout takes one key"):
        w.single_rollout(keys, jax.tree.map(lambda x: x[0], pop))
    with pytest.raises(ValueError, match="Discrete"):
        RolloutWrapper(lambda p, o, k: jnp.float32(0.5), env_name="CartPole-v1", num_env_steps=5
                       ).population_fitness(keys, dummy_population(3))
    with pytest.raises(ValueError, match=r"shape \(3,\).*Box.*\(1,\)"):
        RolloutWrapper(lambda p, o, k: jnp.zeros(3), env_name="Pendulum-v1", num_env_steps=5
                       ).population_rollout(keys, dummy_population(3))


def test_nan_policy_gives_nan_returns():
    """A diverging policy is not an error: its returns are NaN (the evolve loop ranks them last)."""
    w = RolloutWrapper(lambda p, o, k: jnp.full((1,), jnp.nan) * p["w"], env_name="Pendulum-v1",
                       num_env_steps=5)
    fit = w.population_fitness(jax.random.split(jax.random.key(0), 2), {"w": jnp.ones(3)})
    assert np.all(np.isnan(fit.returns)) and np.all(fit.lengths == 5)


# ----------------------------------------------------------------------------- external envs
def test_external_gymnax_environment():
    genv, gparams = gymnax.make("CartPole-v1")

    def heuristic_or_left(params, obs, key):
        balance = (obs[2] + obs[3] > 0).astype(jnp.int32)  # keeps the pole up for long
        return jnp.where(params["mode"] > 0, balance, 0).astype(jnp.int32)

    pop = {"mode": jnp.asarray([1, 0])}
    keys = jax.random.split(jax.random.key(0), 3)
    ours = RolloutWrapper(heuristic_or_left, env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 20},
                          num_env_steps=30)
    theirs = RolloutWrapper(heuristic_or_left, env=genv, env_params={"max_steps_in_episode": 20},
                            num_env_steps=30)
    assert theirs.obs_shape == (4,) and theirs.num_env_steps == 30
    results = []
    for w in (ours, theirs):
        fit, traj = both(w, keys, pop)
        assert traj[0].shape == (2, 3, 30, 4) and fit.returns.shape == (2, 3)
        assert_fitness_matches_rollout(fit, traj, w.env_name)
        # gymnax 1.0's raw `step_env` has no time limit: the wrapper's `time` check ends these.
        np.testing.assert_array_equal(fit.lengths[0], 20)
        assert np.all(fit.lengths[1] < 20) and np.all(traj[4][1, :, -1])  # pushed over: ends early
        np.testing.assert_array_equal(fit.returns, fit.lengths)
        results.append(traj)
    # Same dynamics and the same reset distribution drawn from the same keys (observed with
    # gymnax 1.0.1): the same episodes.
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(results[0][-1], results[1][-1])


# ----------------------------------------------------------------------------- tracing
def test_no_retrace_and_no_mutation():
    traces = []

    def counted(params, obs, key):
        traces.append(1)  # runs at trace time only
        return (params["w"] @ obs > 0).astype(jnp.int32)

    w = RolloutWrapper(counted, env_name="CartPole-v1", num_env_steps=50)
    attrs = dict(vars(w))
    pop = {"w": jax.random.normal(jax.random.key(0), (3, 4))}
    first = w.population_fitness(jax.random.split(jax.random.key(1), 2), pop)
    n = len(traces)
    assert n > 0
    second = w.population_fitness(jax.random.split(jax.random.key(2), 2), {"w": -pop["w"]})
    assert len(traces) == n, "a second call with the same shapes must not retrace"
    assert not np.array_equal(first.returns, second.returns) or not np.array_equal(first.lengths, second.lengths)
    assert vars(w).keys() == attrs.keys() and all(vars(w)[k] is v for k, v in attrs.items())


# ------------------------------------------------------------------ what model_forward must be
def test_model_forward_of_the_wrong_shape_is_explained():
    import flax.linen as nn

    class Plain(nn.Module):  # __call__(self, x): no key argument
        @nn.compact
        def __call__(self, x):
            return jnp.argmax(nn.Dense(2)(x)).astype(jnp.int32)

    net = Plain()
    params = net.init(jax.random.key(0), jnp.zeros(4))
    keys = jax.random.split(jax.random.key(1), 2)
    with pytest.raises(TypeError, match=r"model_forward\(params, obs, key\) -> action"):
        RolloutWrapper(net.apply, env_name="CartPole-v1", num_env_steps=5).batch_rollout(keys, params)
    for bad in (lambda p, o, k: (jnp.int32(0), jnp.int32(1)), lambda p, o, k: None):
        with pytest.raises(ValueError, match="action"):
            RolloutWrapper(bad, env_name="CartPole-v1", num_env_steps=5).batch_rollout(keys, params)


def test_methods_compile_with_popevals_options_and_run_inside_other_programs():
    """Called from Python, the methods compile with `compiler.options()` (as the evolve loop's
    programs do): Acrobot's returns equal those of a program compiled with those options (at
    XLA's defaults 2 of these 128 episodes ended differently on a 2-core x86 machine). Inside
    `jit` (traced or constant arguments), `vmap` and `grad` they are inlined, not refused."""
    env, params = make("Acrobot-v1")
    policy, pop = mlp_population(env, params, 32, seed=0, hidden_sizes=(8,))
    w = RolloutWrapper(policy.apply, env_name="Acrobot-v1", devices=1)
    keys = jax.random.split(jax.random.key(1), 4)
    direct = np.asarray(w.population_fitness(keys, pop).returns)
    fit = lambda k, p: w.population_fitness(k, p).returns  # noqa: E731
    # Traced arguments: inlined into a program compiled with popeval's options.
    np.testing.assert_array_equal(direct, jax.jit(fit, compiler_options=compiler.options())(keys, pop))
    # Constant arguments inside a trace: inlined too, and at your program's options (here XLA's
    # defaults) a chaotic episode may end elsewhere.
    inlined = jax.jit(lambda: fit(keys, pop))()
    assert inlined.shape == direct.shape and np.mean(np.asarray(inlined) == direct) > 0.9
    one = compiler.jit(lambda x: jnp.sin(x) * 2.0)
    x = jnp.arange(3.0)
    np.testing.assert_allclose(jax.vmap(one)(x), one(x))
    np.testing.assert_allclose(jax.grad(lambda x: one(x).sum())(x), 2.0 * jnp.cos(x), rtol=1e-6)


def test_the_kernel_in_a_program_of_its_own_equals_the_wrapper_s_methods():
    """`RolloutWrapper.kernel` (`popeval.evaluate`), jitted by the caller, plays the episodes the
    host methods play, bit for bit: returns, lengths and observation statistics, trajectories
    (compiled with popeval's options, as the methods are)."""
    jit = functools.partial(jax.jit, compiler_options=compiler.options())
    env, env_params = make("Acrobot-v1")
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(8,))
    manager = RolloutWrapper(policy.apply, env=env, env_params=env_params, num_env_steps=60, obs_normalization=True,
                             devices=1)
    members = jax.vmap(lambda k: policy.init_params(k, env, env_params))(jax.random.split(jax.random.key(0), 3))
    keys = jax.random.split(jax.random.key(1), (3, 2))
    stats = normalization.init(manager.obs_shape)
    ours = jit(lambda k, p, s: manager.kernel.fitness(k, p, manager.env_params, s))(keys, members, stats)
    theirs = manager.population_fitness(keys, members, obs_stats=stats)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(a, b)
    ours = jit(lambda k, p, s: manager.kernel.trajectories(k, p, manager.env_params, s))(keys, members, stats)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(manager.population_rollout(keys, members, obs_stats=stats))):
        np.testing.assert_array_equal(a, b)
