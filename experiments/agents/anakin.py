"""Anakin: a Q(lambda) learner `vmap`ped over environments and run on every device.

Hessel, Kroiss, Viola and van Hasselt (2021), "Podracer architectures for scalable
Reinforcement Learning", and its demo notebook (seed 003), here on popeval's environments:

- per environment (`vmap`, axis `BATCH`): a trajectory of `rollout_len` steps (`lax.scan` of
  the policy and `env.step`, which auto-resets) and its TD(lambda) Q-learning loss
  (`experiments.agents.td.td_lambda`), averaged with `lax.pmean` over `BATCH`;
- per device (`popeval.sharding.Replicated`, axis `sharding.AXIS`): the
  gradient, averaged with `lax.pmean` over the devices, and one `optax.adam` step;
- `iterations` updates inside one `lax.fori_loop`: one compiled call per device runs them all;
- a flax MLP (flatten, Dense `hidden_size`, relu, Dense `num_actions`), greedy actions
  (epsilon-greedy with `epsilon > 0`).

Differences from the seed: the parameters and optimiser state are held once per device (the
seed keeps a copy per environment); the seed differentiates each environment's loss and
averages the gradients over the batch, here the batch's average loss is differentiated (the
same gradient, by linearity, without `batch_size` per-environment gradients); the trajectory is
collected first and the Q-values recomputed on its observations inside the loss (the same
gradient, without differentiating through the environment's scan); an environment step gives
the reward and discount of the transition, so `rollout_len` steps give `rollout_len`
transitions, bootstrapped from the last next observation. `batch_size` counts every
environment, split evenly over the devices (the seed's is per device). Environment `i` draws
its keys from `i`, never from the device layout, so 1, 2 or 4 devices play the same episodes.
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

from experiments.agents.td import td_lambda
from popeval import compiler, sharding
from popeval.environments import make
from popeval.rollout import RolloutWrapper
from popeval.typed_config import check_types

__all__ = ["BATCH", "AnakinConfig", "QNetwork", "Transition", "EnvCarry", "make_learner_fn", "TimeIt", "train",
           "evaluate"]

#: Name of the batch (environment) axis inside the learner.
BATCH = "batch"


@dataclasses.dataclass(frozen=True)
class AnakinConfig:
    """An Anakin experiment. Frames count environment steps of all environments."""

    env_name: str = "Catch-bsuite"
    batch_size: int = 128  # environments in all, split evenly over the devices
    rollout_len: int = 16  # environment steps per update and environment
    step_size: float = 1e-4  # adam's learning rate
    iterations: int = 100  # updates per compiled call (the fori_loop)
    num_calls: int = 10  # compiled calls: the budget is num_calls * iterations * rollout_len * batch_size frames
    agent_discount: float = 1.0
    lambda_: float = 0.99
    epsilon: float = 0.0  # probability of a uniformly random action (0: the seed's greedy policy)
    hidden_size: int = 256
    seed: int = 42
    devices: int | None = None  # None: every local device
    eval_episodes: int = 100  # greedy episodes at the end (0: none)
    eval_max_steps: int = 1000  # cap of an evaluation episode on tasks without a practical limit
    target_return: float | None = None  # drawn on the curve; the first call reaching it is reported

    def __post_init__(self):
        check_types(self)
        for name in ("batch_size", "rollout_len", "iterations", "num_calls", "hidden_size", "eval_max_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config key {name!r} must be positive, got {getattr(self, name)!r}")
        if self.eval_episodes < 0 or (self.devices is not None and self.devices <= 0):
            raise ValueError("config keys 'eval_episodes' (>= 0) and 'devices' (> 0 or null) are out of range")
        if not (0.0 <= self.epsilon <= 1.0 and 0.0 <= self.lambda_ <= 1.0 and 0.0 <= self.agent_discount <= 1.0):
            raise ValueError("config keys 'epsilon', 'lambda_' and 'agent_discount' must lie in [0, 1]")


class QNetwork(nn.Module):
    """Q-values of a batch of observations `(N, *obs_shape)` -> `(N, num_actions)`."""

    num_actions: int
    hidden_size: int = 256

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)  # MinAtar boards are bool
        x = nn.relu(nn.Dense(self.hidden_size)(x))
        return nn.Dense(self.num_actions)(x)


class Transition(NamedTuple):
    """A trajectory of one environment: `obs` has one more step (the bootstrap observation)."""

    obs: jax.Array  # (T + 1, *obs_shape)
    action: jax.Array  # (T,)
    reward: jax.Array  # (T,)
    discount: jax.Array  # (T,): 0 where an episode ended


class EnvCarry(NamedTuple):
    """One environment between updates."""

    obs: jax.Array
    state: Any
    episode_return: jax.Array  # of the episode in progress
    key: jax.Array


def make_learner_fn(env, env_params, apply_fn: Callable, optimizer: optax.GradientTransformation,
                    config: AnakinConfig) -> Callable:
    """The compiled unit of Anakin: `learner_fn(params, opt_state, carry) -> (params, opt_state,
    carry, metrics)`, the per-device program (`carry` has a leading batch axis; run it under
    `sharding.Replicated`). `metrics` sum over the call, every environment and device:
    `loss` (per update, averaged over environments), `return_sum` and `episodes` (finished)."""
    num_actions = env.action_space(env_params).n

    def act(params, obs, key):
        q = apply_fn(params, obs[None])[0]
        if config.epsilon == 0:  # the seed's greedy policy
            return jnp.argmax(q)
        key_explore, key_random = jax.random.split(key)
        explore = jax.random.uniform(key_explore) < config.epsilon
        return jnp.where(explore, jax.random.randint(key_random, (), 0, num_actions), jnp.argmax(q))

    def rollout_fn(params, carry: EnvCarry):
        """One environment's trajectory of `rollout_len` steps (vmapped over BATCH)."""
        key, rollout_key = jax.random.split(carry.key)

        def step_fn(c: EnvCarry, step_key):
            key_act, key_env = jax.random.split(step_key)
            action = act(params, c.obs, key_act)
            obs, state, reward, done, info = env.step(key_env, c.state, action, env_params)
            # After a truncation the auto-reset hands over the next episode's first
            # observation, which must not be bootstrapped from: cut there as well.
            discount = jnp.where(done, 0.0, info["discount"])
            episode_return = c.episode_return + reward
            out = Transition(c.obs, action, reward, discount)
            return EnvCarry(obs, state, jnp.where(done, 0.0, episode_return), c.key), (out, done, episode_return)

        carry, (trajectory, done, returns) = jax.lax.scan(
            step_fn, carry, jax.random.split(rollout_key, config.rollout_len))
        metrics = {"return_sum": jax.lax.psum(jnp.sum(jnp.where(done, returns, 0.0)), (BATCH, sharding.AXIS)),
                   "episodes": jax.lax.psum(jnp.sum(done, dtype=jnp.int32), (BATCH, sharding.AXIS))}
        trajectory = trajectory._replace(obs=jnp.concatenate([trajectory.obs, carry.obs[None]]))
        return carry._replace(key=key), trajectory, metrics

    def loss_fn(params, trajectory: Transition):
        """The TD(lambda) Q-learning loss of one trajectory, averaged over BATCH."""
        q = apply_fn(params, trajectory.obs)  # (T + 1, num_actions)
        q_taken = jnp.take_along_axis(q[:-1], trajectory.action[:, None], axis=-1)[:, 0]
        td = td_lambda(q_taken, trajectory.reward, config.agent_discount * trajectory.discount, q[1:].max(-1),
                       config.lambda_)
        return jax.lax.pmean(jnp.mean(td ** 2), axis_name=BATCH)

    # Parameters, optimiser state and metrics are the same for every environment: one copy per
    # device (in_axes / out_axes None), not one per environment as in the seed.
    batched_rollout_fn = jax.vmap(rollout_fn, in_axes=(None, 0), out_axes=(0, 0, None), axis_name=BATCH)
    batched_loss_fn = jax.vmap(loss_fn, in_axes=(None, 0), out_axes=None, axis_name=BATCH)

    def update_fn(params, opt_state, carry: EnvCarry):
        """One update from a trajectory of every environment of this device."""
        carry, trajectory, metrics = batched_rollout_fn(params, carry)
        # The gradient of the loss averaged over the batch (pmean over BATCH inside the vmap)
        # is the seed's average of per-environment gradients, but it is one contraction over
        # batch and time: per-environment gradients would be `batch_size` copies of the
        # parameters, memory-bound on a CPU (8x slower with MinAtar's 600 inputs).
        loss, grads = jax.value_and_grad(batched_loss_fn)(params, trajectory)
        grads = jax.lax.pmean(grads, axis_name=sharding.AXIS)  # mean over the devices
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, carry, {"loss": jax.lax.pmean(loss, sharding.AXIS), **metrics}

    def learner_fn(params, opt_state, carry):
        def iterate_fn(_, val):  # many updates per call: no return to Python in between
            params, opt_state, carry, total = val
            params, opt_state, carry, metrics = update_fn(params, opt_state, carry)
            return params, opt_state, carry, jax.tree.map(jnp.add, total, metrics)

        zero = {"loss": jnp.float32(0), "return_sum": jnp.float32(0), "episodes": jnp.int32(0)}
        return jax.lax.fori_loop(0, config.iterations, iterate_fn, (params, opt_state, carry, zero))

    return learner_fn


class TimeIt:
    """Prints `TAG: Elapsed time=...s[, FPS=...]` on exit, as the seed's notebook does."""

    def __init__(self, tag: str, frames: int | None = None, quiet: bool = False):
        self.tag, self.frames, self.quiet = tag, frames, quiet

    def __enter__(self) -> TimeIt:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.elapsed_secs = time.perf_counter() - self.start
        self.fps = self.frames / self.elapsed_secs if self.frames else None
        if not self.quiet:
            fps = f", FPS={self.fps:.2e}" if self.frames else ""
            print(f"{self.tag}: Elapsed time={self.elapsed_secs:.2f}s{fps}", flush=True)


def train(config: AnakinConfig, log: Callable[[int, dict], None] | None = None, quiet: bool = False) -> dict:
    """Runs `config.num_calls` compiled calls of `iterations` updates each.

    Args:
        config: the experiment.
        log: called after every call as `log(call, metrics)` with flat metrics (`frames`,
            `return/mean` over the episodes finished during the call, `episodes`, `loss`, `fps`,
            `time/elapsed`), e.g. `RunLogger.log`.
        quiet: no printing.

    Returns:
        A dict: `devices`, `frames`, `compile_s`, `execute_s`, `fps`, `history` (the metrics of
        every call), `params` (host arrays), `eval/return` (mean greedy return, if evaluated)
        and `target_frames` / `target_s` (first call whose `return/mean` reached the target).
    """
    env, env_params = make(config.env_name)
    devices = len(sharding.resolve_devices(config.devices))
    if config.batch_size % devices:
        raise ValueError(f"batch_size={config.batch_size} cannot be split evenly over {devices} device(s)")
    network = QNetwork(env.action_space(env_params).n, config.hidden_size)
    optimizer = optax.adam(config.step_size)

    def init(key):  # one small program instead of many eager ones
        key_params, key_reset, key_steps, key_eval = jax.random.split(key, 4)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key_reset, config.batch_size), env_params)
        params = network.init(key_params, obs[:1])
        carry = EnvCarry(obs, state, jnp.zeros(config.batch_size), jax.random.split(key_steps, config.batch_size))
        return params, optimizer.init(params), carry, key_eval

    key = jax.random.key(config.seed)
    params, opt_state, carry, key_eval = jax.jit(init).lower(key).compile(compiler.options())(key)

    learner = sharding.Replicated(make_learner_fn(env, env_params, network.apply, optimizer, config), devices)
    params, opt_state = learner.replicate((params, opt_state))
    carry = sharding.split_leading(carry, devices)
    frames_per_call = config.iterations * config.rollout_len * config.batch_size
    if not quiet:
        print(f"Running {config.env_name} on {devices} device(s): {config.batch_size} environments, "
              f"{frames_per_call} frames per call", flush=True)
    with TimeIt("COMPILATION", quiet=quiet) as compile_timer:
        specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), (params, opt_state, carry))
        learner.compile(learner.lower(*specs))

    history, target_frames, target_s, execute_s = [], None, None, 0.0
    with TimeIt("EXECUTION", frames=frames_per_call * config.num_calls, quiet=quiet):
        for call in range(config.num_calls):
            start = time.perf_counter()
            params, opt_state, carry, metrics = learner(params, opt_state, carry)
            metrics = learner.first(metrics)  # waits for the call
            seconds = time.perf_counter() - start
            execute_s += seconds
            episodes = int(metrics["episodes"])
            row = {"frames": (call + 1) * frames_per_call,
                   "return/mean": float(metrics["return_sum"]) / episodes if episodes else float("nan"),
                   "episodes": episodes, "loss": float(metrics["loss"]) / config.iterations,
                   "fps": frames_per_call / seconds, "time/elapsed": execute_s}
            history.append(row)
            if log is not None:
                log(call, row)
            target = config.target_return
            if target_frames is None and target is not None and row["return/mean"] >= target:
                target_frames, target_s = row["frames"], execute_s
    params = learner.first(params)
    result = {"devices": devices, "frames": frames_per_call * config.num_calls, "compile_s": compile_timer.elapsed_secs,
              "execute_s": execute_s, "fps": frames_per_call * config.num_calls / execute_s, "history": history,
              "params": params, "target_frames": target_frames, "target_s": target_s}
    if config.eval_episodes:
        result["eval/return"] = evaluate(network, params, env, env_params, key_eval, config)
        if not quiet:
            print(f"greedy policy: mean return {result['eval/return']:.3f} over {config.eval_episodes} episodes")
    return result


def evaluate(network: QNetwork, params: Any, env, env_params, key: jax.Array, config: AnakinConfig) -> float:
    """Mean return of the greedy policy over `config.eval_episodes` episodes (`RolloutWrapper`)."""
    def greedy(p, obs, _key):
        return jnp.argmax(network.apply(p, obs[None])[0])

    limit = int(np.max(np.asarray(env_params.max_steps_in_episode)))
    wrapper = RolloutWrapper(greedy, env=env, env_params=env_params, num_env_steps=min(limit, config.eval_max_steps),
                             devices=1)  # one policy: one device
    pop_params = jax.tree.map(lambda x: x[None], params)
    returns = wrapper.population_fitness(jax.random.split(key, config.eval_episodes), pop_params).returns
    return float(np.mean(np.asarray(returns)))
