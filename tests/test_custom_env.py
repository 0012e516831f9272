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
    assert GymnaxLine.step_env is Environment.step_env  # the public method is popeval's


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
    config = EvolveConfig(env_name="GymnaxLine-v0", hidden_sizes=(4,), pop_size=8, num_rollouts=2,
                          num_generations=2, eval_every=2, eval_episodes=4, checkpoint_every=2)
    summary = evolve(config, RunOptions(run_dir=str(tmp_path / "run"), wandb="disabled", progress=False), sinks=[])
    assert summary["generations"] == 2 and np.isfinite(summary["mean_policy_return"])
