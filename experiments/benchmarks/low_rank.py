"""Low-rank populations (EGGROLL) against full-rank ones and against the inference limit.

    python -m experiments.benchmarks low_rank [--quick] [--pop_size 256] [--num_rollouts 8] [--repeats 5]
        [--out bench_results/low_rank.json]
    python -m experiments.benchmarks low_rank --memory [--pop_size 65536]

Rows per workload (an environment and the MLP's hidden sizes), every program the same `P x B`
episodes of the same members:

- `full rank`: `RolloutWrapper.population_fitness` of the members as explicit parameters
  (`LowRankPopulation.materialize`), popeval's engine as it was before low rank;
- `low rank r=1`, `low rank r=4`: `population_fitness` of `LowRankPopulation.from_key`: factors
  drawn inside the evaluation, each layer one product with the shared mean plus each member's
  rank-`r` correction, or, where `product="auto"` judges the corrections too costly
  (`popeval.low_rank.cheap_corrections`), each member's own parameters and products;
- `shared r=1`, `shared r=4`: where `auto` evaluates member by member, the shared product forced
  (`product="shared"`), to show what the fallback avoids;
- `inference limit`: the mean policy alone on all `P x B` episodes, fused with the environment in
  one `lax.scan` of `num_env_steps` steps (no perturbation, no early exit): what evaluating the
  population costs if members cost nothing;
- `gymnax best case`: gymnax's `RolloutWrapper.population_rollout` returning only `cum_return`, on
  the full-rank members (when gymnax is installed and registers the environment).

A time is the best of `--repeats` calls after a compiling one; `vs limit` is the inference limit's
time over the row's, `vs full` the full-rank time over the row's. `GFLOP/s`: the mean policy's
dense products (`2 n_in n_out` per matrix and step, no corrections) over the steps the row
computes (the fitness path's until each episode ends, the scans' all `num_env_steps`), per
second, against `gemm`: this machine's rate for a `(2048, 256) x (256, 256)` product in a scan
(`gemm_rate`), the most a row can reach. Prints a table; writes JSON with the load average
before and after each workload.

`--memory`: the peak resident memory of a fresh process that evaluates `--pop_size` members of
Breakout's 400-256-256-6 MLP (rank 1, one 500-step episode each) with `population_fitness`,
beside one that evaluates 256 (the runtime's own share), read from the operating system
(`os.wait4`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from functools import partial
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


def gemm_rate(repeats: int = 3) -> float:
    """GFLOP/s of `tanh(x @ W)` with `x (2048, 256)`, `W (256, 256)`, 500 times in one scan."""
    x, w = jax.random.normal(jax.random.key(0), (2048, 256)), jax.random.normal(jax.random.key(1), (256, 256))
    run = jax.jit(lambda x, w: jax.lax.scan(lambda x, _: (jnp.tanh(x @ w), None), x, None, 500)[0],
                  compiler_options=compiler.options())
    return 2 * 2048 * 256 * 256 * 500 / _timed(lambda: run(x, w), repeats)[1] / 1e9


def _dense_flops(mean) -> int:
    """FLOPs of one step of the mean policy's products."""
    return sum(2 * math.prod(leaf.shape) for leaf in jax.tree.leaves(mean) if leaf.ndim >= 2)


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
    forced = {r: pop.replace(product="shared") for r, pop in populations.items() if not pop.shared_product}
    explicit = jax.block_until_ready(populations[1].materialize())
    episode_keys = jax.random.split(jax.random.key(3), pop_size * num_rollouts)
    limit = inference_limit(env, policy, steps)
    programs = {
        "full rank": lambda: manager.population_fitness(keys, explicit).returns,
        "low rank r=1": lambda: manager.population_fitness(keys, populations[1]).returns,
        "low rank r=4": lambda: manager.population_fitness(keys, populations[4]).returns,
        **{f"shared r={r}": partial(lambda pop: manager.population_fitness(keys, pop).returns, pop)
           for r, pop in forced.items()},
        "inference limit": lambda: limit(episode_keys, mean, env_params),
    }
    products = {f"low rank r={r}": "shared" if pop.shared_product else "member" for r, pop in populations.items()}
    evaluated = {"full rank": explicit, **{f"low rank r={r}": p for r, p in populations.items()},
                 **{f"shared r={r}": p for r, p in forced.items()}}
    computed = {impl: int(manager.population_fitness(keys, pop).lengths.sum()) for impl, pop in evaluated.items()}
    gymnax_best = _gymnax_best(env_id, policy, steps)
    if gymnax_best is not None:
        programs["gymnax best case"] = lambda: gymnax_best(keys, explicit)
    load_before = os.getloadavg()[0]
    rows = []
    for impl, fn in programs.items():
        first, best = _timed(fn, repeats)
        rows.append({"env": env_id, "hidden": list(hidden), "pop_size": pop_size, "num_rollouts": num_rollouts,
                     "num_env_steps": steps, "impl": impl, "product": products.get(impl), "time_s": best,
                     "first_call_s": first,
                     "gflops": computed.get(impl, pop_size * num_rollouts * steps) * _dense_flops(mean) / best / 1e9})
        print(f"  {env_id} {hidden} {impl}: {best * 1e3:.1f} ms (first call {first:.1f} s)", flush=True)
    times = {r["impl"]: r["time_s"] for r in rows}
    for r in rows:
        r.update(vs_limit=times["inference limit"] / r["time_s"], vs_full=times["full rank"] / r["time_s"],
                 load_before=load_before, load_after=os.getloadavg()[0])
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'env':<18} {'hidden':<10} {'impl':<17} {'product':<8} {'time ms':>9} {'vs limit':>9} {'vs full':>8} "
             f"{'GFLOP/s':>8} {'load':>9}"]
    for r in rows:
        hidden = "x".join(map(str, r["hidden"]))
        lines.append(f"{r['env']:<18} {hidden:<10} {r['impl']:<17} {r.get('product') or '':<8} "
                     f"{r['time_s'] * 1e3:>9.1f} {r['vs_limit']:>9.2f} {r['vs_full']:>8.2f} {r['gflops']:>8.1f} "
                     f"{r['load_before']:>4.1f}-{r['load_after']:<4.1f}")
    return "\n".join(lines)


MEMORY_CHILD = """
import sys, jax
from popeval import LowRankPopulation, MLPPolicy, RolloutWrapper, make
env, params = make("Breakout-MinAtar")
policy = MLPPolicy.for_env(env, params, hidden_sizes=(256, 256))
mean = policy.init_params(jax.random.key(0), env, params)
pop = LowRankPopulation.from_key(mean, jax.random.key(2), 0.05, 1, pop_size=int(sys.argv[1]))
wrapper = RolloutWrapper(policy.apply, env=env, env_params=params, num_env_steps=500)
print(float(wrapper.population_fitness(jax.random.split(jax.random.key(1), 1), pop).returns.mean()))
"""


def peak_memory(pop_size: int) -> dict:
    """The peak resident memory (GiB) of a fresh process evaluating `pop_size` members (`MEMORY_CHILD`)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", MEMORY_CHILD, str(pop_size)], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"the memory probe with {pop_size} members failed (exit {proc.returncode})")
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024) / 2**30
    return {"pop_size": pop_size, "peak_rss_gib": peak, "seconds": time.perf_counter() - start,
            "mean_return": float(out.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.benchmarks low_rank", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two workloads, P=64, 2 repeats")
    p.add_argument("--pop_size", type=int, default=None, help="256; with --memory 65536")
    p.add_argument("--num_rollouts", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="bench_results/low_rank.json")
    p.add_argument("--memory", action="store_true", help="peak memory of --pop_size members (default 65536) instead")
    args = p.parse_args(argv)
    if args.memory:
        return memory_main(args)
    workloads, pop_size, repeats = (QUICK, 64, 2) if args.quick else (WORKLOADS, args.pop_size or 256, args.repeats)
    gemm = gemm_rate()
    print(f"gemm: {gemm:.1f} GFLOP/s (load {os.getloadavg()[0]:.1f})", flush=True)
    rows = []
    for env_id, hidden, num_env_steps in workloads:
        rows += bench_workload(env_id, hidden, num_env_steps, pop_size, args.num_rollouts, repeats)
    print(format_table(rows) + f"\ngemm: {gemm:.1f} GFLOP/s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "jax": jax.__version__,
               "devices": [str(d) for d in jax.local_devices()], "gemm_gflops": gemm}
    out.write_text(json.dumps({"machine": machine, "results": rows}, indent=2))
    print(f"wrote {out}")
    return 0


def memory_main(args: argparse.Namespace) -> int:
    """`--memory`: the probe at 256 members and at `--pop_size` (65,536 unless given)."""
    pop_size = args.pop_size or 65536
    rows = [peak_memory(p) for p in (256, pop_size)]
    for r in rows:
        print(f"P = {r['pop_size']:>6}: peak {r['peak_rss_gib']:.2f} GiB resident, {r['seconds']:.0f} s, "
              f"load {os.getloadavg()[0]:.1f}")
    out = Path(args.out).with_name("low_rank_memory.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"wrote {out}")
    return 0
