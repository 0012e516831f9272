"""The seed's Anakin demo (seed 003, DeepMind's Podracer notebook), reproduced for measurement.

This is the anchor that `python -m experiments.agents anakin --anchor` times in the same run as
`experiments.agents.anakin`: the notebook's `Catch` class, haiku network (flatten, Linear 256,
relu, Linear), greedy policy, `rlax.td_lambda` loss, per-environment parameter copies,
`pmean` over the batch axis `j` and the device axis `i`, `lax.fori_loop` of `iterations`
updates, and its timing (COMPILATION is the first call, which also runs it; EXECUTION the
second). Kept as the seed wrote it, except: keys are named `key`; `pmap` below runs on
devices chosen by `popeval.sharding` (`devices=None`: all, as the seed's `jax.devices()`); `jax.tree.map`
replaces the removed `jax.tree_map`; both timed calls block until their results are ready
(the seed's timer stops when the call returns, which for an asynchronous dispatch can be
before the work is done); `run_experiment` returns its timings.

haiku and rlax are imported when the anchor runs, never by popeval itself:
`pip install "popeval[bench]"` (seen to work: dm-haiku 0.0.17, rlax 0.1.9, jax 0.10.2).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax
from jax import lax, random

from experiments.agents.anakin import TimeIt
from popeval import sharding

__all__ = ["Catch", "TimeStep", "get_network_fn", "get_learner_fn", "run_experiment", "pmap"]


def pmap(fn, devices=None, axis_name: str = sharding.AXIS):
    """`jax.pmap(fn, axis_name)` over `sharding.resolve_devices(devices)` (default: every
    local device), compiled with JAX's defaults on the first call."""
    return jax.pmap(fn, axis_name=axis_name, devices=sharding.resolve_devices(devices))


class Catch:
    """The seed's JAX Catch: the state is `(ball_y, ball_x, paddle_y, paddle_x)`; the terminal
    state is observed (reward +-1, discount 0) and the next step resets."""

    def __init__(self, rows: int = 10, columns: int = 5):
        self._rows = rows
        self._columns = columns
        self.num_actions = 3

    def initial_state(self, key):
        ball_x = random.randint(key, (), 0, self._columns)
        state = jnp.array((0, ball_x, self._rows - 1, self._columns // 2), dtype=jnp.int32)
        return lax.stop_gradient(state)

    def step(self, key, state, action):
        is_terminal = self.is_terminal(state)
        paddle_x = jnp.clip(state[3] + action - 1, 0, self._columns - 1)
        state = jnp.array([state[0] + 1, state[1], state[2], paddle_x])
        return lax.stop_gradient(lax.select(is_terminal, self.initial_state(key), state))

    def observation(self, state):
        return self.render(state), self.reward(state), self.discount(state), self.is_terminal(state)

    def render(self, state):
        def cell(y, x):
            ball = jnp.bitwise_and(y == state[0], x == state[1])
            paddle = jnp.bitwise_and(y == state[2], x == state[3])
            return lax.select(jnp.bitwise_or(ball, paddle), 1.0, 0.0)

        ys = jnp.repeat(jnp.arange(self._rows), self._columns)
        xs = jnp.tile(jnp.arange(self._columns), self._rows)
        return jax.vmap(cell)(ys, xs).reshape((self._rows, self._columns, 1))

    def reward(self, state):
        caught = lax.select(state[1] == state[3], 1.0, -1.0)
        return lax.select(self.is_terminal(state), caught, 0.0)

    def discount(self, state):
        return lax.select(self.is_terminal(state), 0.0, 1.0)

    def is_terminal(self, state):
        return state[0] == self._rows - 1


@chex.dataclass(frozen=True)
class TimeStep:
    q_values: chex.Array
    action: chex.Array
    discount: chex.Array
    reward: chex.Array


def get_network_fn(num_outputs: int):
    """The seed's haiku MLP: flatten, Linear(256), relu, Linear(num_outputs)."""
    import haiku as hk

    def network_fn(obs):
        return hk.Sequential([hk.Flatten(), hk.Linear(256), jax.nn.relu, hk.Linear(num_outputs)])(obs)

    return hk.without_apply_rng(hk.transform(network_fn))


def get_learner_fn(env, forward_pass, opt_update, rollout_len, agent_discount, lambda_, iterations):
    """The seed's unit of computation: `learner_fn(params, opt_state, keys, env_states)`."""
    import rlax

    def loss_fn(params, outer_key, env_state):
        def step_fn(env_state, key):
            obs, reward, discount, _ = env.observation(env_state)
            q_values = forward_pass(params, obs[None,])[0]
            action = jnp.argmax(q_values)  # greedy policy
            env_state = env.step(key, env_state, action)
            return env_state, TimeStep(q_values=q_values, action=action, discount=discount, reward=reward)

        step_keys = random.split(outer_key, rollout_len)
        env_state, rollout = lax.scan(step_fn, env_state, step_keys)
        qa_tm1 = rlax.batched_index(rollout.q_values[:-1], rollout.action[:-1])
        td_error = rlax.td_lambda(v_tm1=qa_tm1, r_t=rollout.reward[1:],
                                  discount_t=agent_discount * rollout.discount[1:],
                                  v_t=jnp.max(rollout.q_values[1:], axis=-1), lambda_=lambda_)
        return jnp.mean(td_error ** 2), env_state

    def update_fn(params, opt_state, key, env_state):
        key, loss_key = random.split(key)
        grads, new_env_state = jax.grad(loss_fn, has_aux=True)(params, loss_key, env_state)
        grads = lax.pmean(grads, axis_name="j")  # over the batch
        grads = lax.pmean(grads, axis_name="i")  # over the devices
        updates, new_opt_state = opt_update(grads, opt_state)
        new_params = optax.apply_updates(params, updates)
        return new_params, new_opt_state, key, new_env_state

    def learner_fn(params, opt_state, keys, env_states):
        batched_update_fn = jax.vmap(update_fn, axis_name="j")

        def iterate_fn(_, val):
            return batched_update_fn(*val)

        return lax.fori_loop(0, iterations, iterate_fn, (params, opt_state, keys, env_states))

    return learner_fn


def run_experiment(env, batch_size, rollout_len, step_size, iterations, seed, devices=None, quiet=False):
    """The seed's `run_experiment` (`batch_size` environments per device); returns
    `{"devices", "frames", "compile_s", "execute_s", "fps"}` of its two timed calls."""
    cores_count = len(sharding.resolve_devices(devices))
    network = get_network_fn(env.num_actions)
    optim = optax.adam(step_size)

    key, key_e, key_p = random.split(random.PRNGKey(seed), num=3)
    dummy_obs = env.render(env.initial_state(key_e))[None,]
    params = network.init(key_p, dummy_obs)
    opt_state = optim.init(params)

    learn = get_learner_fn(env, network.apply, optim.update, rollout_len=rollout_len,
                           agent_discount=1, lambda_=0.99, iterations=iterations)
    learn = pmap(learn, devices, axis_name="i")

    def broadcast(x):
        return jnp.broadcast_to(x, (cores_count, batch_size) + x.shape)

    params = jax.tree.map(broadcast, params)
    opt_state = jax.tree.map(broadcast, opt_state)

    key, *env_keys = random.split(key, cores_count * batch_size + 1)
    env_states = jax.vmap(env.initial_state)(jnp.stack(env_keys))
    key, *step_keys = random.split(key, cores_count * batch_size + 1)

    def reshape(x):
        return x.reshape((cores_count, batch_size) + x.shape[1:])

    step_keys = reshape(jnp.stack(step_keys))
    env_states = reshape(env_states)

    with TimeIt("COMPILATION", quiet=quiet) as compiled:
        jax.block_until_ready(learn(params, opt_state, step_keys, env_states))

    num_frames = cores_count * iterations * rollout_len * batch_size
    with TimeIt("EXECUTION", frames=num_frames, quiet=quiet) as executed:
        params, opt_state, step_keys, env_states = jax.block_until_ready(
            learn(params, opt_state, step_keys, env_states))
    return {"devices": cores_count, "frames": num_frames, "compile_s": compiled.elapsed_secs,
            "execute_s": executed.elapsed_secs, "fps": executed.fps}
