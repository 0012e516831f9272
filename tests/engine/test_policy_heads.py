"""Sampled action heads, the CNN policy and one-hot state indices (`popeval.policies`), alone,
inside rollouts (the fitness path equals the trajectory path; common random numbers hold)
and from an evolve config."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import RolloutWrapper, compiler
from popeval.environments import make
from popeval.policies import CNNPolicy, LSTMPolicy, MLPPolicy, ParamReshaper, action_head
from popeval.strategies import EvolveConfig, RunOptions, evolve
from popeval.strategies.run.programs import build


def test_sampled_categorical_follows_the_softmax_and_the_key():
    logits = jnp.log(jnp.asarray([0.1, 0.6, 0.3]))
    keys = jax.random.split(jax.random.key(0), 20_000)
    actions = jax.vmap(lambda k: action_head(logits, True, (), (), k))(keys)
    assert actions.dtype == jnp.int32
    np.testing.assert_allclose(np.bincount(np.asarray(actions), minlength=3) / len(keys), [0.1, 0.6, 0.3], atol=0.015)
    same = action_head(logits, True, (), (), keys[7])
    assert same == actions[7], "the same key draws the same action"
    assert action_head(logits, True, (), ()) == 1, "without a key the head stays greedy"


def test_sampled_box_head_centres_on_the_greedy_action_and_stays_in_bounds():
    low, high = (-2.0, 0.0), (2.0, 1.0)
    x = jnp.asarray([0.3, -0.2])
    greedy = action_head(x, False, low, high)
    keys = jax.random.split(jax.random.key(1), 20_000)
    draws = np.asarray(jax.vmap(lambda k: action_head(x, False, low, high, k, jnp.asarray([0.05, 0.05])))(keys))
    assert np.all(draws >= np.asarray(low)) and np.all(draws <= np.asarray(high))
    np.testing.assert_allclose(draws.mean(0), greedy, atol=0.01)
    np.testing.assert_allclose(draws.std(0), [0.05 * 2.0, 0.05 * 0.5], rtol=0.05)  # std x half-width
    wide = np.asarray(jax.vmap(lambda k: action_head(x, False, low, high, k, jnp.asarray([5.0, 5.0])))(keys))
    assert np.all(wide >= np.asarray(low)) and np.all(wide <= np.asarray(high)) and np.any(wide == np.asarray(high))
    unbounded = action_head(jnp.asarray([1.5]), False, (-np.inf,), (np.inf,), keys[0], jnp.asarray([0.0]))
    np.testing.assert_array_equal(unbounded, [1.5])


def test_learned_and_fixed_action_std():
    env, params = make("Pendulum-v1")
    learned = MLPPolicy.for_env(env, params, hidden_sizes=(8,), head="sampled")
    variables = learned.init_params(jax.random.key(0), env, params)
    np.testing.assert_allclose(np.exp(variables["params"]["log_std"]), [0.5], rtol=1e-6)
    # The scale is one of the evolved parameters.
    assert ParamReshaper(variables).num_dims == 3 * 8 + 8 + 8 + 1 + 1
    obs = jnp.asarray([1.0, 0.0, 0.0])
    draws = jax.vmap(lambda k: learned.apply(variables, obs, k))(jax.random.split(jax.random.key(2), 4000))
    assert 0.5 < float(jnp.std(draws)) < 1.5  # 0.5 x the half-width 2, before clipping
    fixed = MLPPolicy.for_env(env, params, hidden_sizes=(8,), head="sampled", action_std=0.01)
    fixed_vars = fixed.init_params(jax.random.key(0), env, params)
    assert "log_std" not in fixed_vars["params"]
    greedy = MLPPolicy.for_env(env, params, hidden_sizes=(8,))
    a = fixed.apply(fixed_vars, obs, jax.random.key(3))
    np.testing.assert_allclose(a, greedy.apply(fixed_vars, obs), atol=0.1)
    with pytest.raises(ValueError, match="needs the step's key"):
        learned.apply(variables, obs)
    with pytest.raises(ValueError, match="head must be one of"):
        MLPPolicy.for_env(env, params, head="softmax").init_params(jax.random.key(0), env, params)


def test_discrete_observations_are_one_hot():
    env, params = make("FrozenLake-misc")
    n = env.observation_space(params).n
    for policy in (MLPPolicy.for_env(env, params, hidden_sizes=(8,)), LSTMPolicy.for_env(env, params, hidden_size=8)):
        assert policy.obs_categories == n
        variables = policy.init_params(jax.random.key(0), env, params)
        assert variables["params"]["Dense_0"]["kernel"].shape == (n, 8)
    mlp = MLPPolicy.for_env(env, params, hidden_sizes=())
    variables = mlp.init_params(jax.random.key(0), env, params)
    kernel = variables["params"]["Dense_0"]["kernel"]
    for state in (0, 5, n - 1):  # a linear policy on a one-hot input reads its state's row
        logits = kernel[state] + variables["params"]["Dense_0"]["bias"]
        assert mlp.apply(variables, jnp.asarray(state, jnp.int32)) == jnp.argmax(logits)


def test_cnn_policy_on_minatar():
    env, params = make("Breakout-MinAtar")
    policy = CNNPolicy.for_env(env, params, conv_channels=(4, 8), hidden_sizes=(16,))
    variables = policy.init_params(jax.random.key(0), env, params)
    p = variables["params"]
    assert p["Conv_0"]["kernel"].shape == (3, 3, 4, 4) and p["Conv_1"]["kernel"].shape == (3, 3, 4, 8)
    assert p["Dense_0"]["kernel"].shape == (6 * 6 * 8, 16)  # two valid 3x3 convolutions of 10x10
    obs, _ = env.reset(jax.random.key(1), params)
    assert 0 <= int(policy.apply(variables, obs)) < env.action_space(params).n
    with pytest.raises(ValueError, match="image observations"):
        cartpole, cp_params = make("CartPole-v1")
        CNNPolicy.for_env(cartpole, cp_params).init_params(jax.random.key(0), cartpole, cp_params)


def _population(policy, env, params, size):
    keys = jax.random.split(jax.random.key(4), size)
    # popeval's options: quicker to compile than XLA's defaults, the same parameters bit for bit.
    return jax.jit(jax.vmap(lambda k: policy.init_params(k, env, params)), compiler_options=compiler.options())(keys)


@pytest.mark.parametrize("env_id,cls,kwargs,steps", [
    ("CartPole-v1", MLPPolicy, {"hidden_sizes": (8,)}, None),
    ("Pendulum-v1", MLPPolicy, {"hidden_sizes": (8,)}, 100),
    pytest.param("Breakout-MinAtar", CNNPolicy, {"conv_channels": (4,), "hidden_sizes": (8,)}, 60,
                 marks=pytest.mark.slow),
])
def test_sampled_heads_in_rollouts(env_id, cls, kwargs, steps):
    """Fitness path == trajectory path with sampled actions; identical members on the same
    episode keys draw the same actions; the episode keys change the draws."""
    env, params = make(env_id)
    policy = cls.for_env(env, params, head="sampled", **kwargs)
    pop = _population(policy, env, params, 3)
    pop = jax.tree.map(lambda x: x.at[1].set(x[0]), pop)  # members 0 and 1 are the same
    w = RolloutWrapper(policy.apply, env=env, env_params=params, num_env_steps=steps)
    keys = jax.random.split(jax.random.key(5), 4)
    fit = w.population_fitness(keys, pop)
    traj = w.population_rollout(keys, pop)
    np.testing.assert_array_equal(fit.returns, traj[-1])
    np.testing.assert_array_equal(fit.returns[0], fit.returns[1])
    np.testing.assert_array_equal(traj[1][0], traj[1][1])
    other = w.population_rollout(jax.random.split(jax.random.key(6), 4), pop)
    assert not np.array_equal(np.asarray(traj[1]), np.asarray(other[1]))
    # The greedy policy with the same parameters acts otherwise: the head is really sampled.
    greedy = RolloutWrapper(cls.for_env(env, params, **kwargs).apply, env=env, env_params=params,
                            num_env_steps=steps)
    if env_id == "Pendulum-v1":  # the learned log_std is an extra parameter the greedy MLP lacks
        pop = jax.tree.map(lambda x: x, pop)
        pop["params"] = {k: v for k, v in pop["params"].items() if k != "log_std"}
    assert not np.array_equal(np.asarray(greedy.population_rollout(keys, pop)[1]), np.asarray(traj[1]))


def test_config_builds_and_refuses_policies():
    run = build(EvolveConfig.from_flat(env_name="Asterix-MinAtar", policy="cnn", conv_channels=(4,), hidden_sizes=(8,),
                             head="sampled", conv_kernel=(2, 10)))
    assert isinstance(run.policy, CNNPolicy) and run.policy.head == "sampled" and run.policy.conv_channels == (4,)
    assert run.template["params"]["Conv_0"]["kernel"].shape == (2, 10, 4, 4) and run.policy.kernel_size == (2, 10)
    pooled = build(EvolveConfig.from_flat(env_name="Freeway-MinAtar", policy="cnn", conv_channels=(4,),
                                          hidden_sizes=(8,),
                                conv_kernel=(3, 10), conv_pool="max"))
    assert pooled.policy.pool == "max" and pooled.template["params"]["Dense_0"]["kernel"].shape == (4, 8)
    lstm = build(EvolveConfig.from_flat(env_name="Pendulum-v1", policy="lstm", hidden_sizes=(4,), head="sampled",
                                        action_std=0.2))
    assert lstm.policy.action_std == 0.2 and "log_std" not in lstm.template["params"]
    with pytest.raises(ValueError, match="image observations"):
        build(EvolveConfig.from_flat(policy="cnn"))
    for bad, match in [({"head": "sample"}, "did you mean 'sampled'"), ({"policy": "conv"}, "policy must be one of"),
                       ({"conv_channels": (0,)}, "conv_channels"), ({"action_std": 0.0}, "action_std"),
                       ({"conv_kernel": (3,)}, r"conv_kernel must be \[height, width\], got \[3\]"),
                       ({"conv_kernel": (3, 0)}, "conv_kernel must be positive integers"),
                       ({"conv_pool": "avg"}, r"conv_pool must be one of \['none', 'max'\]")]:
        with pytest.raises(ValueError, match=match):
            EvolveConfig.from_flat(**bad)


@pytest.mark.slow
def test_a_sampled_cnn_evolves_from_its_config(tmp_path):
    """A short run with a sampled CNN evolves (by default the Breakout controller's replay builds
    a CNN run from its config)."""
    config = EvolveConfig.from_flat(env_name="Breakout-MinAtar", policy="cnn", conv_channels=(4,), hidden_sizes=(8,),
                          head="sampled", strategy="snes", pop_size=8, num_rollouts=1, num_generations=2,
                          num_env_steps=50, eval_every=2, eval_episodes=2)
    summary = evolve(config, RunOptions(run_dir=str(tmp_path / "run"), wandb="disabled", progress=False))
    assert summary["generations"] == 2 and np.isfinite(summary["mean_policy_return"]), summary
