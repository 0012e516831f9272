"""Bad input to `make` and to the environments gives clear errors, at trace time."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.environments import make, registered_envs

KEY = jax.random.PRNGKey(0)


@pytest.mark.parametrize(
    "bad_id, suggestion",
    [("CartPole-v0", "CartPole-v1"), ("cartpole-v1", "CartPole-v1"), ("Pendulum-v0", "Pendulum-v1")],
)
def test_unknown_id_names_close_matches(bad_id, suggestion):
    with pytest.raises(ValueError, match=f"(?s){bad_id}.*Did you mean.*'{suggestion}'"):
        make(bad_id)


def test_unknown_id_without_close_match_still_lists_ids():
    with pytest.raises(ValueError, match="Registered ids: .*CartPole-v1") as err:
        make("Zzzzzzzz-v9")
    assert "Did you mean" not in str(err.value)


def test_unknown_kwarg_is_named():
    with pytest.raises(ValueError, match="unknown keyword argument.*gravityy") as err:
        make("CartPole-v1", gravityy=9.0)
    assert "gravity" in str(err.value).split("EnvParams fields:")[1]  # the valid names are listed


def test_params_kwargs_override_the_returned_params():
    env, params = make("CartPole-v1", max_steps_in_episode=7, force_mag=20.0)
    default = make("CartPole-v1")[1]
    assert params.max_steps_in_episode == 7 and params.force_mag == 20.0
    assert params.replace(max_steps_in_episode=500, force_mag=10.0) == default
    # ... and are used: the push is twice as hard, the episode is truncated after 7 steps.
    step = jax.jit(env.step_env)
    _, state = env.reset(KEY, params)
    dv = [step(KEY, state, 1, p)[1].x_dot - state.x_dot for p in (params, default)]
    assert dv[0] > 1.9 * dv[1] > 0
    truncated = []
    for t in range(7):
        _, state, _, _, info = step(KEY, state, t % 2, params)
        assert not info["terminated"]
        truncated.append(bool(info["truncated"]))
    assert truncated == [False] * 6 + [True]


@pytest.mark.parametrize(
    "env_id, action, error, expected",
    [
        ("CartPole-v1", jnp.float32(1.0), TypeError, r"CartPole-v1.*float32.*Discrete\(2\)"),
        ("CartPole-v1", jnp.array([0, 1]), ValueError, r"CartPole-v1.*shape \(2,\).*Discrete\(2\)"),
        ("Pendulum-v1", jnp.zeros(3), ValueError, r"Pendulum-v1.*shape \(3,\).*Box\(shape=\(1,\), dtype=float32\)"),
        ("MountainCarContinuous-v0", jnp.zeros(1, jnp.bool_), TypeError, r"MountainCarContinuous-v0.*bool.*Box"),
    ],
)
def test_wrong_action_raises_at_trace_time(env_id, action, error, expected):
    env, params = make(env_id)
    _, state = env.reset(KEY, params)
    for step in (env.step, env.step_env, jax.jit(env.step), jax.jit(env.step_env)):
        with pytest.raises(error, match=expected):
            step(KEY, state, action, params)


def test_params_of_another_env_raise_type_error():
    env, _ = make("CartPole-v1")
    _, pendulum_params = make("Pendulum-v1")
    _, state = env.reset(KEY)
    for call in (
        lambda: env.reset(KEY, pendulum_params),
        lambda: env.step(KEY, state, 0, pendulum_params),
        lambda: jax.jit(env.step)(KEY, state, 0, pendulum_params),
        lambda: env.observation_space(pendulum_params),
    ):
        with pytest.raises(TypeError, match=r"CartPole-v1.*pendulum\.EnvParams.*classic_control\.cartpole"):
            call()
    # Same class name in another module, and another class in the same module.
    mountain_car, _ = make("MountainCar-v0")
    _, continuous_params = make("MountainCarContinuous-v0")
    with pytest.raises(TypeError, match="ContinuousEnvParams.*expected this environment's EnvParams"):
        mountain_car.reset(KEY, continuous_params)


# ------------------------------------------------------------------ parameter checks
@pytest.mark.parametrize(
    "env_id, field, value, allowed",
    [
        ("CartPole-v1", "masspole", -1.0, r"\(0, inf\)"),
        ("CartPole-v1", "masscart", 0.0, r"\(0, inf\)"),
        ("CartPole-v1", "length", float("nan"), "NaN"),
        ("CartPole-v1", "tau", 0.0, r"\(0, inf\)"),
        ("CartPole-v1", "gravity", -9.8, r"\[0, inf\)"),
        ("Pendulum-v1", "dt", 0.0, r"\(0, inf\)"),
        ("Pendulum-v1", "m", -1.0, r"\(0, inf\)"),
        ("Pendulum-v1", "max_torque", -2.0, r"\[0, inf\)"),
        ("Acrobot-v1", "link_length_1", 0.0, r"\(0, inf\)"),
        ("Acrobot-v1", "link_mass_2", -1.0, r"\(0, inf\)"),
        ("MountainCar-v0", "gravity", -0.0025, r"\[0, inf\)"),
        ("MountainCarContinuous-v0", "max_steps_in_episode", 0, r"an integer in \[1, 2147483647\]"),
        ("Breakout-MinAtar", "sticky_action_prob", 1.5, r"\[0, 1\]"),
        ("Breakout-MinAtar", "max_steps_in_episode", -5, r"an integer in \[1, 2147483647\]"),
        ("Seaquest-MinAtar", "sub_prob", -0.1, r"\[0, 1\]"),
        ("Seaquest-MinAtar", "spawn_left_prob", 2.0, r"\[0, 1\]"),
        ("Seaquest-MinAtar", "max_oxygen", 0, r"an integer in \[1, 2147483647\]"),
        ("Asterix-MinAtar", "gold_prob", float("nan"), "NaN"),
        ("Asterix-MinAtar", "init_spawn_speed", 0, r"an integer in \[1, 2147483647\]"),
        ("SpaceInvaders-MinAtar", "enemy_move_interval", 0, r"an integer in \[1, 2147483647\]"),
        ("Freeway-MinAtar", "sticky_action_prob", -0.5, r"\[0, 1\]"),
        ("Catch-bsuite", "max_steps_in_episode", 0, r"an integer in \[1, 2147483647\]"),
        ("DeepSea-bsuite", "unscaled_move_cost", float("nan"), "NaN"),
        ("DeepSea-bsuite", "action_mapping", np.full((10, 10), 2), r"\[0, 1\]"),
        ("SimpleBandit-bsuite", "rewards", np.full(11, np.nan), "NaN"),
        ("DiscountingChain-bsuite", "reward_timesteps", np.array([0, 3, 10, 30, 100]), r"\[1, inf\)"),
        ("MetaMaze-misc", "goal_reward", float("nan"), "NaN"),
    ],
)
def test_out_of_range_params_raise_at_make_and_replace(env_id, field, value, allowed):
    """The error names the environment, the field and the allowed range, from `make` and `replace`."""
    expected = rf"(?s){env_id}.*{field}=.*{allowed}"
    with pytest.raises(ValueError, match=expected):
        make(env_id, **{field: value})
    _, params = make(env_id)
    with pytest.raises(ValueError, match=expected):
        params.replace(**{field: value})


@pytest.mark.parametrize(
    "env_id, field, value",
    [
        ("Asterix-MinAtar", "difficulty_ramping", 1),
        ("Seaquest-MinAtar", "difficulty_ramping", "yes"),
        ("SpaceInvaders-MinAtar", "difficulty_ramping", 0.0),
        ("DeepSea-bsuite", "deterministic", 0),
        ("FrozenLake-misc", "is_slippery", np.int32(1)),
        ("FourRooms-misc", "random_goal", jnp.array([0, 1])),
    ],
)
def test_non_bool_flags_raise(env_id, field, value):
    with pytest.raises(ValueError, match=rf"{env_id}.*{field}=.*must be a bool"):
        make(env_id, **{field: value})
    _, params = make(env_id)
    for ok in (False, np.bool_(True), jnp.array([True, False])):
        assert params.replace(**{field: ok}) is not None


@pytest.mark.parametrize(
    "env_id, kwargs, match",
    [
        ("MountainCar-v0", {"min_position": 0.7}, "min_position=0.7 > max_position=0.6"),
        ("MountainCarContinuous-v0", {"min_action": 1.0, "max_action": -1.0}, "min_action=1.0 > max_action=-1.0"),
    ],
)
def test_cross_field_params_checks(env_id, kwargs, match):
    with pytest.raises(ValueError, match=f"{env_id}.*{match}"):
        make(env_id, **kwargs)


def test_every_env_checks_its_params():
    """One mechanism for every family: each registered environment's params refuse an episode
    limit of 0 and NaN in every float field, and every bool field refuses a non-bool, naming
    the environment; the defaults pass."""
    for env_id in registered_envs:
        _, params = make(env_id)
        # not ==: Python 3.13's dataclass equality compares array fields one by one
        same = jax.tree.map(np.array_equal, params.replace(), params)
        assert jax.tree.structure(params.replace()) == jax.tree.structure(params) and all(jax.tree.leaves(same))
        with pytest.raises(ValueError, match=rf"{env_id} .*max_steps_in_episode=0 is out of range"):
            params.replace(max_steps_in_episode=0)
        for f in dataclasses.fields(params):
            default = getattr(params, f.name)
            if isinstance(default, bool):
                with pytest.raises(ValueError, match=rf"{env_id} .*{f.name}=1 must be a bool"):
                    params.replace(**{f.name: 1})
            elif isinstance(default, float):
                with pytest.raises(ValueError, match=rf"{env_id} .*{f.name}=nan is NaN"):
                    params.replace(**{f.name: float("nan")})


def test_params_checks_skip_traced_values_and_accept_batches():
    env, params = make("CartPole-v1")
    masspole = jnp.array([0.05, 0.1, 1.0])
    batch = jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * 3), params).replace(masspole=masspole)
    with pytest.raises(ValueError, match=r"CartPole-v1.*masspole=.*\(0, inf\)"):
        batch.replace(masspole=jnp.array([0.05, -0.1, 1.0]))  # one bad member is enough

    # vmap over a batch of params (and keys, states, actions) still works, each member its own.
    keys = jax.random.split(KEY, 3)
    _, states = jax.vmap(env.reset)(keys, batch)
    states = states.replace(theta=jnp.full(3, 0.1), theta_dot=jnp.zeros(3))
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, 0)))
    _, nxt, reward, done, _ = step(keys, states, jnp.array([1, 1, 1]), batch)
    assert nxt.theta_dot.shape == (3,) and reward.shape == done.shape == (3,)
    assert len(set(np.asarray(nxt.theta_dot).tolist())) == 3, "each member used its own masspole"
    members = [jax.tree.map(lambda x, i=i: x[i], states) for i in range(3)]
    expected = [env.step(k, s, 1, params.replace(masspole=float(m)))[1].theta_dot
                for k, s, m in zip(keys, members, masspole)]
    np.testing.assert_allclose(nxt.theta_dot, expected, rtol=1e-5)

    # Inside jit the values are traced and not checked.
    flipped = jax.jit(lambda p: p.replace(masspole=p.masspole * -1.0).masspole)(params)
    assert float(flipped) == pytest.approx(-0.1)
    # An in_axes spec built with replace (None fields, 0 for the batched one) is not params.
    spec = jax.tree.map(lambda _: None, params).replace(masspole=0)
    one = jax.tree.map(lambda x: x[0], states)
    _, nxt_spec, *_ = jax.vmap(env.step, in_axes=(None, None, None, spec))(
        KEY, one, 1, params.replace(masspole=masspole)
    )
    assert nxt_spec.theta_dot.shape == (3,) and len(set(np.asarray(nxt_spec.theta_dot).tolist())) == 3
