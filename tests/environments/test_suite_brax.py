"""The brax adapter (`popeval.environments.suites.brax`): conformance with brax's own environment, the
time limit, RolloutWrapper's two paths on it, the `brax/<name>` ids of `make`, and a quick
`popeval evolve` run on one."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import MLPPolicy, RolloutWrapper, make
from tests.helpers import REPO, read_metrics, subprocess_env

T = 60  # rollout steps: a zero or random policy drops the pole well before
#: brax brings mujoco: the slow tier, with the suites extra (`pip install -e ".[test,suites]"`).
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def brax_envs():
    return pytest.importorskip("brax.envs", reason="brax is the suites extra: pip install -e '.[suites]'")


def brax_env(*args, **kwargs):
    from popeval.environments.suites import brax_env as make_brax_env  # brax's import, after the skip

    return make_brax_env(*args, **kwargs)


@pytest.fixture(scope="module")
def env():
    return brax_env("inverted_pendulum")


@pytest.fixture(scope="module")
def reference(env, brax_envs):
    ref = brax_envs.get_environment("inverted_pendulum", backend=env.backend)
    return jax.jit(ref.reset), jax.jit(ref.step)


def test_spaces_and_name(env):
    params = env.default_params
    assert env.name == "brax/inverted_pendulum"
    assert params.max_steps_in_episode == 1000
    assert env.observation_space(params).shape == (4,)
    space = env.action_space(params)
    assert space.shape == (1,) and float(space.low[0]) == -1.0 and float(space.high[0]) == 1.0
    _, state = env.reset(jax.random.key(0), params)
    assert bool(env.state_space(params).contains(state))  # brax states hold None fields


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="inverted_pendulum"):
        brax_env("inverted_pendulm")


def test_make_builds_brax_ids():
    """`brax/<name>` is any brax.envs name; keyword arguments reach the adapter."""
    env, params = make("brax/inverted_pendulum", backend="spring", max_steps_in_episode=50)
    assert (env.name, env.backend, params.max_steps_in_episode) == ("brax/inverted_pendulum", "spring", 50)
    with pytest.raises(ValueError, match="Did you mean 'brax/inverted_pendulum'"):
        make("brax/inverted_pendulm")


def test_reset_and_step_agree_with_brax(env, reference):
    """Same key, same actions; brax steps from the adapter's own state every step. The
    constant push at the end drops the pole: the terminating step is compared too."""
    ref_reset, ref_step = reference
    params = env.default_params
    key = jax.random.key(3)
    obs, state = env.reset(key, params)
    ref = ref_reset(key)
    np.testing.assert_array_equal(obs, ref.obs)
    actions = [0.3, -0.5, 0.0, 0.8, -0.2] + [1.0] * 30
    for t, a in enumerate(actions):
        action = jnp.full((1,), a, jnp.float32)
        ref = ref_step(state.inner, action)
        obs, state, reward, done, info = env.step_env(jax.random.key(t), state, action, params)
        np.testing.assert_allclose(obs, ref.obs, rtol=1e-6, atol=1e-6)
        assert float(reward) == float(ref.reward)
        assert bool(info["terminated"]) == bool(ref.done) == bool(done)
        assert not bool(info["truncated"])
        assert int(state.time) == t + 1
        if done:
            break
    assert bool(done) and t >= len(actions) - 30, "the constant push should drop the pole"


def test_time_limit_truncates(env):
    params = env.default_params.replace(max_steps_in_episode=3)
    _, state = env.reset(jax.random.key(0), params)
    for t in range(3):
        _, state, _, done, info = env.step_env(jax.random.key(t), state, jnp.zeros(1), params)
        assert bool(done) == (t == 2)
    assert bool(info["truncated"]) and not bool(info["terminated"])


def test_brax_is_not_imported_with_popeval():
    code = ("import sys, popeval, popeval.environments.suites, popeval.strategies; "
            "assert not any(m == 'brax' or m.startswith('brax.') for m in sys.modules); "
            "import popeval.environments.suites as s; s.brax_env; assert 'brax' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env(), timeout=120)


@pytest.fixture(scope="module")
def rollout(env):
    """A RolloutWrapper, P=4 members x B=2 episodes (member 0 all zeros: action 0), and both
    paths' outputs."""
    params = env.default_params
    policy = MLPPolicy.for_env(env, params, hidden_sizes=(8,))
    pop = jax.vmap(lambda k: policy.init_params(k, env, params))(jax.random.split(jax.random.key(0), 4))
    pop = jax.tree.map(lambda x: x.at[0].set(0.0), pop)
    manager = RolloutWrapper(policy.apply, env=env, num_env_steps=T)
    keys = jax.random.split(jax.random.key(1), 2)
    return manager.population_fitness(keys, pop), manager.population_rollout(keys, pop)


def test_fitness_path_equals_trajectory_path(rollout):
    fitness, (_, _, reward, _, done, cum_return) = rollout
    assert fitness.returns.shape == (4, 2)
    np.testing.assert_array_equal(fitness.returns, cum_return)
    # done stays true after the end: the episode length is the first done step + 1
    lengths = np.where(done.any(-1), np.argmax(done, -1) + 1, T)
    np.testing.assert_array_equal(fitness.lengths, lengths)
    np.testing.assert_array_equal(reward.sum(-1), cum_return)


def test_terminated_episodes_end_early(rollout):
    """inverted_pendulum pays 1 per step until the pole falls: the zero member's episodes
    (action 0) end before T, and every return is its episode's length."""
    fitness, _ = rollout
    lengths = np.asarray(fitness.lengths)
    assert (lengths[0] < T).all() and (lengths > 1).all()
    np.testing.assert_array_equal(fitness.returns, lengths.astype(np.float32))


def test_evolve_quick_run(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "popeval", "evolve",
           "--config", "experiments/configs/brax_inverted_pendulum.yaml", "--run_dir", str(run_dir),
           "--wandb", "disabled", "--quiet", "--num_generations=2", "--pop_size=8",
           "--num_rollouts=1", "--num_env_steps=50", "--eval_every=2", "--eval_episodes=2"]
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [int(r["generation"]) for r in rows] == [1, 2]
    assert all(0 < float(r["fitness/mean"]) <= 50 for r in rows)
    assert 0 < float(rows[-1]["eval/return"]) <= 50
    assert (run_dir / "fitness.png").is_file()
