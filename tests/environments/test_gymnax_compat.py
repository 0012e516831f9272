"""gymnax users' code on popeval environments (issue #18, "A drop-in for gymnax users").

What runs unchanged, checked against the installed gymnax (1.x) and evosax:
- gymnax's own wrappers (Gym, vector Gym, dm_env, LogWrapper, StickyActionWrapper,
  FlattenObservationWrapper) wrap every registered environment through
  `SixValueStep(env, gymnax_spaces=True)` and step it through an auto-reset (the vector
  Gym wrapper resets every environment and steps one per family);
- gymnax 1.0's getting-started notebook, with `gymnax.make` pointed at popeval, gives
  gymnax's own numbers on Pendulum-v1, and `SixValueStep` steps classic control as gymnax
  does (to float32 rounding) from the same key, state and action;
- evosax's `GymnaxProblem` evaluates popeval's environments (MinAtar included) with its
  default settings under `make(env_id, compat="gymnax")`;
- eager `step`/`reset` equal `jax.jit`'s bit for bit, and gymnax's dm_env wrapper test passes.

Skipped without gymnax (a test extra: popeval never imports it).
"""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gymnax = pytest.importorskip("gymnax")
pytest.importorskip("gymnasium")  # gymnax's Gym wrappers; imported below, after the skips
from gymnax import wrappers as gymnax_wrappers
from gymnax.environments import spaces as gymnax_spaces

from popeval.environments import SixValueStep, make, registered_envs, spaces
from popeval.environments.wrappers import to_gymnax_space
from tests.helpers import subprocess_env, sweep

SHORT = 3  # an episode limit that makes a few steps include an auto-reset
SIX_INFO_KEYS = {"discount", "terminated", "truncated", "final_observation"}
#: One environment per family, for the checks of mechanisms the base class gives all alike.
FAMILY = {"Pendulum-v1", "Catch-bsuite", "FourRooms-misc", "FrozenLake-misc", "Breakout-MinAtar"}
CLASSIC_CONTROL = ["CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"]


pytestmark = pytest.mark.usefixtures("fast_compilation")


def gymnax_make(env_id: str, **kwargs):
    """What `gymnax.make` becomes for a gymnax user: popeval's gymnax variant of the id,
    with gymnax's six-value step and space classes."""
    env, params = make(env_id, compat="gymnax", **kwargs)
    return SixValueStep(env, gymnax_spaces=True), params


@functools.cache
def cached(env_id: str) -> SimpleNamespace:
    """One environment object per id for the whole module, so its per-object jitted
    functions compile once and serve every test."""
    env, params = make(env_id)
    six = SixValueStep(env, gymnax_spaces=True)
    return SimpleNamespace(env=env, params=params, short=params.replace(max_steps_in_episode=SHORT), six=six)


def assert_trees_equal(actual, expected, what: str, rtol: float = 0.0) -> None:
    """Same structure, shapes, dtypes and bits (values within `rtol` when it is given)."""
    a_leaves, a_tree = jax.tree.flatten(actual)
    e_leaves, e_tree = jax.tree.flatten(expected)
    assert a_tree == e_tree, f"{what}: {a_tree} != {e_tree}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape and a.dtype == e.dtype, f"{what} leaf {i}: {a.shape} {a.dtype} != {e.shape} {e.dtype}"
        if rtol:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol, err_msg=f"{what} leaf {i}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{what} leaf {i}")


def is_discrete(env, params) -> bool:
    return isinstance(env.action_space(params), spaces.Discrete)


# ----------------------------------------------------------------------------- the module


@pytest.mark.slow  # the same checks run in the default tier in tests/project/test_imports.py
def test_popeval_imports_without_gymnax():
    """Importing popeval (and the wrapper module) loads neither gymnax nor gymnasium; the
    gymnax spaces are imported on their first use only."""
    code = (
        "import sys\n"
        "import popeval, popeval.environments\n"
        "from popeval.environments import SixValueStep, make\n"
        "from popeval.environments.wrappers import to_gymnax_space\n"
        "env = SixValueStep(make('CartPole-v1')[0])\n"
        "env.observation_space(); env.action_space()\n"
        "assert 'gymnax' not in sys.modules and 'gymnasium' not in sys.modules, sorted(sys.modules)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_to_gymnax_space_without_gymnax_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnax", None)  # makes `import gymnax...` raise
    monkeypatch.setitem(sys.modules, "gymnax.environments", None)
    with pytest.raises(ImportError, match="needs gymnax"):
        to_gymnax_space(spaces.Discrete(3))
    monkeypatch.undo()
    with pytest.raises(TypeError, match="not a popeval"):
        to_gymnax_space("Box")


def test_to_gymnax_space_keeps_size_bounds_shape_dtype():
    for env_id in registered_envs:
        c = cached(env_id)
        env, params = c.env, c.short
        obs, state = env.reset(jax.random.key(0), params)
        for space in (env.observation_space(params), env.action_space(params)):
            converted = to_gymnax_space(space)
            if isinstance(space, spaces.Discrete):
                assert isinstance(converted, gymnax_spaces.Discrete), env_id
                assert (converted.n, converted.dtype) == (space.n, space.dtype), env_id
            else:
                assert isinstance(converted, gymnax_spaces.Box), env_id
                assert (converted.shape, converted.dtype) == (space.shape, space.dtype), env_id
                np.testing.assert_array_equal(converted.low, space.low)
                np.testing.assert_array_equal(converted.high, space.high)
        state_space = to_gymnax_space(env.state_space(params))
        assert isinstance(state_space, gymnax_spaces.Dict), env_id
        assert set(state_space.spaces) == {f.name for f in dataclasses.fields(state)}, env_id
        if env_id in FAMILY:  # (eager `contains` is many small programs; the Gym test checks obs)
            assert bool(to_gymnax_space(env.observation_space(params)).contains(obs)), env_id
            assert bool(state_space.contains(state)), env_id
    # a state that carries its own PRNG key: gymnax has no key space; popeval's is kept
    keyed = to_gymnax_space(spaces.Dict({"key": spaces.Key(), "x": spaces.Box(0, 1, (2,))}))
    assert isinstance(keyed.spaces["key"], spaces.Key) and isinstance(keyed.spaces["x"], gymnax_spaces.Box)
    state = SimpleNamespace(key=jax.random.key(0), x=jnp.zeros(2))
    assert bool(keyed.contains(state)) and not bool(keyed.contains(SimpleNamespace(key=jnp.zeros(()), x=jnp.zeros(2))))


def test_six_value_step_api():
    """The attributes gymnax 1.x code reads, and `step_env`'s natural-termination flag."""
    c = cached("CartPole-v1")
    six = SixValueStep(c.env)  # popeval's spaces by default
    assert (six.name, six.num_actions, six.default_params) == ("CartPole-v1", 2, c.params)
    assert isinstance(six.action_space(), spaces.Discrete) and isinstance(six.state_space(), spaces.Dict)
    assert isinstance(c.six.action_space(c.params), gymnax_spaces.Discrete)
    assert isinstance(c.six.observation_space(c.params), gymnax_spaces.Box)
    assert six.unwrapped is c.env  # anything else is the environment's own
    key = jax.random.key(0)
    obs, state = six.reset_env(key, c.params)
    assert_trees_equal((obs, state), c.env.reset(key, c.params), "reset_env")
    # a pole past its angle limit: the natural end, not the time limit
    state = state.replace(theta=jnp.float32(0.5), time=jnp.int32(SHORT - 1))
    obs, next_state, _, terminated, info = six.step_env(key, state, 1, c.short)
    assert bool(terminated) and bool(info["truncated"]) and float(info["discount"]) == 0.0
    assert bool(six.is_truncated(next_state, c.short)) and not bool(six.is_truncated(state, c.short))
    _, _, _, terminated, truncated, info = six.step(key, state, 1, c.short)
    assert bool(terminated) and bool(truncated) and set(info) == SIX_INFO_KEYS
    np.testing.assert_array_equal(info["final_observation"], obs)  # before the auto-reset


# ----------------------------------------------------------------------------- (a) wrappers


@pytest.mark.parametrize("env_id", sweep(registered_envs))
def test_gymnax_gym_wrapper(env_id):
    """`GymnaxToGymWrapper` plays an episode through its auto-reset and a re-seeded reset;
    each step is `SixValueStep.step`'s with the wrapper's key, bit for bit (its deep copy
    of the environment shares the compiled step)."""
    c = cached(env_id)
    gym_env = gymnax_wrappers.GymnaxToGymWrapper(c.six, c.short, seed=7)
    obs_space = c.env.observation_space(c.short)
    obs, _ = gym_env.reset(seed=3)
    assert np.shape(obs) == obs_space.shape and gym_env.observation_space.contains(np.asarray(obs))
    ends = 0
    for t in range(SHORT + 2):
        key, state = gym_env.key, gym_env.env_state
        action = gym_env.action_space.sample()
        obs, reward, terminated, truncated, info = gym_env.step(action)
        expected = c.six.step(jax.random.split(key)[1], state, action, c.short)
        got = (obs, gym_env.env_state, reward, terminated, truncated, info)
        assert_trees_equal(got, expected, f"{env_id} step {t}")
        space = gym_env.observation_space
        assert space.contains(np.asarray(obs)), f"{env_id}: {obs} outside {space}"
        assert set(info) == SIX_INFO_KEYS and np.shape(info["final_observation"]) == obs_space.shape
        if not (terminated or truncated):
            np.testing.assert_array_equal(info["final_observation"], obs)
        ends += bool(terminated or truncated)
    assert ends >= 1, f"{env_id}: no episode ended within {SHORT + 2} steps at a {SHORT}-step limit"
    obs, _ = gym_env.reset(seed=3)
    assert gym_env.observation_space.contains(np.asarray(obs)) and int(gym_env.env_state.time) == 0


@pytest.mark.parametrize("env_id", sweep(registered_envs))
def test_gymnax_vector_gym_wrapper(env_id):
    """`GymnaxToVectorGymWrapper` batches 3 copies of every environment: batched Gym spaces
    that hold the reset observations. One environment per family also steps until every
    copy's episode has ended by the limit (stepping is `jax.vmap` of `SixValueStep.step`,
    which the functional-wrapper test runs for every environment)."""
    c = cached(env_id)
    vec = gymnax_wrappers.GymnaxToVectorGymWrapper(c.six, num_envs=3, params=c.short, seed=1)
    obs, _ = vec.reset(seed=0)
    shape = (3, *c.env.observation_space(c.short).shape)
    assert np.shape(obs) == shape and vec.observation_space.contains(np.asarray(obs))
    assert vec.action_space.shape == (3, *c.env.action_space(c.short).shape)
    if env_id not in FAMILY:
        return
    ended = np.zeros(3, bool)
    for _ in range(SHORT + 1):
        obs, reward, terminated, truncated, info = vec.step(vec.action_space.sample())
        assert np.shape(obs) == shape and np.shape(reward) == (3,) and vec.observation_space.contains(np.asarray(obs))
        assert np.shape(info["final_observation"]) == shape
        ended |= np.asarray(terminated | truncated)
    assert ended.all(), f"{env_id}: {ended}"


@pytest.mark.parametrize("env_id", sweep(registered_envs))
def test_gymnax_functional_wrappers(env_id):
    """dm_env(LogWrapper(FlattenObservationWrapper(StickyActionWrapper(env)))), vmapped
    over 2 episodes: flat observations, LogWrapper's returns accumulate and are reported
    when an episode ends, the sticky action is recorded. `StickyActionWrapper` refuses a
    continuous action space, as for gymnax's own environments."""
    c = cached(env_id)
    inner = c.six
    if is_discrete(c.env, c.short):
        inner = gymnax_wrappers.StickyActionWrapper(inner, sticky_action_prob=0.25)
    else:
        with pytest.raises(ValueError, match="Discrete"):
            gymnax_wrappers.StickyActionWrapper(inner, sticky_action_prob=0.25)
    flat = gymnax_wrappers.FlattenObservationWrapper(inner)
    obs_space = c.env.observation_space(c.short)
    size = int(np.prod(obs_space.shape))
    if isinstance(obs_space, spaces.Box):
        assert flat.observation_space(c.short).shape == (size,)
    else:  # FrozenLake's Discrete observations (gymnax's own FrozenLake is the same)
        with pytest.raises(AssertionError):
            flat.observation_space(c.short)
    env = gymnax_wrappers.GymnaxToDmEnvWrapper(gymnax_wrappers.LogWrapper(flat))
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))  # traced once, not at every call
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    action_space, rng = c.env.action_space(c.short), np.random.default_rng(0)

    def sample(keys):  # two actions, drawn without compiling a sampler
        if isinstance(action_space, spaces.Discrete):
            return rng.integers(0, action_space.n, size=2).astype(np.int32)
        low, high = np.asarray(action_space.low), np.asarray(action_space.high)
        return rng.uniform(low, high, (2, *action_space.shape)).astype(np.float32)
    timestep = reset(jax.random.split(jax.random.key(0), 2), c.short)
    # gymnax's dm_env `reset` gives a weakly typed reward (`jnp.array(0.0)`), `step` the
    # environment's float32; matching them spares JAX a second compile of `step`.
    timestep = timestep.replace(reward=timestep.reward.astype(jnp.float32))
    assert timestep.observation.shape == (2, size)
    running, length = np.zeros(2, np.float32), np.zeros(2, np.int32)
    for t in range(SHORT + 2):
        keys = jax.random.split(jax.random.key(t + 1), 2)
        timestep = step(keys, timestep, sample(keys), c.short)
        log = timestep.state
        assert timestep.observation.shape == timestep.final_observation.shape == (2, size)
        assert np.isin(np.asarray(timestep.discount), (0.0, 1.0)).all()
        running, length = running + np.asarray(timestep.reward, np.float32), length + 1
        ended = np.asarray(log.episode_lengths) == 0
        np.testing.assert_allclose(np.asarray(log.returned_episode_returns)[ended], running[ended], rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(log.returned_episode_lengths)[ended], length[ended])
        np.testing.assert_allclose(np.asarray(log.episode_returns)[~ended], running[~ended], rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(log.episode_lengths)[~ended], length[~ended])
        running[ended], length[ended] = 0.0, 0
        if is_discrete(c.env, c.short):
            executed = np.asarray(log.env_state.last_action)
            assert ((executed >= 0) & (executed < c.env.num_actions)).all()
    assert np.asarray(log.returned_episode_valid).all(), f"{env_id}: an episode did not end at the {SHORT}-step limit"


# ----------------------------------------------------------------------------- (b) six values


def getting_started(make, manager: bool = True):
    """gymnax 1.0's examples/00_getting_started.ipynb, cell by cell, with `make` for
    `gymnax.make` (the Visualizer cell excepted; `manager=False` leaves out the cells of
    `gymnax.experimental.RolloutWrapper`). Returns what the cells compute."""
    from flax import linen as nn
    from gymnax.experimental import RolloutWrapper

    out = {}
    key = jax.random.key(0)
    key, key_reset, key_policy, key_step = jax.random.split(key, 4)
    env, env_params = make("Pendulum-v1")

    obs, state = env.reset(key_reset, env_params)
    out["reset"] = obs
    action = env.action_space(env_params).sample(key_policy)
    obs, state, reward, terminated, truncated, _ = env.step(key_step, state, action, env_params)
    done = terminated | truncated
    out["step"] = (obs, reward, terminated, truncated, done)

    obs, state = env.reset(key_reset)
    action = env.action_space().sample(key_policy)
    obs, state, reward, terminated, truncated, _ = env.step(key_step, state, action)
    out["step_default_params"] = (obs, reward, terminated | truncated)

    vmap_reset = jax.vmap(env.reset, in_axes=(0, None))
    vmap_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    num_envs = 8
    vmap_keys = jax.random.split(key, num_envs)
    obs, state = vmap_reset(vmap_keys, env_params)
    obs, state, reward, terminated, truncated, _ = vmap_step(vmap_keys, state, jnp.zeros(num_envs), env_params)
    out["vmap"] = (obs, reward, terminated | truncated)

    class MLP(nn.Module):
        num_hidden_units: int
        num_hidden_layers: int
        num_output_units: int

        @nn.compact
        def __call__(self, x, key):
            for _ in range(self.num_hidden_layers):
                x = nn.relu(nn.Dense(features=self.num_hidden_units)(x))
            return nn.Dense(features=self.num_output_units)(x)

    model = MLP(48, 1, 1)
    policy_params = model.init(key, jnp.zeros(3), None)

    def rollout(key_input, policy_params, env_params, steps_in_episode):
        key_reset, key_episode = jax.random.split(key_input)
        obs, state = env.reset(key_reset, env_params)

        def policy_step(state_input, tmp):
            obs, state, policy_params, key = state_input
            key, key_step, key_net = jax.random.split(key, 3)
            action = model.apply(policy_params, obs, key_net)
            next_obs, next_state, reward, terminated, truncated, _ = env.step(key_step, state, action, env_params)
            done = terminated | truncated
            return [next_obs, next_state, policy_params, key], [obs, action, reward, next_obs, done]

        _, scan_out = jax.lax.scan(policy_step, [obs, state, policy_params, key_episode], (), steps_in_episode)
        return scan_out

    jit_rollout = jax.jit(rollout, static_argnums=3)
    out["scan_rollout"] = jit_rollout(key, policy_params, env_params, 200)

    if manager:
        manager = RolloutWrapper(model.apply, env_name="Pendulum-v1")  # builds its env with gymnax.make
        out["single_rollout"] = manager.single_rollout(key, policy_params)
        key_batch = jax.random.split(key, 10)
        out["batch_rollout"] = manager.batch_rollout(key_batch, policy_params)
        batch_params = jax.tree.map(lambda x: jnp.tile(x, (5, 1)).reshape(5, *x.shape), policy_params)
        out["population_rollout"] = manager.population_rollout(key_batch, batch_params)

    rewards = []
    key, key_reset = jax.random.split(key)
    obs, env_state = env.reset(key_reset, env_params)
    t_counter = 0
    while True:  # the Visualizer cell's episode loop
        key, key_act, key_step = jax.random.split(key, 3)
        action = env.action_space(env_params).sample(key_act)
        next_obs, next_env_state, reward, terminated, truncated, _ = env.step(key_step, env_state, action, env_params)
        done = terminated | truncated
        rewards.append(reward)
        t_counter += 1
        if done or t_counter >= 50:
            break
        obs, env_state = next_obs, next_env_state
    out["python_loop"] = jnp.stack(rewards)
    return out


@functools.cache
def gymnax_getting_started():
    """The notebook's results on gymnax itself (computed once; before any monkeypatch)."""
    return getting_started(gymnax.make)


def test_getting_started_notebook_gives_gymnax_numbers(monkeypatch):
    """The notebook's code on popeval (`gymnax.make` -> popeval + `SixValueStep`) gives
    gymnax 1.x's own results: same key use, same dynamics, and with gymnax's space classes
    the same sampled actions. Equal to float32 rounding: XLA compiles the two programs
    differently, and the Python loop's eager Pendulum rewards differ in the last bit."""
    expected = gymnax_getting_started()
    monkeypatch.setattr(gymnax, "make", gymnax_make)
    actual = getting_started(gymnax.make)
    assert set(actual) == set(expected)
    for cell in expected:
        assert_trees_equal(actual[cell], expected[cell], cell, rtol=1e-6)
    assert len(actual["python_loop"]) == 50 and actual["scan_rollout"][0].shape == (200, 3)
    assert actual["single_rollout"][-1].shape == (1,) and actual["population_rollout"][-1].shape == (5, 10, 1)


@pytest.mark.slow  # the gymnax-spaces run of the notebook covers the default tier
def test_getting_started_notebook_with_popeval_spaces(monkeypatch):
    """With popeval's own spaces (`SixValueStep(env)`), the notebook runs as well and gives
    the same shapes and dtypes; sampled actions differ (popeval's `Box.sample` draws
    otherwise), the zero-torque vmap cell does not."""
    expected = gymnax_getting_started()

    def make_popeval_spaces(env_id, **kwargs):
        env, params = make(env_id, compat="gymnax", **kwargs)
        return SixValueStep(env), params

    monkeypatch.setattr(gymnax, "make", make_popeval_spaces)
    actual = getting_started(gymnax.make, manager=False)
    common = {cell: expected[cell] for cell in actual}
    shapes = lambda tree: jax.tree.map(lambda x: (np.shape(x), np.asarray(x).dtype), tree)
    assert shapes(actual) == shapes(common)
    assert_trees_equal(actual["reset"], expected["reset"], "reset")
    assert_trees_equal(actual["vmap"], expected["vmap"], "vmap", rtol=1e-6)


@pytest.mark.parametrize("env_id", CLASSIC_CONTROL)
def test_six_value_step_equals_gymnax_step(env_id):
    """`SixValueStep(env).step` and gymnax's `env.step`, from gymnax's state every step
    (same key, state and random action), agree on everything they return, through
    terminations, time limits and auto-resets."""
    g_env, g_params = gymnax.make(env_id)
    g_params = g_params.replace(max_steps_in_episode=25)
    env, params = make(env_id, max_steps_in_episode=25)
    six = SixValueStep(env)
    state_cls = type(env.reset(jax.random.key(0), params)[1])
    names = [f.name for f in dataclasses.fields(state_cls)]

    def body(g_state, key):
        k_act, k_step = jax.random.split(key)
        action = g_env.action_space(g_params).sample(k_act)
        state = state_cls(**{n: jnp.asarray(getattr(g_state, n)) for n in names})
        theirs = g_env.step(k_step, g_state, action, g_params)
        ours = six.step(k_step, state, action, params)
        return theirs[1], (theirs, ours)

    _, g_state = g_env.reset(jax.random.key(1), g_params)
    _, (theirs, ours) = jax.lax.scan(body, g_state, jax.random.split(jax.random.key(2), 120))
    for i, what in enumerate(["obs", "state", "reward", "terminated", "truncated"]):
        if what == "state":
            for n in names:
                np.testing.assert_allclose(getattr(ours[1], n), getattr(theirs[1], n), rtol=1e-6, atol=1e-6, err_msg=n)
        else:
            np.testing.assert_allclose(ours[i], theirs[i], rtol=1e-6, atol=1e-6, err_msg=what)
    assert set(ours[5]) == set(theirs[5]) == SIX_INFO_KEYS
    for k in SIX_INFO_KEYS:
        np.testing.assert_allclose(ours[5][k], theirs[5][k], rtol=1e-6, atol=1e-6, err_msg=k)
    assert np.asarray(theirs[3] | theirs[4]).sum() >= 3, "episodes ended"  # the test covers auto-resets


# ----------------------------------------------------------------------------- (c) evosax

# CartPole (compared with gymnax's), MinAtar (float32 observations, gymnax's 1000-step cap),
# a bsuite chain with gymnax's flat observations: one per preset kind (each compiles a rollout).
EVOSAX_IDS = ["CartPole-v1", "MemoryChain-bsuite", *(i for i in registered_envs if i.endswith("-MinAtar"))]


@pytest.mark.parametrize("env_id", [pytest.param(e, marks=pytest.mark.slow) if e.endswith("-MinAtar")
                                    and e != "Breakout-MinAtar" else e for e in EVOSAX_IDS])
def test_evosax_gymnax_problem(env_id, monkeypatch):
    """evosax's `GymnaxProblem`, default settings, builds popeval's gymnax variant through
    `gymnax.make` and evaluates a population; on CartPole its fitness equals the one
    on gymnax's own CartPole."""
    problems = pytest.importorskip("evosax.problems")
    from evosax.problems.networks import MLP, categorical_output_fn
    from flax import linen as nn

    class FlatPolicy(nn.Module):
        num_actions: int

        @nn.compact
        def __call__(self, obs, key):
            return MLP(layer_sizes=(8, self.num_actions), output_fn=categorical_output_fn)(obs.reshape(-1), key)

    def evaluate():
        problem = problems.GymnaxProblem(env_id, FlatPolicy(make(env_id, compat="gymnax")[0].num_actions))
        key = jax.random.key(0)
        solutions = jax.vmap(problem.sample)(jax.random.split(key, 3))
        fitness, state, metrics = problem.eval(key, solutions, problem.init(key))
        return problem, fitness, state, metrics

    if env_id == "CartPole-v1":
        _, expected, _, _ = evaluate()  # on gymnax's own CartPole
    monkeypatch.setattr(gymnax, "make", gymnax_make)
    problem, fitness, state, metrics = evaluate()
    assert isinstance(problem.env, SixValueStep) and problem.env.name == env_id
    params = make(env_id, compat="gymnax")[1]
    assert problem.episode_length == params.max_steps_in_episode <= 2500
    assert fitness.shape == (3,) and np.isfinite(np.asarray(fitness)).all()
    assert state.obs_counter == 3 * problem.episode_length
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves((state.obs_mean, state.obs_std)))
    times = np.asarray(metrics["env_states"][1].time)
    assert times.shape == (3, 1, problem.episode_length) and times.max() >= 1
    if env_id == "CartPole-v1":
        np.testing.assert_array_equal(np.asarray(fitness), np.asarray(expected))
        assert np.asarray(fitness).min() >= 1.0


# ----------------------------------------------------------------------------- (d) eager calls


@pytest.mark.parametrize("env_id", sorted(FAMILY))
def test_eager_calls_equal_jit_bit_for_bit(env_id):
    """Eager `reset`/`step` and `SixValueStep.step` (what a Python loop or gymnax's Gym
    wrapper calls) equal `jax.jit(env.reset)` / `jax.jit(env.step)` bit for bit, through
    an auto-reset; `SixValueStep.step` is popeval's `step` with the flags split. One
    environment per family: the eager path is the base class's, the same for all."""
    c = cached(env_id)
    key = jax.random.key(4)
    obs, state = c.env.reset(key, c.short)
    assert_trees_equal((obs, state), jax.jit(c.env.reset)(key, c.short), f"{env_id} reset")
    assert_trees_equal(c.six.reset(key, c.short), (obs, state), f"{env_id} SixValueStep reset")
    step_jit = jax.jit(c.env.step)
    for t in range(SHORT + 1):
        k_act, k_step = jax.random.split(jax.random.fold_in(key, t))
        action = c.env.action_space(c.short).sample(k_act)
        jitted = step_jit(k_step, state, action, c.short)
        six = c.six.step(k_step, state, action, c.short)
        assert_trees_equal(six[:3], jitted[:3], f"{env_id} SixValueStep step {t}: obs, state, reward")
        assert_trees_equal(six[3] | six[4], jitted[3], f"{env_id} SixValueStep step {t}: done")
        assert_trees_equal((six[3], six[4], six[5]["discount"]),
                           (jitted[4]["terminated"], jitted[4]["truncated"], jitted[4]["discount"]), f"{env_id} flags")
        assert_trees_equal(c.env.step(k_step, state, action, c.short), jitted, f"{env_id} eager step {t}")
        state = jitted[1]


def test_gymnax_dm_env_wrapper_test_passes(monkeypatch):
    """The checks of gymnax 1.x's tests/wrappers/test_dm_env.py, with `gymnax.make` pointed
    at popeval: a vmapped dm_env reset/step shaped like the environment's own, and a
    time-limit end that keeps the bootstrap discount at 1 and reports the final observation."""
    monkeypatch.setattr(gymnax, "make", gymnax_make)
    env, params = gymnax.make("CartPole-v1")
    wrapped = gymnax_wrappers.GymnaxToDmEnvWrapper(env)
    keys = jax.random.split(jax.random.key(0), 16)
    action = jax.vmap(env.action_space(params).sample)(keys)
    _, state = jax.vmap(env.reset)(keys)
    obs, _, reward, terminated, truncated, _ = jax.vmap(env.step)(keys, state, action)
    timesteps = jax.vmap(wrapped.reset)(keys)
    assert timesteps.observation.shape == obs.shape and timesteps.reward.shape == reward.shape
    assert timesteps.discount.shape == (terminated | truncated).shape
    stepped = jax.vmap(wrapped.step)(keys, timesteps, action)
    assert stepped.observation.shape == obs.shape

    env, params = gymnax.make("Pendulum-v1", max_steps_in_episode=1)
    wrapped = gymnax_wrappers.GymnaxToDmEnvWrapper(env)
    k_reset, k_action, k_step = jax.random.split(jax.random.key(1), 3)
    _, state = env.reset(k_reset, params)
    action = env.action_space(params).sample(k_action)
    _, _, _, _, truncated, info = env.step(k_step, state, action, params)
    following = wrapped.step(k_step, wrapped.reset(k_reset, params), action, params)
    assert bool(truncated) and float(following.discount) == 1.0
    np.testing.assert_array_equal(following.final_observation, info["final_observation"])
