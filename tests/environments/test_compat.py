"""`make(env_id, compat="gymnax")` (gymnax's variants) and `register(id, factory)`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import RolloutWrapper
from popeval.environments import REGISTRY, make, register, registered_envs, render
from popeval.environments.compat import GYMNAX, ObservationView
from tests.helpers import sweep

MINATAR = [i for i in registered_envs if i.endswith("-MinAtar")]

#: Ids whose gymnax variant no parameter reproduces (docs/environments.md, "Differences from gymnax"):
#: another observation (Pong's pixels, PointRobot's, Reacher's and Swimmer's vectors).
#: MNISTBandit is absent: gymnax downloads MNIST when it builds it (no network here).
OBS_DIFFER = {"Pong-misc", "PointRobot-misc", "Reacher-misc", "Swimmer-misc"}


def first_steps(env, params, n=20, seed=0):
    """Observations, rewards and dones of `n` auto-reset steps with a fixed action stream."""
    key = jax.random.key(seed)
    obs, state = env.reset(key, params)
    out = [obs]
    for t in range(n):
        k_act, k_step = jax.random.split(jax.random.fold_in(key, t))
        obs, state, reward, done, _ = env.step(k_step, state, env.action_space(params).sample(k_act), params)
        out += [obs, reward, done]
    return jax.device_get(out)


@pytest.mark.parametrize("env_id", sweep(MINATAR))  # Breakout by default, every game under slow
def test_minatar_preset_is_gymnax_variant(env_id):
    env, params = make(env_id, compat="gymnax")
    plain, plain_params = make(env_id, sticky_action_prob=0.0)
    assert params.sticky_action_prob == 0.0
    assert params.max_steps_in_episode == (2500 if env_id.startswith("Freeway") else 1000)
    assert env.observation_space(params).dtype == jnp.float32
    assert env.name == env_id and env.unwrapped is not env
    ours = first_steps(env, params)
    base = first_steps(plain, plain_params)
    for a, b in zip(ours, base):  # the same game, observations as float32 0/1
        assert np.asarray(a).dtype != np.bool_ or np.asarray(b).dtype == np.bool_
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert ours[0].dtype == np.float32 and base[0].dtype == np.bool_


def test_preset_changes_and_overrides():
    env, params = make("DeepSea-bsuite", compat="gymnax")
    assert env.observation_space(params).shape == (8, 8)
    assert make("DeepSea-bsuite", compat="gymnax", size=12)[0].observation_space().shape == (12, 12)
    _, params = make("Breakout-MinAtar", compat="gymnax", max_steps_in_episode=50)
    assert params.max_steps_in_episode == 50 and params.sticky_action_prob == 0.0  # user kwargs win
    for chain in ("MemoryChain-bsuite", "UmbrellaChain-bsuite", "DiscountingChain-bsuite"):
        env, params = make(chain, compat="gymnax")
        base, base_params = make(chain)
        (n,) = env.observation_space(params).shape
        assert base.observation_space(base_params).shape == (1, n)
        obs, _ = env.reset(jax.random.key(0), params)
        np.testing.assert_array_equal(obs, base.reset(jax.random.key(0), base_params)[0][0])
        assert env.observation_space(params).contains(obs)
    env, params = make("FourRooms-misc", compat="gymnax")
    assert env.reset(jax.random.key(0), params)[0].dtype == jnp.int32
    same, _ = make("CartPole-v1", compat="gymnax")  # no preset: the environment itself
    assert type(same).__name__ == "CartPole"
    with pytest.raises(ValueError, match="compat='gym' is not a preset"):
        make("CartPole-v1", compat="gym")


def test_preset_views_roll_out_and_render():
    """A view is an Environment like any other: rollouts (MinAtar's default cap) and frames."""
    env, params = make("Breakout-MinAtar", compat="gymnax")
    w = RolloutWrapper(None, env=env, env_params=params, num_env_steps=30)
    out = w.population_fitness(jax.random.split(jax.random.key(0), 2), {"w": jnp.zeros((3, 1))})
    assert out.returns.shape == (3, 2)
    _, state = env.reset(jax.random.key(0), params)
    frames = render(env, params, [state])
    assert frames[0].ndim == 3 and frames[0].dtype == np.uint8


def test_gymnax_preset_matches_gymnax_spaces():
    """With the preset, every id's observations have gymnax's shapes and dtypes and its
    action spaces gymnax's sizes, except the documented differences."""
    gymnax = pytest.importorskip("gymnax")
    checked = 0
    for env_id in registered_envs:
        if env_id not in gymnax.registered_envs or env_id == "MNISTBandit-bsuite":
            continue
        env, params = make(env_id, compat="gymnax")
        genv, gparams = gymnax.make(env_id)
        # The observations themselves (gymnax declares int32 for Catch's float32 boards), traced only.
        ours = jax.eval_shape(env.reset, jax.random.key(0), params)[0]
        theirs = jax.eval_shape(genv.reset, jax.random.key(0), gparams)[0]
        same = (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype)
        assert same != (env_id in OBS_DIFFER), (env_id, ours, theirs)
        if env_id.endswith("-MinAtar") or env_id in {"Catch-bsuite", "DeepSea-bsuite"}:
            assert params.max_steps_in_episode <= gparams.max_steps_in_episode, env_id
        assert env.action_space(params).n == genv.action_space(gparams).n if hasattr(
            env.action_space(params), "n") else env.action_space(params).shape == genv.action_space(gparams).shape
        checked += 1
    assert checked >= 24
    assert set(GYMNAX) <= set(registered_envs)


def test_obs_view_requires_nothing_of_the_base():
    env, params = make("Catch-bsuite")
    view = ObservationView(env, jnp.int8, flatten=True)
    assert view.observation_space(params).shape == (50,) and view.observation_space(params).dtype == jnp.int8
    assert view.state_space(params).contains(view.reset(jax.random.key(1), params)[1])


# ----------------------------------------------------------------------------- register

def test_register_user_environment():
    from flax import struct

    from popeval.environments import Environment, EnvParams, EnvState, spaces

    @struct.dataclass
    class CounterState(EnvState):
        count: jax.Array

    @struct.dataclass
    class CounterParams(EnvParams):
        target: int = 3

    class Counter(Environment):
        stochastic = False

        @property
        def default_params(self):
            return CounterParams(max_steps_in_episode=10)

        def reset_state(self, key, params):
            return CounterState(time=jnp.int32(0), count=jnp.int32(0))

        def transition(self, key, state, action, params):
            state = state.replace(count=state.count + action)
            return state, (action == 1).astype(jnp.float32), state.count >= params.target

        def get_obs(self, state, params=None, key=None):
            return jnp.array([state.count], jnp.float32)

        def observation_space(self, params=None):
            return spaces.Box(0, 10, (1,))

        def action_space(self, params=None):
            return spaces.Discrete(2)

    try:
        register("Counter-test", Counter)
        assert "Counter-test" in registered_envs
        env, params = make("Counter-test", target=2)
        assert env.name == "Counter-test" and params.target == 2
        w = RolloutWrapper(lambda p, obs, key: jnp.int32(1), env_name="Counter-test")
        res = w.population_fitness(jax.random.split(jax.random.key(0), 2), {"w": jnp.zeros((2, 1))})
        np.testing.assert_array_equal(res.lengths, 3)  # target 3: the third step ends it
        with pytest.raises(ValueError, match="already registered"):
            register("Counter-test", Counter)
        with pytest.raises(ValueError, match="already registered"):
            register("CartPole-v1", Counter)
        with pytest.raises(TypeError, match="callable"):
            register("Other-test", 3)
        with pytest.raises(ValueError, match="must not be empty"):
            register("", Counter)
    finally:
        REGISTRY.pop("Counter-test", None)
        if "Counter-test" in registered_envs:
            registered_envs.remove("Counter-test")
