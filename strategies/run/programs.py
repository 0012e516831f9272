"""The compiled programs of an experiment: what `build` makes from an `EvolveConfig`.

    run = build(config)                               # env, policy, manager, strategy
    state = init_state(run, config)                   # EvolveState from the seed
    step = generation_step(run, config, devices)      # (state, seed) -> (state, metrics) on the devices
    evaluate = eval_fn(run, config)                   # mean and best policy on the same episodes

A generation (`generation_parts`): ask the strategy for the population (or, with
`sharded_sampling`, sample each piece's members where it is evaluated: `Strategy.members`; or,
for EGGROLL, a `LowRankPopulation` whose members' factors each piece draws where it evaluates
them), evaluate the members with the fitness-only path on episode keys that derive from (seed,
generation, member index) (`popeval.keys`), gather the fitness, tell the strategy, track the
best member and the observation statistics. `generation_step` runs these steps as one-device
programs on CPUs, or as one program per device (`generation_fn`) on accelerators. Nothing
here knows about files or sinks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from popeval import compiler, normalization, sharding
from popeval import keys as keys_lib
from popeval.environments import make
from popeval.environments.registry import import_env_module
from popeval.low_rank import LowRankPopulation
from popeval.policies import CNNPolicy, LSTMPolicy, MLPPolicy
from popeval.rollout import RolloutWrapper

from ..algorithms import make_strategy
from ..algorithms.eggroll import NAME as EGGROLL
from ..algorithms.shaping import sanitize_fitness
from .config import EvolveConfig

__all__ = ["EvolveState", "Run", "Asked", "build", "init_fn", "init_state", "generation_parts", "generation_fn",
           "generation_step", "eval_fn", "policies_eval_fn"]


@struct.dataclass
class EvolveState:
    strategy: Any
    generation: jax.Array  # int32
    best_params: Any
    best_fitness: jax.Array  # float32
    obs_stats: Any  # ObsStats or None


class Run(NamedTuple):
    """Everything built from a config (no state)."""

    env: Any
    env_params: Any
    policy: Any
    manager: RolloutWrapper
    strategy: Any
    template: Any  # one policy's parameters as zeros (shapes and dtypes; values come from the seed)


def build(config: EvolveConfig) -> Run:
    """Environment, policy, rollout manager and strategy for a config (nothing is compiled). The
    config's `env_module` is imported first: every command that loads a run comes here."""
    if config.environment.module is not None:
        import_env_module(config.environment.module)
    env, env_params = make(config.environment.name, **config.environment.kwargs)
    head = {"head": config.policy.head, "action_std": config.policy.action_std}
    init_carry = None
    if config.policy.kind == "lstm":
        policy = LSTMPolicy.for_env(env, env_params, hidden_size=config.policy.hidden_sizes[0], **head)
        init_carry = policy.initialize_carry()
    elif config.policy.kind == "cnn":
        policy = CNNPolicy.for_env(env, env_params, conv_channels=config.policy.conv_channels,
                                   kernel_size=config.policy.conv_kernel, pool=config.policy.conv_pool,
                                   hidden_sizes=config.policy.hidden_sizes, activation=config.policy.activation, **head)
    else:
        policy = MLPPolicy.for_env(env, env_params, hidden_sizes=config.policy.hidden_sizes,
                                   activation=config.policy.activation, **head)
    manager = RolloutWrapper(
        policy.apply, env=env, env_params=env_params, num_env_steps=config.environment.num_env_steps,
        init_carry=init_carry, common_random_numbers=config.run.common_random_numbers,
        obs_normalization=config.policy.obs_normalization, compaction=config.run.compaction,
        devices=1,  # the generation program shards the population itself (popeval.sharding)
    )
    shapes = jax.eval_shape(lambda k: policy.init_params(k, env, env_params), jax.random.key(0))
    template = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    strategy = make_strategy(config.strategy.name, config.strategy.pop_size, template, config.strategy.fitness_shaping,
                             **config.strategy.kwargs)
    # EGGROLL's members are drawn where they are evaluated anyway: sharded_sampling changes nothing.
    if config.strategy.sharded_sampling and strategy.members is None and strategy.name != EGGROLL:
        raise ValueError(f"sharded_sampling: {strategy.name} cannot sample its members one by one; "
                         "Open_ES (openai_es), SNES and PGPE can")
    return Run(env, env_params, policy, manager, strategy, template)


def init_fn(run: Run, config: EvolveConfig):
    """`init(seed) -> EvolveState`: the policy initialised from the seed is the strategy's mean."""
    def init(seed):
        key = keys_lib.run_key(seed)
        params = run.policy.init_params(key, run.env, run.env_params)
        stats = normalization.init(run.manager.obs_shape) if config.policy.obs_normalization else None
        return EvolveState(
            strategy=run.strategy.init(keys_lib.run_key(seed, keys_lib.INIT), params),
            generation=jnp.int32(0),
            best_params=params,
            best_fitness=jnp.float32(-jnp.inf),
            obs_stats=stats,
        )

    return init


def init_state(run: Run, config: EvolveConfig) -> EvolveState:
    """The initial state, computed by one compiled program (not one per eager operation)."""
    seed = np.int32(config.run.seed)
    return jax.jit(init_fn(run, config)).lower(seed).compile(compiler.options())(seed)


class Asked(NamedTuple):
    """A generation's population as every device asked for it (without `sharded_sampling`)."""

    population: Any  # (P, ...) pytree of the members' parameters, or EGGROLL's LowRankPopulation
    strategy: Any  # the strategy state after the ask


def generation_parts(run: Run, config: EvolveConfig):
    """`(ask, evaluate, update)`: a generation in three steps that `generation_fn` runs in one
    program and `generation_step` on CPU devices as one-device programs.

    - `ask(state, seed) -> Asked | None`: the whole population (None with `sharded_sampling`).
    - `evaluate(state, seed, asked, members) -> (fitness, steps, obs_stats)`: the members with
      global indices `members` (m,), each on episode keys from (seed, generation, index).
    - `update(state, seed, asked, (fitness, steps, obs_stats) of all P) -> (state, metrics)`.
    """
    sampler = run.strategy.members if config.strategy.sharded_sampling else None

    def ask(state, seed):
        if sampler is not None:  # every device samples its own members; tell regenerates them
            return None
        return Asked(*run.strategy.ask(keys_lib.generation_keys(seed, state.generation)[0], state.strategy))

    def members_of(state, seed, asked, idx):
        if asked is None:
            return sampler.sample(state.strategy, keys_lib.generation_keys(seed, state.generation)[0], idx)
        if isinstance(asked.population, LowRankPopulation):  # a descriptor: the members' factors drawn inside
            return asked.population.replace(members=asked.population.members[idx])
        return jax.tree.map(lambda x: x[idx], asked.population)

    def params_of(state, seed, asked, idx):  # explicit parameters (of a low-rank population: these members only)
        members = members_of(state, seed, asked, idx)
        return members.materialize() if isinstance(members, LowRankPopulation) else members

    def evaluate(state, seed, asked, members):
        key_eval = keys_lib.generation_keys(seed, state.generation)[1]
        keys = keys_lib.member_keys(jax.random.split(key_eval, config.run.num_rollouts), members,
                                    config.run.common_random_numbers)
        result = run.manager.kernel.fitness(keys, members_of(state, seed, asked, members), run.manager.env_params,
                                            state.obs_stats)
        return result.returns.mean(axis=-1), result.lengths.sum(axis=-1), result.obs_stats

    def update(state, seed, asked, evaluated):
        fitness, steps, member_stats = evaluated
        if asked is None:
            key_ask = keys_lib.generation_keys(seed, state.generation)[0]
            strategy_state, tell_metrics = sampler.tell(state.strategy, key_ask, fitness)
        else:
            strategy_state, tell_metrics = run.strategy.tell(asked.strategy, asked.population, fitness)

        clean, _ = sanitize_fitness(fitness)
        best = jnp.argmax(clean)
        improved = jnp.isfinite(fitness[best]) & (fitness[best] > state.best_fitness)
        best_params = jax.tree.map(lambda b, p: jnp.where(improved, p[0], b), state.best_params,
                                   params_of(state, seed, asked, best[None]))
        best_fitness = jnp.where(improved, fitness[best], state.best_fitness)
        obs_stats = state.obs_stats
        if config.policy.obs_normalization:
            obs_stats = normalization.merge_stacked(member_stats, obs_stats)

        metrics = _metrics(run, fitness, steps, best_fitness, strategy_state, tell_metrics)
        new = EvolveState(
            strategy=strategy_state, generation=state.generation + 1, best_params=best_params,
            best_fitness=best_fitness, obs_stats=obs_stats,
        )
        return new, metrics

    return ask, evaluate, update


def generation_fn(run: Run, config: EvolveConfig, devices: int):
    """The per-device generation program for `sharding.Replicated` (traced once; the seed is an
    argument, so runs that differ only in their seed share the compiled program and the
    compilation cache): each device evaluates its slice of the population, all-gathers."""
    ask, evaluate, update = generation_parts(run, config)
    pop_size = config.strategy.pop_size

    def generation(state: EvolveState, seed: jax.Array):
        asked = ask(state, seed)
        members, _ = sharding.local_slice(pop_size, devices)
        evaluated = evaluate(state, seed, asked, jnp.minimum(members, pop_size - 1))
        return update(state, seed, asked, sharding.gather_members(evaluated, pop_size))

    return generation


def generation_step(run: Run, config: EvolveConfig, devices: int):
    """The evolve loop's generation: on CPU devices one-device programs (`sharding.Pieces`:
    any device count rounds as one device does), elsewhere one program over the devices
    (`sharding.Replicated`). Either maps `(state, seed)` to `(state, metrics)` on the devices."""
    if sharding.on_cpus(devices):
        return sharding.Pieces(*generation_parts(run, config), config.strategy.pop_size, devices,
                               config.run.num_rollouts)
    return sharding.Replicated(generation_fn(run, config, devices), devices)


def _metrics(run: Run, fitness, steps, best_fitness, strategy_state, tell_metrics: dict) -> dict:
    """A generation's metrics: the finite fitness's statistics, the best fitness so far, the
    steps taken, the strategy state's non-finite values and the strategy's own metrics."""
    finite = jnp.isfinite(fitness)
    masked = jnp.where(finite, fitness, jnp.nan)
    return {
        "fitness/max": jnp.nanmax(masked),
        "fitness/mean": jnp.nanmean(masked),
        "fitness/min": jnp.nanmin(masked),
        "fitness/std": jnp.nanstd(masked),
        "best/fitness": best_fitness,
        "steps/generation": jnp.sum(steps).astype(jnp.float32),
        # The distribution's mean (the policy a run ships): a NaN there poisons every later
        # generation, while argmax policies can still turn it into finite returns.
        "nonfinite/state": _count_nonfinite(run.strategy.mean(strategy_state)),
        **tell_metrics,
    }


def _count_nonfinite(tree: Any) -> jax.Array:
    """Non-finite values among the floating-point leaves of `tree` (int32)."""
    counts = [jnp.sum(~jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return sum(counts, jnp.int32(0)).astype(jnp.int32)


def eval_fn(run: Run, config: EvolveConfig):
    """`evaluate(strategy_state, best_params, obs_stats, seed, index) -> returns (2, E)`: the
    strategy's mean policy (row 0) and the best policy (row 1) on the same `eval_episodes`
    episodes of evaluation `index`. Jitted; compile it with `compiler.options()`."""
    evaluate_policies = policies_eval_fn(run, config)

    def evaluate(strategy_state, best_params, obs_stats, seed, index):
        both = jax.tree.map(lambda m, b: jnp.stack([m, b]), run.strategy.mean(strategy_state), best_params)
        return evaluate_policies(both, obs_stats, seed, index)

    return jax.jit(evaluate)


def policies_eval_fn(run: Run, config: EvolveConfig):
    """`evaluate(both, obs_stats, seed, index) -> returns (2, E)`: `eval_fn`'s evaluation of two
    policies stacked on a leading axis (mean, best), which `popeval eval --episodes_from_run`
    replays from a saved run. Not jitted."""
    manager, episodes = run.manager, config.run.eval_episodes

    def evaluate(both, obs_stats, seed, index):
        keys = jnp.broadcast_to(keys_lib.evaluation_keys(seed, index, episodes), (2, episodes))
        return manager.kernel.fitness(keys, both, manager.env_params, obs_stats).returns

    return evaluate
