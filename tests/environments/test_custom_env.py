"""Custom environments written popeval's way or gymnax's way, registered and made.

One toy task (walk along a line to a goal) is written twice: with popeval's
`reset_state` / `transition` / `get_obs`, and as gymnax 1.0's documentation shows a custom
environment (a subscripted `Environment[S, P]` base, raw `reset_env` / `step_env` that count
`time` themselves, a `**kwargs` factory). Both must give the same trajectories through
`step`'s auto-reset, the rollouts, the fitness path and `evolve`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from popeval import RolloutWrapper
from popeval.environments import Environment, EnvParams, EnvState, make, register, spaces
from popeval.environments import registry as registry_lib
from popeval.environments.classic_control import CartPole


@struct.dataclass
class LineState(EnvState):
    x: jax.Array


@struct.dataclass
class LineParams(EnvParams):
    goal: float = 0.35
    max_steps_in_episode: int = 6


def _start(key):
    return jax.random.uniform(key, (), minval=-0.2, maxval=0.2)


class PopevalLine(Environment):
    """The task in popeval's contract."""

    def __init__(self, step_size: float = 0.1):
        self.step_size = step_size

    @property
    def default_params(self):
        return LineParams()

    def reset_state(self, key, params):
        return LineState(time=jnp.int32(0), x=_start(key))

    def transition(self, key, state, action, params):
        state = state.replace(x=state.x + jnp.where(action == 1, self.step_size, -self.step_size))
        return state, state.x, state.x >= params.goal

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.x, state.time.astype(jnp.float32)])

    def observation_space(self, params=None):
        return spaces.Box(-jnp.inf, jnp.inf, (2,))

    def action_space(self, params=None):
        return spaces.Discrete(2)


class GymnaxLine(Environment[LineState, LineParams]):
    """The same task in gymnax 1.0's contract."""

    def __init__(self, step_size: float = 0.1, **kwargs):
        self.step_size = step_size

    @property
    def default_params(self):
        return LineParams()

    def reset_env(self, key, params):
        state = LineState(time=0, x=_start(key))
        return self.get_obs(state), state

    def step_env(self, key, state, action, params):
        x = state.x + jnp.where(action == 1, self.step_size, -self.step_size)
        state = LineState(time=state.time + 1, x=x)
        return self.get_obs(state), state, x, x >= params.goal, {"x": x}

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.x, jnp.asarray(state.time, jnp.float32)])

    def observation_space(self, params=None):
        return spaces.Box(-jnp.inf, jnp.inf, (2,))

    def action_space(self, params=None):
        return spaces.Discrete(2)


@pytest.fixture
def fresh_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(registry_lib, "REGISTRY", dict(registry_lib.REGISTRY))
    monkeypatch.setattr(registry_lib, "registered_envs", list(registry_lib.registered_envs))


def _trajectory(env, params, actions):
    def body(carry, inputs):
        key, action = inputs
        obs, state, reward, done, info = env.step(key, carry, action, params)
        return state, (obs, state, reward, done, info["terminated"], info["truncated"], info["final_observation"])

    _, state = env.reset(jax.random.key(0), params)
    keys = jax.random.split(jax.random.key(1), len(actions))
    return jax.lax.scan(body, state, (keys, actions))[1]


def test_the_gymnax_contract_gives_popeval_s_trajectories():
    actions = jnp.asarray(np.random.default_rng(0).integers(0, 2, 40), jnp.int32)
    mine, theirs = PopevalLine(), GymnaxLine()
    ours = _trajectory(mine, mine.default_params, actions)
    adapted = _trajectory(theirs, theirs.default_params, actions)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(adapted)):
        np.testing.assert_array_equal(a, b)
    terminated, truncated = np.asarray(ours[4]), np.asarray(ours[5])
    assert terminated.any() and truncated.any()  # both ends of an episode are exercised


def test_a_gymnax_contract_environment_has_popeval_s_api():
    env = GymnaxLine()
    params = env.default_params
    obs, state = env.reset(jax.random.key(0), params)  # eager: the jitted dispatch
    assert env.state_space(params).contains(state)
    assert env.observation_space(params).contains(obs)
    obs, state, reward, done, info = env.step_env(jax.random.key(1), state, jnp.int32(5), params)
    assert float(state.x) == pytest.approx(float(obs[0]))  # action 5 clips to 1: a step forward
    assert set(info) == {"x", "terminated", "truncated", "discount"} and reward.dtype == jnp.float32


def test_auto_reset_of_a_custom_environment_at_both_ends():
    env, params = GymnaxLine(), LineParams(goal=10.0, max_steps_in_episode=3)
    _, state = env.reset(jax.random.key(0), params)
    for t in range(3):
        obs, next_state, _, done, info = env.step(jax.random.key(t + 1), state, jnp.int32(1), params)
        assert bool(done) == (t == 2) and not bool(info["terminated"]) and bool(info["truncated"]) == (t == 2)
        state = next_state
    assert int(state.time) == 0 and float(obs[1]) == 0.0  # the new episode's first observation
    assert float(info["final_observation"][1]) == 3.0  # the ended one's last
    near = params.replace(goal=-1.0)  # the first step terminates
    obs, state, _, done, info = env.step(jax.random.key(9), env.reset(jax.random.key(0), near)[1], 1, near)
    assert bool(done) and bool(info["terminated"]) and not bool(info["truncated"]) and int(state.time) == 0


class Doubled(CartPole):
    """A built-in environment changed in a subclass, gymnax's way: through `super()`."""

    def step_env(self, key, state, action, params=None):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, 2.0 * reward, done, info

    def reset_env(self, key, params=None):
        obs, state = super().reset_env(key, params)
        state = state.replace(x=state.x + 0.25)
        return self.get_obs(state, params), state


def test_a_subclass_reaches_its_parent_s_raw_methods_through_super():
    base, params = make("CartPole-v1", max_steps_in_episode=6)
    actions = jnp.asarray(np.random.default_rng(1).integers(0, 2, 40), jnp.int32)
    ours, theirs = _trajectory(base, params, actions), _trajectory(Doubled(), params, actions)
    obs, _, reward, done, terminated, truncated, _ = theirs
    np.testing.assert_array_equal(reward, 2.0 * ours[2])
    np.testing.assert_array_equal(done, ours[3])
    np.testing.assert_array_equal(terminated, ours[4])
    np.testing.assert_array_equal(truncated, ours[5])
    assert np.asarray(truncated).any()  # the time limit still truncates through the override
    fresh = np.asarray(done)
    np.testing.assert_allclose(np.asarray(obs)[fresh, 0], np.asarray(ours[0])[fresh, 0] + 0.25, atol=1e-6)
    env = Doubled()  # eager calls: one jitted dispatch each, the same numbers
    obs, state = env.reset(jax.random.key(0), params)
    assert float(obs[0]) == pytest.approx(float(base.reset(jax.random.key(0), params)[0][0]) + 0.25)
    assert float(env.step_env(jax.random.key(1), state, 1, params)[2]) == 2.0
    assert float(env.step(jax.random.key(1), state, 1, params)[2]) == 2.0


class _RawLineMethods:
    """gymnax-way raw methods that come from a mixin, not from the class itself."""

    reset_env = GymnaxLine.reset_env.__wrapped__
    step_env = GymnaxLine.step_env.__wrapped__


class MixinLine(_RawLineMethods, PopevalLine):
    get_obs = GymnaxLine.get_obs  # the raw reset's `time` is a Python int


def test_raw_methods_from_a_mixin_are_adapted():
    actions = jnp.asarray(np.random.default_rng(2).integers(0, 2, 40), jnp.int32)
    ours, mixed = PopevalLine(), MixinLine()
    for a, b in zip(jax.tree.leaves(_trajectory(ours, ours.default_params, actions)),
                    jax.tree.leaves(_trajectory(mixed, mixed.default_params, actions))):
        np.testing.assert_array_equal(a, b)
    assert set(mixed.step_env(jax.random.key(1), mixed.reset(jax.random.key(0))[1], 1)[4]) == {
        "x", "terminated", "truncated", "discount"}  # the mixin's info, and popeval's


@struct.dataclass
class CountdownParams(EnvParams):
    horizon: int = 3


class Countdown(Environment):
    """gymnax's smallest contract: raw methods built from gymnax's helpers, and neither
    `default_params` nor `action_space` (gymnax's base requires neither)."""

    def reset_env(self, key, params):
        state = EnvState(time=jnp.int32(0))
        return self.observe(key, state, None, params), state

    def step_env(self, key, state, action, params):
        state = EnvState(time=state.time + 1)
        info = {"own_discount": self.discount(state, params)}
        return self.observe(key, state, action, params), state, action * 1.5, self.is_terminal(state, params), info

    def get_obs(self, state, params=None, key=None):
        return state.time.astype(jnp.float32)

    def is_terminated(self, state, params):
        return state.time >= params.horizon


def test_gymnax_s_helpers_and_a_class_without_default_params_or_action_space():
    env, params = Countdown(), CountdownParams(horizon=3, max_steps_in_episode=10)
    obs, state = env.reset(jax.random.key(0), params)  # a params type of its own is accepted
    for t in (1, 2, 3):
        obs, state, reward, done, info = env.step_env(jax.random.key(t), state, jnp.float32(2.0), params)
        assert float(obs) == t and float(reward) == 3.0  # unchecked: no action space, as in gymnax
        assert bool(done) == bool(info["terminated"]) == bool(env.is_terminal(state, params)) == (t == 3)
        assert float(info["own_discount"]) == float(info["discount"]) == float(env.discount(state, params))
        assert float(info["discount"]) == (0.0 if t == 3 else 1.0) and not bool(info["truncated"])
    obs, state, *_ = env.step(jax.random.key(4), state, jnp.float32(0.0), params)
    assert int(state.time) == 0 and float(obs) == 0.0  # auto-reset after the terminal step
    assert isinstance(env.default_params, EnvParams) and env.default_params.max_steps_in_episode == 1000
    with pytest.raises(NotImplementedError, match="PopevalLine does not define is_terminated"):
        PopevalLine().is_terminal(state, params)


def test_register_passes_make_s_keywords_to_a_kwargs_factory(fresh_registry):
    calls = []

    def factory(**kwargs):
        calls.append(kwargs)
        return GymnaxLine(**kwargs)

    register("KwargsLine-v0", factory)
    first, first_params = make("KwargsLine-v0", step_size=0.2, goal=0.5)
    second, _ = make("KwargsLine-v0", step_size=0.3)
    assert calls == [{"step_size": 0.2, "goal": 0.5}, {"step_size": 0.3}]
    assert first is not second and (first.step_size, second.step_size) == (0.2, 0.3)
    assert first_params.goal == 0.5  # an EnvParams field is set on the params as well
    register("CtorKwargsLine-v0", GymnaxLine)  # the class itself takes **kwargs
    env, params = make("CtorKwargsLine-v0", step_size=0.5, max_steps_in_episode=9)
    assert env.step_size == 0.5 and params.max_steps_in_episode == 9


def test_register_and_make_refuse_bad_ids_and_factories(fresh_registry):
    with pytest.raises(TypeError, match="must be a string"):
        register(1, PopevalLine)
    with pytest.raises(ValueError, match="must not be empty"):
        register("", PopevalLine)
    with pytest.raises(TypeError, match="callable"):
        register("NotCallable-v0", object())
    with pytest.raises(ValueError, match="already registered"):
        register("CartPole-v1", PopevalLine)
    register("NoEnv-v0", object)
    with pytest.raises(TypeError, match="NoEnv-v0.*must return a Gymnax Environment or a popeval Environment"):
        make("NoEnv-v0")
    with pytest.raises(TypeError, match="must be a string"):
        make(3)
    with pytest.raises(ValueError, match="not in registered_envs"):
        make("NotRegistered-v0")
    register("NamedLine-v0", PopevalLine)
    with pytest.raises(ValueError, match="unknown keyword argument.*colour"):
        make("NamedLine-v0", colour=1)


def test_both_contracts_give_the_same_fitness(fresh_registry):
    register("PopevalLine-v0", PopevalLine)
    register("GymnaxLine-v0", lambda **kwargs: GymnaxLine(**kwargs))
    population = {"w": jax.random.normal(jax.random.key(2), (5, 2))}
    keys = jax.random.split(jax.random.key(3), 3)

    def policy(params, obs, key):
        return (obs @ params["w"] > 0).astype(jnp.int32)

    results = []
    for env_id in ("PopevalLine-v0", "GymnaxLine-v0"):
        env, params = make(env_id)
        manager = RolloutWrapper(policy, env_name=env_id, env_params=params, num_env_steps=12)
        fitness = manager.population_fitness(keys, population)
        rollout = manager.population_rollout(keys, population, env_params=params)
        np.testing.assert_array_equal(fitness.returns, rollout[-1])  # the trajectory path's cum_return
        results.append(fitness)
    for a, b in zip(results[0], results[1]):
        np.testing.assert_array_equal(a, b)


def test_evolve_runs_a_gymnax_contract_environment(fresh_registry, tmp_path):
    from strategies import EvolveConfig, RunOptions, evolve

    register("GymnaxLine-v0", lambda **kwargs: GymnaxLine(**kwargs))
    config = EvolveConfig.from_flat(env_name="GymnaxLine-v0", hidden_sizes=(4,), pop_size=8, num_rollouts=2,
                          num_generations=2, eval_every=2, eval_episodes=4, checkpoint_every=2)
    summary = evolve(config, RunOptions(run_dir=str(tmp_path / "run"), wandb="disabled", progress=False), sinks=[])
    assert summary["generations"] == 2 and np.isfinite(summary["mean_policy_return"])


# ------------------------------------------------------------------ mistakes in one line (issue 61 N11)
def test_register_refuses_ids_that_are_not_safe_names(fresh_registry):
    for env_id, why in [("../../escape-v0", "a path separator"), ("a/b", "a path separator"),
                        ("a\\b", "a path separator"), ("..escape", "'..'"), ("Line-v0\n", "whitespace"),
                        (" Line-v0", "whitespace"), ("Line v0", "whitespace"),
                        ("Line\x00-v0", "whitespace or a control character")]:
        with pytest.raises(ValueError, match=f"register: .* is not a safe environment id \\({why}") as refused:
            register(env_id, PopevalLine)
        assert "\n" not in str(refused.value) and env_id not in registry_lib.REGISTRY
    register("My_Line.v0-test", PopevalLine)  # letters, digits, - _ . and a single dot are fine


class WideObservation(PopevalLine):
    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.x, state.x, state.time.astype(jnp.float32)])  # (3,) under a space of (2,)


class IntegerReset(GymnaxLine):
    def reset_env(self, key, params):
        obs, state = super().reset_env.__wrapped__(self, key, params)
        return obs.astype(jnp.int32), state  # step_env's are float32


class VectorReward(PopevalLine):
    def transition(self, key, state, action, params):
        state, reward, done = super().transition(key, state, action, params)
        return state, jnp.stack([reward, reward]), done


class VectorDone(PopevalLine):
    def transition(self, key, state, action, params):
        state, reward, done = super().transition(key, state, action, params)
        return state, reward, jnp.stack([done, done])


@pytest.mark.parametrize("cls, words", [
    (WideObservation, "reset_env returns an observation of shape (3,), but observation_space has shape (2,)"),
    (IntegerReset, "step_env returns observation as float32 (2,), reset_env as int32 (2,)"),
    (VectorReward, "step_env returns a reward of shape (2,), expected a scalar ()"),
    (VectorDone, "step_env returns a done of shape (2,), expected a scalar ()"),
])
def test_an_environment_that_disagrees_with_its_spaces_is_named_before_compiling(fresh_registry, cls, words):
    register("Faulty-v0", cls)
    with pytest.raises(ValueError) as refused:
        RolloutWrapper(None, env_name="Faulty-v0", num_env_steps=4)
    assert str(refused.value) == f"Faulty-v0: {words}"


@pytest.mark.parametrize("params", [{"max_steps_in_episode": 6}, None])
def test_default_params_that_are_no_dataclass_get_one_line(fresh_registry, params):
    class Untyped(PopevalLine):
        @property
        def default_params(self):
            return params

    register("Untyped-v0", Untyped)
    with pytest.raises(TypeError, match=f"Untyped-v0: default_params must return an EnvParams instance .*got "
                                        f"{type(params).__name__}"):
        make("Untyped-v0")
    with pytest.raises(TypeError, match="default_params must return an EnvParams instance"):
        RolloutWrapper(None, env=Untyped(), num_env_steps=4)


class NaNReward(PopevalLine):
    def transition(self, key, state, action, params):
        state, reward, done = super().transition(key, state, action, params)
        return state, reward * jnp.nan, done


def test_evolve_warns_when_every_return_of_its_first_generation_is_not_finite(fresh_registry, tmp_path, caplog):
    import logging

    from strategies import EvolveConfig, RunOptions, evolve

    register("NaNLine-v0", NaNReward)
    config = EvolveConfig.from_flat(env_name="NaNLine-v0", hidden_sizes=(4,), pop_size=8, num_rollouts=1,
                          num_generations=2, eval_every=2, eval_episodes=2, checkpoint_every=2)
    with caplog.at_level(logging.WARNING, logger="popeval"):
        evolve(config, RunOptions(run_dir=str(tmp_path / "run"), wandb="disabled", progress=False), sinks=[])
    warnings = [r.getMessage() for r in caplog.records if "NaN or infinite" in r.getMessage()]
    assert len(warnings) == 1 and "generation 1" in warnings[0] and "NaNLine-v0's step_env" in warnings[0], warnings
