"""Bad input to `make` and to the environments gives clear errors, at trace time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from popeval.environments import make

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
        ("Pendulum-v1", jnp.zeros(3), ValueError, r"Pendulum-v1.*shape \(3,\).*Box.*shape \(1,\)"),
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
