"""How fast popeval's fitness path runs on this machine (`popeval bench`).

    popeval bench [--env CartPole-v1] [--pop_size 256] [--num_rollouts 8] [--num_env_steps T]
                  [--hidden 32] [--repeats 3] [--json FILE]

A population of random `MLPPolicy` members (two hidden layers) plays `num_rollouts` episodes
each through `RolloutWrapper.population_fitness`: the first call compiles, the fastest of
`repeats` more is reported. No other library is timed: `python -m experiments.benchmarks`, in
a source checkout, compares popeval with gymnax and with the machine's limit.
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np

from popeval.environments import make
from popeval.policies import MLPPolicy
from popeval.rollout import RolloutWrapper

__all__ = ["bench", "format_result"]


def bench(env_name: str = "CartPole-v1", pop_size: int = 256, num_rollouts: int = 8,
          num_env_steps: int | None = None, hidden: int = 32, repeats: int = 3, seed: int = 0) -> dict:
    """Times `population_fitness` on one population of random MLP policies.

    Args:
        env_name: a registered environment id.
        pop_size: members `P`.
        num_rollouts: episodes per member `B`.
        num_env_steps: steps per episode `T` (default: the environment's episode limit).
        hidden: units in each of the MLP's two hidden layers.
        repeats: timed calls after the one that compiles; the fastest is reported.
        seed: key of the members' parameters and of the episodes.

    Returns:
        A flat dict: the settings, `compile_s` (the first call), `time_s` (the fastest timed
        call), `env_steps` (steps before done, summed over all episodes), `steps_per_s`,
        `backend`, `devices` and `load_average` (1, 5, 15 minutes; None where the OS has none).
    """
    if min(pop_size, num_rollouts, hidden, repeats) < 1:
        raise ValueError("pop_size, num_rollouts, hidden and repeats must be >= 1")
    env, env_params = make(env_name)
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(hidden, hidden))
    wrapper = RolloutWrapper(policy.apply, env_name=env_name, num_env_steps=num_env_steps)
    param_key, episode_key = jax.random.split(jax.random.key(seed))
    init = jax.jit(jax.vmap(lambda k: policy.init_params(k, env, env_params)))
    pop_params = init(jax.random.split(param_key, pop_size))
    keys = jax.random.split(episode_key, num_rollouts)
    times = []
    for _ in range(repeats + 1):  # the first call compiles
        start = time.perf_counter()
        result = jax.block_until_ready(wrapper.population_fitness(keys, pop_params))
        times.append(time.perf_counter() - start)
    env_steps = int(np.asarray(result.lengths, dtype=np.int64).sum())
    best = min(times[1:])
    return {"env": env_name, "pop_size": pop_size, "num_rollouts": num_rollouts,
            "num_env_steps": wrapper.num_env_steps, "hidden": hidden, "repeats": repeats,
            "backend": jax.default_backend(), "devices": len(wrapper.devices), "compile_s": times[0],
            "time_s": best, "env_steps": env_steps, "steps_per_s": env_steps / best,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def format_result(r: dict) -> str:
    """`bench`'s result as a header, one table line and the load average."""
    head = f"{'env':<20} {'P':>6} {'B':>4} {'T':>5} {'hidden':>6} {'compile s':>9} {'best s':>8} {'steps/s':>9}"
    row = (f"{r['env']:<20} {r['pop_size']:>6} {r['num_rollouts']:>4} {r['num_env_steps']:>5} {r['hidden']:>6} "
           f"{r['compile_s']:>9.2f} {r['time_s']:>8.4f} {r['steps_per_s']:>9.3g}")
    load = r["load_average"]
    tail = (f"{r['env_steps']} env steps a call on {r['devices']} {r['backend']} device(s); load average "
            + ("unknown" if load is None else f"{load[0]:.2f} ({os.cpu_count()} cores)"))
    return f"{head}\n{row}\n{tail}"
