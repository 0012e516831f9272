"""Policies: action heads that follow the action space, LSTM recurrence, `ParamReshaper`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.environments import make
from popeval.policies import LSTMPolicy, MLPPolicy, ParamReshaper, action_head


def manual_mlp(variables, obs):
    """The MLP's pre-head output, written out with the flax parameters (tanh hidden layers)."""
    layers = variables["params"]
    x = jnp.ravel(obs).astype(jnp.float32)
    for i in range(len(layers)):
        x = x @ layers[f"Dense_{i}"]["kernel"] + layers[f"Dense_{i}"]["bias"]
        if i < len(layers) - 1:
            x = jnp.tanh(x)
    return x


@functools.partial(jax.jit, static_argnums=0)
def batched(fn, variables, obs):
    """`fn(variables, o)` for every row `o` of `obs` (one compiled program)."""
    return jax.vmap(lambda o: fn(variables, o) if fn is manual_mlp else fn(variables, o, None))(obs)


def random_obs(key, shape, scale, n=256):
    return scale * jax.random.normal(key, (n,) + tuple(shape))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_discrete_head_is_argmax_int32(env_id):
    env, params = make(env_id)
    policy = MLPPolicy.for_env(env, hidden_sizes=(16,))  # env_params default to env.default_params
    assert policy.discrete and policy.num_outputs == env.action_space(params).n
    variables = policy.init_params(jax.random.key(0), env, params)
    obs = random_obs(jax.random.key(1), env.observation_space(params).shape, 5.0)
    actions = batched(policy.apply, variables, obs)
    assert actions.dtype == jnp.int32 and actions.shape == (256,)
    logits = batched(manual_mlp, variables, obs)
    np.testing.assert_array_equal(actions, jnp.argmax(logits, -1))
    assert len(np.unique(actions)) > 1, "the check above is vacuous if every action is the same"
    assert bool(jnp.all(jax.vmap(env.action_space(params).contains)(actions)))


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0", "PointRobot-misc"])
def test_box_head_within_bounds(env_id):
    env, params = make(env_id)
    space = env.action_space(params)
    policy = MLPPolicy.for_env(env, params, hidden_sizes=(16,))
    assert not policy.discrete and policy.num_outputs == int(np.prod(space.shape))
    variables = policy.init_params(jax.random.key(0), env, params)
    low, high = np.asarray(space.low), np.asarray(space.high)
    # Scaling the output layer by 1e3 saturates the tanh: actions reach both bounds.
    last = f"Dense_{len(variables['params']) - 1}"
    saturated = jax.tree.map(lambda x: x, variables)
    saturated["params"][last] = jax.tree.map(lambda x: 1e3 * x, saturated["params"][last])
    obs = random_obs(jax.random.key(2), env.observation_space(params).shape, 1.0)
    for v in (variables, saturated):
        actions = np.asarray(batched(policy.apply, v, obs))
        assert actions.dtype == np.float32 and actions.shape == (256,) + space.shape
        assert np.all(actions >= low) and np.all(actions <= high), (env_id, actions.min(), actions.max())
        assert bool(jnp.all(jax.vmap(space.contains)(actions)))
        raw = np.asarray(batched(manual_mlp, v, obs), np.float64)
        expected = (low + high) / 2 + (high - low) / 2 * np.tanh(raw)
        np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5 * np.max(high - low))
    width = high - low
    assert np.all(actions.min(0) < low + 1e-3 * width) and np.all(actions.max(0) > high - 1e-3 * width)


def test_action_head_asymmetric_and_unbounded():
    x = jnp.asarray([-50.0, 0.0, 50.0, 0.3])
    low, high = (0.0, -3.0, -3.0, -jnp.inf), (1.0, 5.0, 5.0, jnp.inf)
    out = np.asarray(action_head(x, False, low, high))
    np.testing.assert_allclose(out[:3], [0.0, 1.0, 5.0], atol=1e-6)  # centre 1 of [-3, 5] at x=0
    assert out[3] == np.float32(0.3), "unbounded dimensions pass the network output through"
    assert action_head(jnp.asarray([0.1, 2.0, -1.0]), True, (), ()) == 1


def test_lstm_policy_carry():
    env, params = make("Pendulum-v1")
    policy = LSTMPolicy.for_env(env, params, hidden_size=8)
    carry = policy.initialize_carry()
    assert [c.shape for c in carry] == [(8,), (8,)] and all(not np.any(c) for c in carry)
    variables = policy.init_params(jax.random.key(0), env, params)
    obs = jnp.asarray([0.3, -0.2, 1.0])
    a1, carry1 = policy.apply(variables, obs, carry, None)
    a2, carry2 = policy.apply(variables, obs, carry1, None)
    assert a1.shape == (1,) and a1.dtype == jnp.float32 and bool(jnp.all(jnp.abs(a1) <= 2.0))
    assert not np.allclose(carry1[0], carry[0]) and not np.allclose(carry2[1], carry1[1])
    assert a1 != a2, "same observation, different memory: the carry must change the action"


def test_param_reshaper_round_trips():
    env, params = make("CartPole-v1")
    policy = MLPPolicy.for_env(env, params, hidden_sizes=(8, 8))
    init = lambda k: policy.init_params(k, env, params)  # noqa: E731
    single = init(jax.random.key(0))
    reshaper = ParamReshaper(single)
    assert reshaper.num_dims == sum(x.size for x in jax.tree.leaves(single)) == 4 * 8 + 8 + 8 * 8 + 8 + 8 * 2 + 2
    flat = reshaper.flatten(single)
    assert flat.shape == (reshaper.num_dims,)
    back = reshaper.unflatten(flat)
    assert jax.tree.structure(back) == jax.tree.structure(single)
    jax.tree.map(np.testing.assert_array_equal, back, single)

    pop = jax.jit(jax.vmap(init))(jax.random.split(jax.random.key(1), 5))
    flat_pop = reshaper.flatten_population(pop)
    assert flat_pop.shape == (5, reshaper.num_dims)
    np.testing.assert_array_equal(flat_pop[3], reshaper.flatten(jax.tree.map(lambda x: x[3], pop)))
    jax.tree.map(np.testing.assert_array_equal, reshaper.unflatten_population(flat_pop), pop)
    # Usable inside jit (the ES loop unflattens there).
    jitted = jax.jit(reshaper.unflatten_population)(flat_pop + 1.0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b + 1.0), jitted, pop)

    n = reshaper.num_dims
    with pytest.raises(ValueError, match=f"\\({n},\\)"):
        reshaper.unflatten(jnp.zeros(n + 1))
    with pytest.raises(ValueError, match=f"\\(P, {n}\\)"):
        reshaper.unflatten_population(jnp.zeros((5, n - 1)))
    with pytest.raises(ValueError, match=f"\\(P, {n}\\)"):
        reshaper.unflatten_population(jnp.zeros(n))


@pytest.mark.parametrize("kernel, channels", [((3, 3), (4, 8)), ((2, 10), (8,))])
def test_cnn_convolutions_as_one_product_equal_laxs(monkeypatch, kernel, channels):
    """`CNNPolicy`'s convolutions run as one matrix product over the windows
    (`conv_by_patches`): the same outputs as `lax.conv_general_dilated` to float rounding, one
    kernel or a population's (vmap), and the same actions on Freeway frames."""
    from popeval import policies

    rng = np.random.default_rng(0)  # numpy's draws: jax.random's would compile per shape
    x = jnp.asarray(rng.standard_normal((5, 10, 10, 7)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((3,) + kernel + (7, channels[0])), jnp.float32)
    numbers = ("NHWC", "HWIO", "NHWC")
    lax_conv = jax.vmap(lambda k: jax.lax.conv_general_dilated(x, k, (1, 1), "VALID", dimension_numbers=numbers))
    ours = jax.vmap(lambda k: policies.conv_by_patches(x, k, (1, 1), "VALID", dimension_numbers=numbers))
    np.testing.assert_allclose(np.asarray(jax.jit(ours)(rhs)), np.asarray(jax.jit(lax_conv)(rhs)), rtol=2e-5, atol=2e-5)
    env, env_params = make("Freeway-MinAtar")
    policy = policies.CNNPolicy.for_env(env, conv_channels=channels, kernel_size=kernel, hidden_sizes=(16,))
    variables = policy.init_params(jax.random.key(2), env, env_params)
    obs = jnp.asarray(rng.random((256, 10, 10, 7)) < 0.15)
    act = lambda: jax.jit(jax.vmap(lambda o: policy.apply(variables, o)))(obs)  # noqa: E731  (traced per call)
    actions = act()
    monkeypatch.setattr(policies, "conv_by_patches", jax.lax.conv_general_dilated)
    np.testing.assert_array_equal(np.asarray(actions), np.asarray(act()))
    with pytest.raises(ValueError, match="computes valid, stride-1"):
        monkeypatch.undo()
        policies.conv_by_patches(x, rhs[0], (2, 2), "VALID")


def test_a_kernel_larger_than_the_image_is_refused():
    from popeval.policies import CNNPolicy

    env, env_params = make("Freeway-MinAtar")
    with pytest.raises(ValueError, match=r"kernel_size \(3, 11\) does not fit the \(10, 10\) image"):
        CNNPolicy.for_env(env, kernel_size=(3, 11)).init_params(jax.random.key(0), env, env_params)


def test_boolean_observations_are_read_as_zero_one_floats():
    """MinAtar's boolean grids reach the network as exactly the float32 0/1 values a convert
    gives (popeval converts them with a select, which XLA:CPU vectorises), and the MLP and
    CNN policies act on them as on their float32 version."""
    from popeval.policies import CNNPolicy, _as_float

    obs = jax.random.bernoulli(jax.random.key(1), 0.2, (64, 10, 10, 4))
    x = jax.jit(_as_float)(obs)
    assert x.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(x), np.asarray(obs).astype(np.float32))
    env, env_params = make("Breakout-MinAtar")
    for policy in (MLPPolicy.for_env(env, hidden_sizes=(16,)),
                   CNNPolicy.for_env(env, conv_channels=(4,), hidden_sizes=(8,))):
        variables = policy.init_params(jax.random.key(0), env, env_params)
        np.testing.assert_array_equal(np.asarray(batched(policy.apply, variables, obs)),
                                      np.asarray(batched(policy.apply, variables, obs.astype(jnp.float32))))


def test_a_max_pooled_cnn_sees_whether_a_pattern_occurs_not_where():
    """`pool="max"`: the hidden layers read each channel's maximum over the image, so a
    pattern moved about the image (each window on it inside the image) gives them the same
    input, and their parameters do not grow with the image; without it they see where the
    pattern is. An unknown pool is refused."""
    from popeval.policies import CNNPolicy

    env, env_params = make("Freeway-MinAtar")
    pattern = jax.random.bernoulli(jax.random.key(1), 0.5, (2, 3, 7))
    rows, cols = np.meshgrid(np.arange(1, 8), np.arange(2, 6))  # every window on it fits on the image
    frames = jax.vmap(lambda r, c: jax.lax.dynamic_update_slice(jnp.zeros((10, 10, 7), bool), pattern,
                                                                (r, c, 0)))(rows.ravel(), cols.ravel())

    def hidden_inputs(pool):
        policy = CNNPolicy.for_env(env, conv_channels=(4,), kernel_size=(2, 3), pool=pool, hidden_sizes=(8,))
        variables = policy.init_params(jax.random.key(0), env, env_params)
        _, state = jax.vmap(lambda f: policy.apply(variables, f, capture_intermediates=True))(frames)
        hidden_input = state["intermediates"]["Dense_0"]["__call__"][0]
        return variables["params"]["Dense_0"]["kernel"].shape, np.asarray(hidden_input)

    shape, pooled = hidden_inputs("max")
    assert shape == (4, 8) and np.abs(pooled).max() > 0
    np.testing.assert_array_equal(pooled, np.broadcast_to(pooled[:1], pooled.shape))
    shape, flat = hidden_inputs("none")
    assert shape == (9 * 8 * 4, 8) and len(np.unique(flat, axis=0)) == len(frames)
    with pytest.raises(ValueError, match=r"pool must be one of \['none', 'max'\], got 'mean'"):
        CNNPolicy.for_env(env, pool="mean")
