"""DQN compiled into one program: environment, replay buffer, epsilon-greedy and update.

Mnih et al. (2013, 2015), as in seed 002's blog post "CartPole with JAX": an MLP Q-network
(300-relu-100-relu-n_actions), experience replay, epsilon-greedy, a target network, Q(s, a)
regressed on `y = r + gamma * (1 - terminated) * max_a' Q_target(s', a')`: y = r at a
termination (the seed's y = 0 is a bug); a truncation bootstraps from the true last obs.
`make_dqn(config)`: pure functions of one seed's `DQNState`; the environment, a ring buffer
of preallocated device arrays, action selection and the update are one `lax.scan`. `train`
`vmap`s them over seeds in one program run in chunks of `eval_every` steps, evaluating each
seed's greedy policy between chunks with `RolloutWrapper` (the learning curve; a seed whose
point reaches `stop_return` keeps those parameters: early stopping, as the ES's stop at
target). `experiments.agents.dqn_seed`: the seed's Python loop, for comparison.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from popeval.environments import make
from popeval.rollout import RolloutWrapper
from popeval.typed_config import check_types

__all__ = ["DQNConfig", "plan", "epsilon_schedule", "QNetwork", "Transition", "ReplayBuffer", "buffer_init",
           "buffer_add", "buffer_sample", "bellman_target", "make_update", "DQNState", "DQN", "make_dqn", "train"]


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """A DQN experiment. Step counts are environment steps of one seed."""

    env_name: str = "CartPole-v1"
    seed: int = 0
    num_seeds: int = 5  # independent runs, vmapped in one program
    total_steps: int = 100_000  # per seed, warm-up included (rounded up to whole chunks)
    num_envs: int = 4  # parallel environments per seed
    train_every: int = 1  # vector steps per gradient update
    hidden_sizes: tuple = (300, 100)
    buffer_size: int = 100_000
    batch_size: int = 64
    gamma: float = 0.99
    learning_rate: float = 1e-3
    lr_decay: bool = True  # linear decay to 0 over the run: the final policy settles
    loss: str = "mse"  # "mse" (the seed's) or "huber" (delta 1); Adam, not the seed's SGD
    max_grad_norm: float = 10.0  # gradients clipped by global norm
    learning_starts: int = 1_000  # steps with updates off, filling the buffer
    target_update_every: int = 100  # gradient updates between target-network copies
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_fraction: float = 0.2  # share of total_steps over which epsilon decays linearly
    eval_every: int = 10_000  # steps per compiled chunk; the curve gets a point after each
    curve_episodes: int = 20  # greedy episodes per seed for each point of the curve
    eval_episodes: int = 100  # greedy episodes per seed at the end (other episodes)
    target_return: float = 475.0  # a seed solves the task when its final mean reaches it
    stop_return: float | None = 500.0  # a seed whose curve point reaches it stops learning

    def __post_init__(self):
        check_types(self)  # TypeError naming the key; YAML's 1 -> 1.0 for a float
        for name in ("num_seeds", "total_steps", "num_envs", "train_every", "buffer_size", "batch_size",
                     "target_update_every", "eval_every", "curve_episodes", "eval_episodes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config key {name!r} must be positive, got {getattr(self, name)!r}")
        if self.loss not in ("huber", "mse"):
            raise ValueError(f"config key 'loss' must be 'huber' or 'mse', got {self.loss!r}")
        if not self.batch_size <= self.learning_starts <= self.buffer_size:
            raise ValueError(f"config key 'learning_starts' ({self.learning_starts}): from batch_size to buffer_size")


def plan(config: DQNConfig) -> tuple[int, int, int]:
    """`(warm-up vector steps, updates per chunk, chunks)`: whole chunks up to total_steps."""
    warmup = -(-config.learning_starts // config.num_envs)
    chunks = max(1, -(-(config.total_steps - warmup * config.num_envs) // config.eval_every))
    return warmup, max(1, config.eval_every // (config.num_envs * config.train_every)), chunks


def epsilon_schedule(config: DQNConfig) -> optax.Schedule:
    """Epsilon against environment steps taken: linear decay, then constant."""
    return optax.linear_schedule(config.epsilon_start, config.epsilon_end,
                                 max(1, int(config.epsilon_fraction * config.total_steps)))


class QNetwork(nn.Module):
    """MLP from a vector observation to one value per action (the seed's 300-relu-100-relu-2)."""

    num_actions: int
    hidden_sizes: tuple = (300, 100)

    @nn.compact
    def __call__(self, obs):
        for size in self.hidden_sizes:
            obs = nn.relu(nn.Dense(size)(obs))
        return nn.Dense(self.num_actions)(obs)


class Transition(NamedTuple):
    obs: jax.Array  # (..., *obs_shape)
    action: jax.Array  # (...,) int32
    reward: jax.Array  # (...,) float32
    next_obs: jax.Array  # (..., *obs_shape), the true one also where an episode ended
    terminated: jax.Array  # (...,) float32: 1 at a termination, 0 otherwise (truncation too)


class ReplayBuffer(NamedTuple):
    """A ring buffer: preallocated arrays, the next slot to write, the count of filled slots."""

    data: Transition  # every leaf (capacity, ...)
    position: jax.Array  # () int32
    size: jax.Array  # () int32


def buffer_init(capacity: int, example: Transition) -> ReplayBuffer:
    """An empty buffer of `capacity` slots shaped like one unbatched `example` transition."""
    data = jax.tree.map(lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example)
    return ReplayBuffer(data, jnp.int32(0), jnp.int32(0))


def buffer_add(buffer: ReplayBuffer, batch: Transition) -> ReplayBuffer:
    """Writes `n` transitions (leading axis n) after the newest, overwriting the oldest."""
    capacity, n = buffer.data.reward.shape[0], batch.reward.shape[0]
    index = (buffer.position + jnp.arange(n)) % capacity
    data = jax.tree.map(lambda d, x: d.at[index].set(x.astype(d.dtype)), buffer.data, batch)
    return ReplayBuffer(data, (buffer.position + n) % capacity, jnp.minimum(buffer.size + n, capacity))


def buffer_sample(buffer: ReplayBuffer, key: jax.Array, batch_size: int) -> Transition:
    """`batch_size` transitions drawn uniformly, with replacement, from the filled slots."""
    index = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1))
    return jax.tree.map(lambda d: d[index], buffer.data)


def bellman_target(reward, terminated, next_q, gamma):
    """`r + gamma * (1 - terminated) * max_a' Q_target(s', a')`: a truncation bootstraps."""
    return reward + gamma * (1.0 - terminated) * jnp.max(next_q, axis=-1)


def make_update(config: DQNConfig, q_net: QNetwork):
    """`(optimizer, update)`: `update(params, target_params, opt_state, batch) -> (params,
    opt_state, loss)`, one gradient step of Huber or half-squared TD error (also the anchor's)."""
    _, n, chunks = plan(config)  # lr decays over every update of the run
    lr = optax.linear_schedule(config.learning_rate, 0.0, n * chunks) if config.lr_decay else config.learning_rate
    opt = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr))

    def loss_fn(params, target_params, batch):
        q = q_net.apply(params, batch.obs)
        q_taken = jnp.take_along_axis(q, batch.action[:, None].astype(jnp.int32), axis=-1)[:, 0]
        next_q = q_net.apply(target_params, batch.next_obs)
        y = bellman_target(batch.reward, batch.terminated, next_q, config.gamma)
        td = q_taken - jax.lax.stop_gradient(y)
        return jnp.mean(optax.huber_loss(td, delta=1.0) if config.loss == "huber" else 0.5 * td**2)

    def update(params, target_params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, target_params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return opt, update


class DQNState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    buffer: ReplayBuffer
    env_state: Any  # (num_envs, ...)
    obs: jax.Array  # (num_envs, *obs_shape)
    episode_return: jax.Array  # (num_envs,) of the running episodes
    steps: jax.Array  # () int32, environment steps taken (all envs)
    updates: jax.Array  # () int32, gradient updates taken
    key: jax.Array


class DQN(NamedTuple):
    """Pure functions of one seed's state (`train` vmaps and jits them)."""

    init: Callable  # key -> DQNState after the warm-up: learning_starts steps, no update
    train_chunk: Callable  # state -> (state, metrics): eval_every steps with updates
    policy: Callable  # (params, obs, key) -> greedy action, for RolloutWrapper
    env: Any
    env_params: Any


def make_dqn(config: DQNConfig) -> DQN:
    """The pure functions of a DQN run (closing over the config's static values)."""
    env, env_params = make(config.env_name)
    num_actions = env.action_space(env_params).n
    q_net = QNetwork(num_actions, tuple(config.hidden_sizes))
    (opt, update_params), epsilon = make_update(config, q_net), epsilon_schedule(config)
    warmup_steps, updates_per_chunk, _ = plan(config)

    def policy(params, obs, key):
        return jnp.argmax(q_net.apply(params, obs), axis=-1)

    def env_step(keys, env_state, action):
        # env.step's auto-reset written out: env.step returns the next episode's first obs,
        # the buffer needs the true last one to bootstrap a truncation. keys: (step, reset).
        next_obs, next_state, reward, done, info = env.step_env(keys[0], env_state, action, env_params)
        reset_obs, reset_state = env.reset_env(keys[1], env_params)
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), reset_state, next_state)
        return jnp.where(done, reset_obs, next_obs), state, next_obs, reward, done, info["terminated"]

    def init(key):
        key, key_net, key_reset = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset_env, (0, None))(jax.random.split(key_reset, config.num_envs), env_params)
        params = q_net.init(key_net, obs[0])
        example = Transition(obs[0], jnp.int32(0), jnp.float32(0), obs[0], jnp.float32(0))
        state = DQNState(params, params, opt.init(params), buffer_init(config.buffer_size, example),
                         env_state, obs, jnp.zeros(config.num_envs), jnp.int32(0), jnp.int32(0), key)
        return jax.lax.scan(act_and_store, state, None, warmup_steps)[0]

    def act_and_store(state: DQNState, _):
        """One vector step: epsilon-greedy actions, environment steps, buffer writes."""
        key, key_act, key_env = jax.random.split(state.key, 3)  # few draws: XLA compiles a hash each
        greedy = policy(state.params, state.obs, None)
        coin, pick = jax.random.uniform(key_act, (2, *greedy.shape))
        random = jnp.minimum((pick * num_actions).astype(jnp.int32), num_actions - 1)
        action = jnp.where(coin < epsilon(state.steps), random, greedy)
        keys = jax.random.split(key_env, (config.num_envs, 2))
        obs, env_state, next_obs, reward, done, terminated = jax.vmap(env_step)(keys, state.env_state, action)
        batch = Transition(state.obs, action, reward, next_obs, terminated.astype(jnp.float32))
        ep_return = state.episode_return + reward
        state = state._replace(buffer=buffer_add(state.buffer, batch), env_state=env_state, obs=obs,
                               episode_return=jnp.where(done, 0.0, ep_return),
                               steps=state.steps + config.num_envs, key=key)
        return state, (jnp.sum(jnp.where(done, ep_return, 0.0)), jnp.sum(done))

    def update(state: DQNState, _):
        """`train_every` vector steps, then one gradient step and maybe a target copy."""
        state, finished = jax.lax.scan(act_and_store, state, None, config.train_every)
        key, key_sample = jax.random.split(state.key)
        batch = buffer_sample(state.buffer, key_sample, config.batch_size)
        params, opt_state, loss = update_params(state.params, state.target_params, state.opt_state, batch)
        count = state.updates + 1
        target = optax.periodic_update(params, state.target_params, count, config.target_update_every)
        state = state._replace(params=params, target_params=target, opt_state=opt_state, updates=count, key=key)
        return state, (loss, *jax.tree.map(jnp.sum, finished))

    def train_chunk(state):
        state, (loss, returns, episodes) = jax.lax.scan(update, state, None, updates_per_chunk)
        return state, {"loss": jnp.mean(loss), "epsilon": epsilon(state.steps),
                       "episode_return": jnp.sum(returns) / jnp.maximum(jnp.sum(episodes), 1)}

    return DQN(init, train_chunk, policy, env, env_params)


def train(config: DQNConfig, log: Callable[[int, dict], None] = lambda step, metrics: None) -> dict:
    """Trains `num_seeds` seeds in one vmapped program; evaluates their greedy policies.

    Args:
        config: the experiment.
        log: `log(env_steps_per_seed, metrics)` after each chunk, flat `/` keys: `return/mean|
            min|max` (over seeds of their mean greedy return), `train/loss|epsilon|episode_return`.

    Returns:
        `returns` (num_seeds,) each seed's mean greedy return over `eval_episodes`, `solved`
        (seeds reaching `target_return`), `env_steps` per seed, `compile_s`, `run_s` (training),
        `eval_s` (its compilation included), `steps_per_s` (all seeds, over run_s), `stopped_at`
        (per seed: env steps when it stopped learning, 0 if never), `state` (final, axis 0 seeds).
    """
    dqn = make_dqn(config)
    # compaction=False: good policies run every episode to the limit, there is nothing to gather.
    manager = RolloutWrapper(dqn.policy, env=dqn.env, env_params=dqn.env_params, compaction=False)
    key_seeds, key_eval = jax.random.split(jax.random.key(config.seed))
    keys = jax.random.split(key_seeds, config.num_seeds)

    start = time.perf_counter()
    init = jax.jit(jax.vmap(dqn.init)).lower(keys).compile()
    chunk = jax.jit(jax.vmap(dqn.train_chunk)).lower(init.out_info).compile()
    compile_s, start = time.perf_counter() - start, time.perf_counter()
    state = jax.block_until_ready(init(keys))
    run_s, eval_s, num_chunks = time.perf_counter() - start, 0.0, plan(config)[2]
    stopped_at = np.zeros(config.num_seeds, np.int64)  # 0: still learning
    for index in range(num_chunks):
        start, kept = time.perf_counter(), state.params
        state, metrics = jax.block_until_ready(chunk(state))
        run_s += time.perf_counter() - start
        state = state._replace(params=jax.tree.map(  # early stopping: a stopped seed keeps its parameters
            lambda k, p, stop=stopped_at > 0: jnp.where(stop.reshape(-1, *[1] * (p.ndim - 1)), k, p),
            kept, state.params))
        start = time.perf_counter()
        episodes = config.eval_episodes if index == num_chunks - 1 else config.curve_episodes
        eval_keys = jax.random.split(jax.random.fold_in(key_eval, index), episodes)
        returns = np.asarray(manager.population_fitness(eval_keys, state.params).returns).mean(axis=1)
        eval_s += time.perf_counter() - start
        row = {f"return/{f.__name__}": float(f(returns)) for f in (np.mean, np.min, np.max)}
        row.update({f"train/{k}": float(np.mean(v)) for k, v in metrics.items()})
        env_steps = int(state.steps[0])
        log(env_steps, row)
        if config.stop_return is not None:
            stopped_at = np.where((stopped_at == 0) & (returns >= config.stop_return), env_steps, stopped_at)
    return {"returns": returns, "solved": int(np.sum(returns >= config.target_return)),
            "env_steps": env_steps, "compile_s": compile_s, "run_s": run_s, "eval_s": eval_s,
            "steps_per_s": env_steps * config.num_seeds / run_s, "stopped_at": stopped_at.tolist(), "state": state}
