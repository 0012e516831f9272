"""Seed 002's DQN loop ("CartPole with JAX"), reproduced to measure `experiments.agents.dqn` against.

The seed's structure: gymnasium's `CartPole-v1` stepped in a Python loop, a
`collections.deque` replay memory sampled with `random.sample`, a biased coin for
epsilon-greedy and one jitted gradient update per environment step once the memory holds
enough transitions. Everything a result depends on is the compiled DQN's config (network,
optimiser, loss, batch, epsilon and target schedules, updates every `num_envs *
train_every` steps), so the two differ only in how they run. Deviations from the seed:

- the seed's Bellman-target bug (y = 0 at a terminal state) is fixed as in the compiled
  DQN: y = r at a termination, and a time-limit truncation bootstraps from its last obs;
- the target network is copied every `target_update_every` updates (the seed: at the end
  of every episode) and episodes run to gymnasium's 500-step limit (the seed stops at 100);
- the greedy action is one jitted call (the seed applies the haiku network eagerly), the
  coin is Python's `random` and epsilon a precomputed table (the seed: `jax.random` eagerly),
  which makes this anchor faster than the seed, not slower.

gymnasium is imported lazily: a test/benchmark extra, never a runtime dependency.
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.agents.dqn import (
    DQNConfig,
    QNetwork,
    Transition,
    epsilon_schedule,
    make_update,
)

__all__ = ["SeedTransition", "ReplayMemory", "run_seed_loop"]


class SeedTransition(NamedTuple):
    """One experience, as the seed stores it."""

    state: np.ndarray
    next_state: np.ndarray
    action: int
    reward: float
    is_terminal: bool


class ReplayMemory:
    """The seed's replay memory: a bounded deque sampled without replacement."""

    def __init__(self, size: int = 100_000):
        self.memory = deque(maxlen=int(size))

    def experience(self, transition: SeedTransition) -> None:
        self.memory.append(transition)

    def sample(self, sample_size: int) -> list[SeedTransition]:
        return random.sample(self.memory, k=sample_size)

    def __len__(self) -> int:
        return len(self.memory)


def _batch(transitions: list[SeedTransition]) -> Transition:
    t = SeedTransition(*zip(*transitions))
    return Transition(np.asarray(t.state, np.float32), np.asarray(t.action, np.int32),
                      np.asarray(t.reward, np.float32), np.asarray(t.next_state, np.float32),
                      np.asarray(t.is_terminal, np.float32))


def run_seed_loop(config: DQNConfig, num_steps: int, seed: int = 0) -> dict:
    """Runs the seed's loop for `num_steps` environment steps of one seed.

    Returns:
        A dict: `env_steps`, `updates`, `compile_s` (the two jitted functions, before the
        loop), `run_s` (the loop), `steps_per_s`, `learning_steps_per_s` (the steps after
        `learning_starts`, when updates run: the rate of most of a full run), `episodes`,
        `recent_return` (mean return of the last 10 finished exploring episodes; NaN if none).
    """
    import gymnasium  # test/bench extra

    env = gymnasium.make(config.env_name)
    q_net = QNetwork(int(env.action_space.n), tuple(config.hidden_sizes))
    opt, update = make_update(config, q_net)
    epsilon = np.asarray(jax.vmap(epsilon_schedule(config))(jnp.arange(num_steps)))
    per_update = config.num_envs * config.train_every
    random.seed(seed)

    obs, _ = env.reset(seed=seed)
    params = q_net.init(jax.random.key(seed), jnp.asarray(obs))
    target_params, opt_state = params, opt.init(params)
    act = jax.jit(lambda params, obs: jnp.argmax(q_net.apply(params, obs)))
    update = jax.jit(update)
    start = time.perf_counter()
    example = _batch([SeedTransition(obs, obs, 0, 1.0, False)] * config.batch_size)
    jax.block_until_ready((act(params, obs), update(params, target_params, opt_state, example)))
    compile_s = time.perf_counter() - start

    memory = ReplayMemory(config.buffer_size)
    returns, episode_return, updates = [], 0.0, 0
    start = learning = time.perf_counter()
    for step in range(num_steps):
        if step == config.learning_starts:
            learning = time.perf_counter()
        if random.random() < epsilon[step]:
            action = random.randrange(env.action_space.n)
        else:
            action = int(act(params, obs))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        memory.experience(SeedTransition(obs, next_obs, action, float(reward), bool(terminated)))
        if step + 1 > config.learning_starts and (step + 1) % per_update == 0:
            batch = _batch(memory.sample(config.batch_size))
            params, opt_state, _ = update(params, target_params, opt_state, batch)
            updates += 1
            if updates % config.target_update_every == 0:
                target_params = params
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
    jax.block_until_ready(params)
    end = time.perf_counter()
    learning_steps = num_steps - min(num_steps, config.learning_starts)
    return {"env_steps": num_steps, "updates": updates, "compile_s": compile_s, "run_s": end - start,
            "steps_per_s": num_steps / (end - start),
            "learning_steps_per_s": learning_steps / (end - learning) if learning_steps else float("nan"),
            "episodes": len(returns),
            "recent_return": float(np.mean(returns[-10:])) if returns else float("nan")}
