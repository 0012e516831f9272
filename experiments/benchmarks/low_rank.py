"""Low-rank populations (EGGROLL) against full-rank ones and against the inference limit.

    python experiments/benchmark.py low_rank [--quick] [--pop_size 256] [--num_rollouts 8] [--repeats 5]
        [--out bench_results/low_rank.json]

Rows per workload (an environment and the MLP's hidden sizes), every program the same `P x B`
episodes of the same members:

- `full rank`: `RolloutWrapper.population_fitness` of the members as explicit parameters
  (`LowRankPopulation.materialize`), popeval's engine as it was before low rank;
- `low rank r=1`, `low rank r=4`: `population_fitness` of `LowRankPopulation.from_key`: factors
  drawn inside the evaluation, each layer one product with the shared mean plus each member's
  rank-`r` correction;
- `inference limit`: the mean policy alone on all `P x B` episodes, fused with the environment in
  one `lax.scan` of `num_env_steps` steps (no perturbation, no early exit): what evaluating the
  population costs if members cost nothing;
- `gymnax best case`: gymnax's `RolloutWrapper.population_rollout` returning only `cum_return`, on
  the full-rank members (when gymnax is installed and registers the environment).

A time is the best of `--repeats` calls after a compiling one; `vs limit` is the inference limit's
time over the row's, `vs full` the full-rank time over the row's. Prints a table; writes JSON with
the load average before and after each workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from popeval import MLPPolicy, RolloutWrapper, compiler, make
from popeval.low_rank import LowRankPopulation

#: (environment, hidden sizes, num_env_steps or None for the environment's own): Breakout runs
#: NeuroEvoBench's 500-step episodes.
WORKLOADS = (("CartPole-v1", (32, 32), None), ("Pendulum-v1", (32, 32), None), ("Acrobot-v1", (64, 64), None),
             ("Breakout-MinAtar", (256, 256), 500), ("Pendulum-v1", (256, 256), None))
QUICK = (("CartPole-v1", (32, 32), None), ("Pendulum-v1", (256, 256), None))
SIGMA = 0.05


def inference_limit(env, policy, num_steps: int):
    """`fn(keys (N,), mean, env_params) -> returns (N,)`: the mean policy on N episodes in one scan."""
    def run(keys, mean, env_params):
        obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(keys, env_params)

        def body(carry, _):
            obs, state, ret, alive = carry
            action = jax.vmap(policy.apply, in_axes=(None, 0))(mean, obs)
            obs, state, reward, done, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(keys, state, action,
                                                                                            env_params)
            return (obs, state, ret + jnp.where(alive, reward, 0.0), alive & ~done), None

        init = (obs, state, jnp.zeros(keys.shape[0]), jnp.ones(keys.shape[0], bool))
        return jax.lax.scan(body, init, None, num_steps)[0][2]

    return jax.jit(run, compiler_options=compiler.options())


def _timed(fn, repeats: int) -> tuple[float, float]:
    """`(compile-and-first-call seconds, best of repeats seconds)`."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return first, best


def _gymnax_best(env_id: str, policy, num_steps: int):
    try:
        import gymnax
        from gymnax.experimental import RolloutWrapper as GymnaxRolloutWrapper
    except ImportError:
        return None
    if env_id not in gymnax.registered_envs:
        return None
    wrapper = GymnaxRolloutWrapper(policy.apply, env_name=env_id, num_env_steps=num_steps)
    return jax.jit(lambda keys, params: wrapper.population_rollout(keys, params)[-1])


def bench_workload(env_id: str, hidden: tuple, num_env_steps: int | None, pop_size: int, num_rollouts: int,
                   repeats: int) -> list[dict]:
    """The rows of one workload."""
    env, env_params = make(env_id)
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=hidden)
    manager = RolloutWrapper(policy.apply, env=env, env_params=env_params, num_env_steps=num_env_steps)
    steps = manager.num_env_steps
    mean = policy.init_params(jax.random.key(0), env, env_params)
    keys = jax.random.split(jax.random.key(1), num_rollouts)
    populations = {r: LowRankPopulation.from_key(mean, jax.random.key(2), SIGMA, r, pop_size=pop_size) for r in (1, 4)}
    explicit = jax.block_until_ready(populations[1].materialize())
    episode_keys = jax.random.split(jax.random.key(3), pop_size * num_rollouts)
    limit = inference_limit(env, policy, steps)
    programs = {
        "full rank": lambda: manager.population_fitness(keys, explicit).returns,
        "low rank r=1": lambda: manager.population_fitness(keys, populations[1]).returns,
        "low rank r=4": lambda: manager.population_fitness(keys, populations[4]).returns,
        "inference limit": lambda: limit(episode_keys, mean, env_params),
    }
    gymnax_best = _gymnax_best(env_id, policy, steps)
    if gymnax_best is not None:
        programs["gymnax best case"] = lambda: gymnax_best(keys, explicit)
    load_before = os.getloadavg()[0]
    rows = []
    for impl, fn in programs.items():
        first, best = _timed(fn, repeats)
        rows.append({"env": env_id, "hidden": list(hidden), "pop_size": pop_size, "num_rollouts": num_rollouts,
                     "num_env_steps": steps, "impl": impl, "time_s": best, "first_call_s": first})
        print(f"  {env_id} {hidden} {impl}: {best * 1e3:.1f} ms (first call {first:.1f} s)", flush=True)
    times = {r["impl"]: r["time_s"] for r in rows}
    for r in rows:
        r.update(vs_limit=times["inference limit"] / r["time_s"], vs_full=times["full rank"] / r["time_s"],
                 load_before=load_before, load_after=os.getloadavg()[0])
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'env':<18} {'hidden':<10} {'impl':<17} {'time ms':>9} {'vs limit':>9} {'vs full':>8} {'load':>9}"]
    for r in rows:
        hidden = "x".join(map(str, r["hidden"]))
        lines.append(f"{r['env']:<18} {hidden:<10} {r['impl']:<17} {r['time_s'] * 1e3:>9.1f} {r['vs_limit']:>9.2f} "
                     f"{r['vs_full']:>8.2f} {r['load_before']:>4.1f}-{r['load_after']:<4.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two workloads, P=64, 2 repeats")
    p.add_argument("--pop_size", type=int, default=256)
    p.add_argument("--num_rollouts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="bench_results/low_rank.json")
    args = p.parse_args(argv)
    workloads, pop_size, repeats = (QUICK, 64, 2) if args.quick else (WORKLOADS, args.pop_size, args.repeats)
    rows = []
    for env_id, hidden, num_env_steps in workloads:
        rows += bench_workload(env_id, hidden, num_env_steps, pop_size, args.num_rollouts, repeats)
    print(format_table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "jax": jax.__version__,
               "devices": [str(d) for d in jax.local_devices()]}
    out.write_text(json.dumps({"machine": machine, "results": rows}, indent=2))
    print(f"wrote {out}")
    return 0
