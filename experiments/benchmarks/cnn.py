"""`CNNPolicy`'s convolutions as one product (`conv_by_patches`) against lax's convolution.

    python -m experiments.benchmarks cnn [--quick] [--pop_size 128] [--num_rollouts 2] [--repeats 5]
        [--out bench_results/cnn.json]

Rows per workload (a MinAtar game, the CNN's channels and kernel, `num_env_steps`), every
program `RolloutWrapper.population_fitness` of the same `P x B` episodes of the same random
members:

- `one product`: `CNNPolicy` as shipped, its `nn.Conv` layers computed by `conv_by_patches`;
- `lax conv`: the same policy and parameters with `lax.conv_general_dilated` in its place (what
  `nn.Conv` runs by default); the returns must equal the first row's;
- `mlp 32`: the zoo's MinAtar policy (one 32-unit ReLU layer on the flattened grid), for scale.

A time is the best of `--repeats` calls after a compiling one; `vs lax` is the `lax conv` time
over the row's. Prints a table; writes JSON with the load average before and after each workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import jax
import numpy as np

from experiments.benchmarks.low_rank import _timed
from popeval import CNNPolicy, MLPPolicy, RolloutWrapper, make, policies

#: (environment, conv channels, kernel, num_env_steps)
WORKLOADS = (("Breakout-MinAtar", (16,), (3, 3), 500), ("Freeway-MinAtar", (8,), (3, 10), 1000),
             ("Asterix-MinAtar", (16,), (3, 3), 1000))
QUICK = (("Breakout-MinAtar", (4,), (3, 3), 50),)


def _timed_fitness(policy, env, env_params, num_env_steps: int, pop_params, keys, repeats: int,
                   lax_conv: bool = False):
    """`(result, best seconds)` of `policy`'s `population_fitness` (with lax's convolution if asked)."""
    wrapper = RolloutWrapper(policy.apply, env=env, env_params=env_params, num_env_steps=num_env_steps)
    saved = policies.conv_by_patches
    try:
        if lax_conv:
            policies.conv_by_patches = jax.lax.conv_general_dilated
        result = jax.block_until_ready(wrapper.population_fitness(keys, pop_params))
        return result, _timed(lambda: wrapper.population_fitness(keys, pop_params), repeats)[1]
    finally:
        policies.conv_by_patches = saved


def bench_workload(env_id: str, channels: tuple, kernel: tuple, num_env_steps: int, pop_size: int,
                   num_rollouts: int, repeats: int) -> list[dict]:
    """The rows of one workload."""
    env, env_params = make(env_id)
    keys = jax.random.split(jax.random.key(1), num_rollouts)
    members = jax.random.split(jax.random.key(0), pop_size)
    cnn = CNNPolicy.for_env(env, env_params, conv_channels=channels, kernel_size=kernel, hidden_sizes=(32,))
    mlp = MLPPolicy.for_env(env, env_params, hidden_sizes=(32,), activation="relu")
    init = lambda policy: jax.jit(jax.vmap(lambda k: policy.init_params(k, env, env_params)))(members)  # noqa: E731
    cnn_pop, mlp_pop = init(cnn), init(mlp)
    load_before = os.getloadavg()[0]
    args = (env, env_params, num_env_steps)
    programs = {"one product": _timed_fitness(cnn, *args, cnn_pop, keys, repeats),
                "lax conv": _timed_fitness(cnn, *args, cnn_pop, keys, repeats, lax_conv=True),
                "mlp 32": _timed_fitness(mlp, *args, mlp_pop, keys, repeats)}
    if not np.array_equal(np.asarray(programs["one product"][0].returns), np.asarray(programs["lax conv"][0].returns)):
        raise RuntimeError(f"{env_id}: the one-product CNN's returns differ from lax's convolution's")
    times = {name: seconds for name, (_, seconds) in programs.items()}
    rows = []
    for name, (result, _) in programs.items():
        steps = int(np.asarray(result.lengths, dtype=np.int64).sum())
        rows.append({"env": env_id, "conv_channels": list(channels), "kernel": list(kernel), "impl": name,
                     "pop_size": pop_size, "num_rollouts": num_rollouts, "num_env_steps": num_env_steps,
                     "time_s": times[name], "env_steps": steps, "steps_per_s": steps / times[name],
                     "vs_lax": times["lax conv"] / times[name], "load_before": load_before,
                     "load_after": os.getloadavg()[0]})
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'env':<18} {'cnn':<10} {'impl':<12} {'time ms':>9} {'steps/s':>9} {'vs lax':>7} {'load':>9}"]
    for r in rows:
        cnn = f"{'-'.join(map(str, r['conv_channels']))} {'x'.join(map(str, r['kernel']))}"
        lines.append(f"{r['env']:<18} {cnn:<10} {r['impl']:<12} {r['time_s'] * 1e3:>9.1f} {r['steps_per_s']:>9.3g} "
                     f"{r['vs_lax']:>7.2f} {r['load_before']:>4.1f}-{r['load_after']:<4.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.benchmarks cnn", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one small workload, P=8, 1 repeat")
    p.add_argument("--pop_size", type=int, default=128)
    p.add_argument("--num_rollouts", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="bench_results/cnn.json")
    args = p.parse_args(argv)
    workloads, pop_size, repeats = (QUICK, 8, 1) if args.quick else (WORKLOADS, args.pop_size, args.repeats)
    rows = []
    for workload in workloads:
        rows += bench_workload(*workload, pop_size, args.num_rollouts, repeats)
    print(format_table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "jax": jax.__version__,
               "devices": [str(d) for d in jax.local_devices()]}
    out.write_text(json.dumps({"machine": machine, "results": rows}, indent=2))
    print(f"wrote {out}")
    return 0
