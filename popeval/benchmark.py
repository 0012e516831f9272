"""Population-evaluation benchmark: popeval's rollout paths against gymnax and evosax.

    popeval bench [--quick] [--envs ...] [--pop-sizes ...] [--out bench_results/benchmark.json]
    python experiments/benchmark.py [same arguments]      # the same, from a source checkout

Rows per environment and population size, in one process: popeval's trajectory and fitness
paths (compaction on and off), gymnax's RolloutWrapper and evosax's GymnaxProblem (`pip install
popeval[bench]`), then a memory check of the fitness path. What each column measures:
experiments/README.md. Compare rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from popeval.environments import make, registered_envs
from popeval.policies import MLPPolicy
from popeval.rollout import RolloutWrapper

ENVS = {  # id -> num_env_steps (None: the env's own episode limit)
    "CartPole-v1": None,
    "Pendulum-v1": None,
    "Acrobot-v1": None,
    "Breakout-MinAtar": 1000,
    "Seaquest-MinAtar": 1000,
}
POP_SIZES = (64, 512)
NUM_ROLLOUTS = 8
HIDDEN = (32, 32)
MEMORY_TARGET_MB = 300.0
IMPLS = ("popeval trajectory", "popeval fitness", "popeval fitness nc", "gymnax RolloutWrapper",
         "evosax GymnaxProblem")


def episode_lengths(done: np.ndarray) -> np.ndarray:
    """Steps up to and including the first `done` along the last axis (T if none)."""
    done = np.asarray(done)
    return np.where(done.any(-1), done.argmax(-1) + 1, done.shape[-1])


def measure(fn: Callable, args: tuple, repeats: int, max_mem_bytes: float) -> tuple[dict, Any]:
    """Compiles `fn(*args)` ahead of time, warms up, and times `repeats` calls.

    A program whose XLA temp + output buffers exceed `max_mem_bytes` is compiled but not
    run (`time_s` None): on a shared machine it could take the memory of other processes.
    """
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    mem_bytes = None if mem is None else int(mem.temp_size_in_bytes + mem.output_size_in_bytes)
    if mem_bytes is not None and mem_bytes > max_mem_bytes:
        return {"compile_s": compile_s, "time_s": None, "times_s": [], "mem_bytes": mem_bytes}, None
    out = jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return {"compile_s": compile_s, "time_s": statistics.median(times), "times_s": times,
            "mem_bytes": mem_bytes}, out


def _gymnax():
    """`(gymnax, its RolloutWrapper, evosax's GymnaxProblem or None)`, or Nones without gymnax."""
    try:
        import gymnax
        from gymnax.experimental import RolloutWrapper as GymnaxRolloutWrapper
    except ImportError:
        return None, None, None
    try:
        from evosax.problems import GymnaxProblem
    except ImportError:
        GymnaxProblem = None
    return gymnax, GymnaxRolloutWrapper, GymnaxProblem


def candidates(env_id: str, num_steps: int | None, policy, pop_params, keys) -> dict[str, tuple]:
    """impl name -> (fn(keys, pop_params), lengths(out) -> (P, B) episode lengths)."""
    out: dict[str, tuple] = {}
    for name, compaction in (("popeval fitness", True), ("popeval fitness nc", False)):
        w = RolloutWrapper(policy.apply, env_name=env_id, num_env_steps=num_steps, compaction=compaction)
        out[name] = (w.population_fitness, lambda r: np.asarray(r.lengths))
        if compaction:
            out["popeval trajectory"] = (w.population_rollout, lambda r: episode_lengths(r[4]))
            num_steps = w.num_env_steps
    gymnax, GymnaxRolloutWrapper, GymnaxProblem = _gymnax()
    if gymnax is not None and env_id in gymnax.registered_envs:
        try:
            gw = GymnaxRolloutWrapper(policy.apply, env_name=env_id, num_env_steps=num_steps)
        except NotImplementedError:  # e.g. an env gymnax lists but does not implement
            gw = None
        if gw is not None:
            out["gymnax RolloutWrapper"] = (gw.population_rollout, lambda r: episode_lengths(r[4]))
            if GymnaxProblem is not None:
                problem = GymnaxProblem(env_id, policy, episode_length=num_steps,
                                        num_rollouts=keys.shape[0], use_normalize_obs=False)
                state = problem.init(jax.random.key(0))

                def evosax_eval(keys, pop_params):
                    return problem.eval(keys[0], pop_params, state)

                def evosax_lengths(r):
                    # Gymnax's `step` auto-resets: the state after an episode's last step is
                    # a fresh one with time 0.
                    time_ = np.asarray(r[2]["env_states"][1].time)  # (P, B, T)
                    return episode_lengths(time_ == 0)

                out["evosax GymnaxProblem"] = (evosax_eval, evosax_lengths)
    return {name: out[name] for name in IMPLS if name in out}


def bench_env(env_id: str, num_steps: int | None, pop_size: int, num_rollouts: int, repeats: int,
              max_mem_bytes: float = float("inf"), log=print) -> list[dict]:
    env, env_params = make(env_id)
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=HIDDEN)
    init = jax.jit(jax.vmap(lambda k: policy.init_params(k, env, env_params)))
    pop_params = init(jax.random.split(jax.random.key(0), pop_size))
    keys = jax.random.split(jax.random.key(1), num_rollouts)
    rows = []
    for impl, (fn, lengths_of) in candidates(env_id, num_steps, policy, pop_params, keys).items():
        stats, out = measure(fn, (keys, pop_params), repeats, max_mem_bytes)
        steps = None if out is None else int(lengths_of(out).sum())
        del out
        row = {
            "env": env_id,
            "pop_size": pop_size,
            "num_rollouts": num_rollouts,
            "num_env_steps": int(num_steps if num_steps is not None else env_params.max_steps_in_episode),
            "impl": impl,
            **stats,
            "env_steps": steps,
            "steps_per_s": None if steps is None else steps / stats["time_s"],
        }
        rows.append(row)
        took = "not run (memory)" if steps is None else f"{stats['time_s']:.4f} s"
        log(f"  {env_id} P={pop_size} {impl}: {took} (compile {stats['compile_s']:.1f} s)")
    anchor = next((r["time_s"] for r in rows if r["impl"] == "gymnax RolloutWrapper"), None)
    for r in rows:
        r["speedup_vs_gymnax"] = None if anchor is None or r["time_s"] is None else anchor / r["time_s"]
    return rows


def _rss_bytes() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process(os.getpid()).memory_info().rss)


def memory_check(pop_size: int, num_rollouts: int, num_steps: int) -> dict:
    """XLA memory of the fitness (and trajectory) path for a long Pendulum evaluation."""
    env_kwargs = {"max_steps_in_episode": num_steps}
    env, env_params = make("Pendulum-v1", **env_kwargs)
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=HIDDEN)
    init = jax.jit(jax.vmap(lambda k: policy.init_params(k, env, env_params)))
    pop_params = init(jax.random.split(jax.random.key(0), pop_size))
    keys = jax.random.split(jax.random.key(1), num_rollouts)
    w = RolloutWrapper(policy.apply, env_name="Pendulum-v1", env_kwargs=env_kwargs, num_env_steps=num_steps)
    result: dict[str, Any] = {"env": "Pendulum-v1", "pop_size": pop_size, "num_rollouts": num_rollouts,
                              "num_env_steps": num_steps, "target_mb": MEMORY_TARGET_MB}
    for name, fn in (("fitness", w.population_fitness), ("trajectory", w.population_rollout)):
        mem = jax.jit(fn).lower(keys, pop_params).compile().memory_analysis()
        result[f"{name}_xla_temp_bytes"] = None if mem is None else int(mem.temp_size_in_bytes)
        result[f"{name}_xla_output_bytes"] = None if mem is None else int(mem.output_size_in_bytes)
        result[f"{name}_xla_mb"] = None if mem is None else (mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20
    rss0, peak0 = _rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fit = jax.block_until_ready(w.population_fitness(keys, pop_params))
    rss1, peak1 = _rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result["fitness_min_length"] = int(np.min(fit.lengths))
    result["fitness_rss_growth_mb"] = None if rss0 is None else (rss1 - rss0) / 2**20
    # ru_maxrss is in KiB on Linux; it only grows when this call exceeded the earlier peak.
    result["fitness_peak_rss_growth_mb"] = (peak1 - peak0) / 1024
    xla = result["fitness_xla_mb"]
    result["passed"] = None if xla is None else bool(xla < MEMORY_TARGET_MB)
    return result


def format_table(rows: list[dict]) -> str:
    header = (f"{'env':<18} {'P':>4} {'T':>5} {'impl':<22} {'time s':>9} {'compile s':>9} "
              f"{'steps/s':>11} {'x gymnax':>8} {'mem MB*':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        ratio = "" if r["speedup_vs_gymnax"] is None else f"{r['speedup_vs_gymnax']:.2f}"
        mem = "" if r["mem_bytes"] is None else f"{r['mem_bytes'] / 2**20:.1f}"
        if r["time_s"] is None:
            timing = f"{'not run':>9} {r['compile_s']:>9.1f} {'(memory)':>11}"
        else:
            timing = f"{r['time_s']:>9.4f} {r['compile_s']:>9.1f} {r['steps_per_s']:>11.3g}"
        lines.append(f"{r['env']:<18} {r['pop_size']:>4} {r['num_env_steps']:>5} {r['impl']:<22} "
                     f"{timing} {ratio:>8} {mem:>8}")
    lines.append("* mem MB: XLA compiled memory analysis, temp + output buffers (not process RSS). "
                 "steps/s counts steps before done only.")
    if any(r["time_s"] is None for r in rows):
        lines.append("  not run: the program's buffers exceed --max-mem-mb (compiled only).")
    return "\n".join(lines)


def format_memory(m: dict) -> str:
    mb = lambda x: "n/a" if x is None else f"{x:.1f} MB"  # noqa: E731
    return (
        f"memory check: {m['env']} P={m['pop_size']} B={m['num_rollouts']} T={m['num_env_steps']} "
        f"(shortest episode {m['fitness_min_length']} steps)\n"
        f"  fitness path    XLA temp+output {mb(m['fitness_xla_mb'])} "
        f"(target < {m['target_mb']:.0f} MB: {'PASS' if m['passed'] else 'FAIL'}); "
        f"process RSS growth over the first run {mb(m['fitness_rss_growth_mb'])}, "
        f"peak RSS growth {mb(m['fitness_peak_rss_growth_mb'])}\n"
        f"  trajectory path XLA temp+output {mb(m['trajectory_xla_mb'])} (for comparison)"
    )


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="CI mode: CartPole-v1 only, P=8, B=2, 50 steps, 1 repeat, small memory check")
    p.add_argument("--out", default="bench_results/benchmark.json", help="JSON output path")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per row (median reported)")
    p.add_argument("--envs", nargs="+", default=None, help="environment ids (default: all benchmarked)")
    p.add_argument("--pop-sizes", nargs="+", type=int, default=None)
    p.add_argument("--num-rollouts", type=int, default=NUM_ROLLOUTS)
    p.add_argument("--no-memory-check", action="store_true")
    p.add_argument("--max-mem-mb", type=float, default=3072.0,
                   help="compile but do not run programs whose XLA buffers exceed this (default 3072)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.quick:
        envs = {"CartPole-v1": 50}
        pop_sizes, num_rollouts, repeats = (8,), 2, 1
        memory = (8, 2, 50)
    else:
        envs = {e: t for e, t in ENVS.items() if e in registered_envs}
        pop_sizes, num_rollouts, repeats = POP_SIZES, args.num_rollouts, args.repeats
        memory = (512, 8, 1000)
    if args.envs:
        unknown = [e for e in args.envs if e not in registered_envs]
        if unknown:
            raise SystemExit(f"unknown environment id(s): {', '.join(unknown)}")
        envs = {e: envs.get(e, ENVS.get(e)) for e in args.envs}
    if args.pop_sizes:
        pop_sizes = tuple(args.pop_sizes)

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    skipped = sorted(set(ENVS) - set(envs)) if not (args.quick or args.envs) else []
    rows: list[dict] = []
    for env_id, num_steps in envs.items():
        for pop_size in pop_sizes:
            rows.extend(bench_env(env_id, num_steps, pop_size, num_rollouts, repeats,
                                  args.max_mem_mb * 2**20, log))
    mem = None if args.no_memory_check else memory_check(*memory)

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    report = {
        "config": {"quick": args.quick, "envs": list(envs), "pop_sizes": list(pop_sizes),
                   "num_rollouts": num_rollouts, "repeats": repeats, "hidden_sizes": list(HIDDEN),
                   "max_mem_mb": args.max_mem_mb,
                   "not_registered": skipped},
        "machine": {"jax": jax.__version__, "backend": jax.default_backend(),
                    "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
                    "platform": platform.platform(), "load_average": load},
        "columns": {"time_s": "median wall seconds per population evaluation (None: not run, "
                              "its buffers exceed max_mem_mb)",
                    "compile_s": "trace + lower + compile seconds",
                    "steps_per_s": "env steps before done / time_s",
                    "mem_bytes": "XLA compiled temp + output buffer bytes",
                    "speedup_vs_gymnax": "gymnax RolloutWrapper time_s / time_s"},
        "results": rows,
        "memory_check": mem,
    }
    print(format_table(rows))
    if _gymnax()[0] is None:
        print("gymnax and evosax rows are missing: pip install 'popeval[bench]' adds them")
    if mem is not None:
        print(format_memory(mem))
    if load is not None:
        print(f"load average during the run: {load[0]:.1f} (on {os.cpu_count()} cores); timings are noisy")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
