"""Population-evaluation benchmark: popeval against gymnax's best case and the machine's limit.

    python -m experiments.benchmarks [--quick] [--envs ...] [--pop_sizes ...] [--devices N ...] [--out FILE]

Rows per workload and population size (the programs: `experiments.benchmarks.programs`), then two
memory checks of the fitness path. What each row and column measures: experiments/benchmarks/README.md.
Compare rows of one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax

from experiments.benchmarks import programs as bp
from experiments.benchmarks.checks import (
    EAGER_ENVS,
    EAGER_STEPS,
    MB,
    MEMORY,
    QUICK_EAGER_STEPS,
    QUICK_MEMORY,
    eager_check,
    format_eager,
    format_memory,
    memory_check,
    time_interleaved,
    wait_for_quiet,
)
from popeval import sharding
from popeval.environments import registered_envs

#: workload -> num_env_steps (None: the env's own episode limit)
MINATAR_STEPS = 1000
WORKLOADS = {"CartPole-v1": None, bp.TRAINED: None, "Pendulum-v1": None, "Acrobot-v1": None,
             "Breakout-MinAtar": MINATAR_STEPS, "Seaquest-MinAtar": MINATAR_STEPS}
POP_SIZES = (64, 512)
NUM_ROLLOUTS = 8
QUICK_STEPS = {"CartPole-v1": 50, bp.TRAINED: 50}
#: The rows re-run in a subprocess for each other device count.
DEVICE_ROWS = ("popeval fitness", "popeval fitness nc", "fused limit")
SLOW_CALL_S = 30.0
COLUMNS = {  # what the result rows' numbers are
    "time_s": "median wall seconds per evaluation (None: not run, its buffers exceed max_mem_mb)",
    "times_s": f"the timed calls (one, the warm-up, when it took over {SLOW_CALL_S:.0f} s)",
    "compile_s": "trace + lower + compile seconds", "devices": "devices the program runs on",
    "parts": "pieces a device run side by side on threads (RolloutWrapper's threads; one program each)",
    "load_before": "1-minute load average when the workload started (after --quiet_below's wait)",
    "env_steps": "steps before done (fused limit: all P*B*T steps)", "steps_per_s": "env_steps / time_s",
    "min_length": "shortest episode (steps before done)", "mem_bytes": "XLA temp + output bytes, all devices and parts",
    "live_over_limit": "steps_per_s / the fused limit's steps_per_s at the same device count (popeval rows)",
    "speedup_vs_gymnax_best": "gymnax best case time_s / time_s",
    "speedup_vs_gymnax_same_options": "gymnax best, popeval opts time_s / time_s (None: no such row)"}
_CHILD = "POPEVAL_BENCH_DEVICES"  # set in a device-count subprocess: the count it must have
#: The repository's root: a device-count subprocess runs `python -m experiments.benchmarks` there.
REPO = Path(__file__).resolve().parents[2]


def prepare(fn: Callable, args: tuple, max_mem_bytes: float, devices: int = 1,
            options: dict | None = None, parts: int = 1) -> tuple[dict, Any, Any]:
    """Compiles `fn(*args)` (XLA `options`) for the pieces a call from Python splits the
    parameters into (`sharding.split_members`: `parts` a device; on CPUs one-device programs, one
    compiled program per device and piece shape) and warms it up: `(stats, compiled or None,
    the warm-up's output or None)`. The pieces run side by side on threads, as the wrapper's do.
    A program whose XLA temp + output buffers (all pieces) exceed `max_mem_bytes` is compiled
    but not run (`time_s` None; it could take a shared machine's memory). A warm-up call over
    `SLOW_CALL_S` seconds is the program's one timing (`compiled` None)."""
    split = partial(sharding.split_members, devices=sharding.resolve_devices(devices), parts=parts)
    programs: dict = {}

    def program(piece):  # a compiled program runs on the devices it was compiled for
        key = tuple((x.shape, str(getattr(x, "sharding", None))) for x in jax.tree.leaves(piece))
        if key not in programs:
            programs[key] = jax.jit(fn).lower(args[0], piece, *args[2:]).compile(options)
        return programs[key]

    t0 = time.perf_counter()
    first = program(split(args[1])[0])
    compile_s = time.perf_counter() - t0
    mem_bytes = bp.xla_bytes(first, devices)  # one device's, or on CPUs one piece's, times the devices
    mem_bytes = None if mem_bytes is None else parts * mem_bytes
    stats = {"compile_s": compile_s, "time_s": None, "times_s": [], "mem_bytes": mem_bytes}
    if mem_bytes is not None and mem_bytes > max_mem_bytes:
        return stats, None, None

    def compiled(keys, pop_params, *rest):
        return sharding.run_parts(lambda part: program(part)(keys, part, *rest), split(pop_params))

    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    warm_up = time.perf_counter() - t0
    if warm_up >= SLOW_CALL_S:
        return {**stats, "time_s": warm_up, "times_s": [warm_up]}, None, out
    return stats, compiled, out


def bench_workload(workload: str, num_steps: int | None, pop_size: int, num_rollouts: int, repeats: int,
                   max_mem_bytes: float = float("inf"), impls: tuple[str, ...] = bp.IMPLS,
                   log: Callable[[str], None] = print, threads: int | None = None) -> list[dict]:
    """The rows of one workload and population size (ratios: `add_ratios`): every program is
    compiled and warmed up, then timed `repeats` times in turns (`time_interleaved`)."""
    pop, keys = bp.population(workload, pop_size, num_steps), jax.random.split(jax.random.key(1), num_rollouts)
    args, rows, compiled = (keys, pop.pop_params, pop.env_params), {}, {}
    for impl, prog in bp.programs(pop, keys, impls, threads).items():
        stats, fn, out = prepare(prog.fn, args, max_mem_bytes, prog.devices, prog.options, prog.parts)
        lengths = None if out is None else prog.lengths(out)
        del out
        if fn is not None:
            compiled[impl] = fn
        steps = None if lengths is None else (
            pop_size * num_rollouts * pop.num_env_steps if prog.all_steps else int(lengths.sum()))
        rows[impl] = {"workload": workload, "env": pop.env_id, "pop_size": pop_size, "num_rollouts": num_rollouts,
                      "num_env_steps": pop.num_env_steps, "devices": prog.devices, "parts": prog.parts,
                      "impl": impl, **stats,
                      "env_steps": steps, "min_length": None if lengths is None else int(lengths.min())}
        if workload == bp.TRAINED and lengths is not None and rows[impl]["min_length"] < pop.num_env_steps:
            raise RuntimeError(f"{workload}: an episode of {impl} ended after {rows[impl]['min_length']} steps; "
                               f"every episode of the trained population must last all {pop.num_env_steps}")
    for impl, times in time_interleaved(compiled, args, repeats).items():
        rows[impl].update(time_s=statistics.median(times), times_s=times)
    for impl, row in rows.items():
        row["steps_per_s"] = None if row["time_s"] is None else row["env_steps"] / row["time_s"]
        took = "not run (memory)" if row["time_s"] is None else f"{row['time_s']:.4f} s"
        log(f"  {workload} P={pop_size} devices={row['devices']} {impl}: {took} (compile {row['compile_s']:.1f} s)")
    return list(rows.values())


def add_ratios(rows: list[dict]) -> list[dict]:
    """Sets `speedup_vs_gymnax_best` (gymnax best case time / time, per workload and P),
    `speedup_vs_gymnax_same_options` (the same with gymnax compiled with popeval's options) and,
    on popeval's rows, `live_over_limit` (steps/s / the fused limit's steps/s at the same device
    count); returns the rows sorted by workload, P, impl and devices."""
    def times(impl):
        return {(r["workload"], r["pop_size"]): r["time_s"] for r in rows if r["impl"] == impl}

    best, same = times("gymnax best case"), times("gymnax best, popeval opts")
    limit = {(r["workload"], r["pop_size"], r["devices"]): r["steps_per_s"] for r in rows
             if r["impl"] == "fused limit"}
    for r in rows:
        for key, anchors in (("speedup_vs_gymnax_best", best), ("speedup_vs_gymnax_same_options", same)):
            anchor = anchors.get((r["workload"], r["pop_size"]))
            r[key] = None if anchor is None or r["time_s"] is None else anchor / r["time_s"]
        fused = limit.get((r["workload"], r["pop_size"], r["devices"]))
        live = r["impl"].startswith("popeval") and fused and r["steps_per_s"] is not None
        r["live_over_limit"] = r["steps_per_s"] / fused if live else None
    order = list(dict.fromkeys(r["workload"] for r in rows))
    return sorted(rows, key=lambda r: (order.index(r["workload"]), r["pop_size"], bp.IMPLS.index(r["impl"]),
                                       r["devices"]))


def device_rows(devices: int, workloads: list[str], argv: list[str]) -> list[dict]:
    """Rows with `devices` CPU devices: a fresh `python -m experiments.benchmarks` with
    `JAX_NUM_CPU_DEVICES` set (it must be set before JAX starts). `argv`: its other options."""
    if jax.default_backend() != "cpu":
        raise ValueError(f"--devices {devices}: other device counts are CPU-only (JAX_NUM_CPU_DEVICES); this "
                         f"process runs on {jax.default_backend()} with {jax.local_device_count()} device(s)")
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), **{_CHILD: str(devices)})
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "experiments.benchmarks", *argv, "--envs", *workloads, "--devices", str(devices),
               "--no_memory_check", "--no_eager_check", "--out", str(out)]
        if subprocess.run(cmd, check=False, env=env, cwd=REPO, stdout=subprocess.PIPE).returncode:
            raise RuntimeError(f"the devices={devices} benchmark process failed (its output is above)")
        return json.loads(out.read_text())["results"]


def format_table(rows: list[dict]) -> str:
    """The rows as a text table, with notes on the columns."""
    header = (f"{'workload':<20} {'P':>5} {'T':>5} {'dev':>3} {'impl':<25} {'time s':>8} {'compile s':>9} "
              f"{'steps/s':>9} {'live/limit':>10} {'x gymnax best':>13} {'x same opts':>11} {'mem MB':>8} "
              f"{'min len':>7}")
    lines = [header, "-" * len(header)]

    def fmt(x, spec):
        return "" if x is None else format(x, spec)

    for r in rows:
        timing = (f"{'not run':>8} {r['compile_s']:>9.1f} {'(memory)':>9}" if r["time_s"] is None else
                  f"{r['time_s']:>8.4f} {r['compile_s']:>9.1f} {r['steps_per_s']:>9.3g}")
        mem = None if r["mem_bytes"] is None else r["mem_bytes"] / MB
        lines.append(f"{r['workload']:<20} {r['pop_size']:>5} {r['num_env_steps']:>5} {r['devices']:>3} "
                     f"{r['impl']:<25} {timing} {fmt(r['live_over_limit'], '.2f'):>10} "
                     f"{fmt(r['speedup_vs_gymnax_best'], '.2f'):>13} "
                     f"{fmt(r['speedup_vs_gymnax_same_options'], '.2f'):>11} {fmt(mem, '.1f'):>8} "
                     f"{fmt(r['min_length'], 'd'):>7}")
    lines.append("steps/s: steps before done per second (fused limit: all P*B*T steps). live/limit: steps/s "
                 "over the fused limit's at the same device count. x gymnax best: gymnax best case time / time. x same "
                 "opts: gymnax best case compiled with popeval's XLA options (popeval.compiler) time / time. "
                 "mem MB: XLA temp + output buffers, all devices (not RSS). min len: shortest episode. not run "
                 "(memory): compiled only, its buffers exceed --max_mem_mb.")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.benchmarks",
                                description=__doc__.split("\n\n")[0],
                                epilog="the other benchmarks: python -m experiments.benchmarks {scaling, low_rank, "
                                       "cnn, suites, time_to_solve, brax_throughput} --help")
    p.add_argument("--quick", action="store_true",
                   help="CI mode: CartPole-v1 only, P=8, B=2, 50 steps, 1 repeat, small memory checks")
    p.add_argument("--out", default="bench_results/benchmark.json", help="JSON output path")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per row, median reported (default 5)")
    p.add_argument("--envs", nargs="+", default=None, metavar="WORKLOAD",
                   help=f"environment ids (a fresh population) or '{bp.TRAINED}' (default: {', '.join(WORKLOADS)})")
    p.add_argument("--pop_sizes", "--pop-sizes", nargs="+", type=int, default=None, help="default: 64 512")
    p.add_argument("--num_rollouts", "--num-rollouts", type=int, default=None, help="episodes per member B (default 8)")
    p.add_argument("--devices", nargs="+", type=int, default=None, metavar="N",
                   help=f"device counts; each but this process's count (the default) re-runs the rows {DEVICE_ROWS} "
                        "in a subprocess with JAX_NUM_CPU_DEVICES=N")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="parts on threads for popeval's rows and the fused limit on CPUs (RolloutWrapper's threads; "
                        "default: the cores per device; 1: one program per device)")
    p.add_argument("--impls", nargs="+", default=list(bp.IMPLS), choices=bp.IMPLS, metavar="IMPL",
                   help="only these rows (default: all)")
    p.add_argument("--quiet_below", "--quiet-below", type=float, default=None, metavar="LOAD",
                   help="before each workload, wait (up to 5 minutes) until the 1-minute load average is below LOAD")
    p.add_argument("--no_memory_check", "--no-memory-check", action="store_true")
    p.add_argument("--no_eager_check", "--no-eager-check", action="store_true",
                   help="skip the eager env.step loop timings")
    p.add_argument("--max_mem_mb", "--max-mem-mb", type=float, default=3072.0,
                   help="compile but do not run programs whose XLA buffers exceed this (default 3072)")
    return p.parse_args(argv)


def _workloads(args: argparse.Namespace) -> dict[str, int | None]:
    """This run's workloads -> num_env_steps (None: the env's own episode limit)."""
    names = args.envs or (["CartPole-v1"] if args.quick else
                          [w for w in WORKLOADS if w == bp.TRAINED or w in registered_envs])
    unknown = [w for w in names if w != bp.TRAINED and w not in registered_envs]
    if unknown:
        raise SystemExit(f"unknown workload(s): {', '.join(unknown)} (an environment id or '{bp.TRAINED}')")
    steps = {**WORKLOADS, **QUICK_STEPS} if args.quick else WORKLOADS
    # MinAtar games have no episode limit of their own (Freeway's is 2500): T=1000 unless listed.
    return {w: steps.get(w, MINATAR_STEPS if w.endswith("-MinAtar") else None) for w in names}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    workloads = _workloads(args)
    pop_sizes = tuple(args.pop_sizes or ((8,) if args.quick else POP_SIZES))
    num_rollouts = args.num_rollouts if args.num_rollouts is not None else (2 if args.quick else NUM_ROLLOUTS)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    local = jax.local_device_count()
    devices = list(dict.fromkeys(args.devices or [local]))
    if min(*pop_sizes, num_rollouts, repeats, *devices, 1 if args.threads is None else args.threads) < 1:
        raise SystemExit("--pop_sizes, --num_rollouts, --repeats, --devices and --threads take integers >= 1")
    if os.environ.get(_CHILD) and int(os.environ[_CHILD]) != local:
        raise SystemExit(f"this benchmark process was started for {os.environ[_CHILD]} devices but has {local}")
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load_start is not None:
        print(f"load average at start: {load_start[0]:.2f} (on {os.cpu_count()} cores)", flush=True)
    log = partial(print, file=sys.stderr, flush=True)
    rows: list[dict] = []
    for workload, num_steps in workloads.items():
        for pop_size in pop_sizes:
            load = wait_for_quiet(args.quiet_below, log)
            rows.extend({**row, "load_before": load} for row in bench_workload(
                workload, num_steps, pop_size, num_rollouts, repeats, args.max_mem_mb * MB, tuple(args.impls), log,
                args.threads))
    shared = [*(["--quick"] if args.quick else []), "--pop_sizes", *map(str, pop_sizes), "--num_rollouts",
              str(num_rollouts), "--repeats", str(repeats), "--max_mem_mb", str(args.max_mem_mb)]
    shared += [] if args.quiet_below is None else ["--quiet_below", str(args.quiet_below)]
    shared += [] if args.threads is None else ["--threads", str(args.threads)]
    shared += ["--impls", *(i for i in DEVICE_ROWS if i in args.impls)]
    for n in devices:
        if n != local and shared[-1] != "--impls":
            rows.extend(device_rows(n, list(workloads), shared))
    rows = add_ratios(rows)
    mem = None if args.no_memory_check else memory_check(**(QUICK_MEMORY if args.quick else MEMORY))
    eager = None if args.no_eager_check else eager_check(EAGER_ENVS, QUICK_EAGER_STEPS if args.quick else EAGER_STEPS)
    load_end = os.getloadavg() if hasattr(os, "getloadavg") else None
    report = {
        "config": {"quick": args.quick, "envs": list(workloads), "pop_sizes": list(pop_sizes),
                   "num_rollouts": num_rollouts, "repeats": repeats, "hidden_sizes": list(bp.HIDDEN),
                   "devices": devices, "threads": args.threads, "impls": list(args.impls),
                   "max_mem_mb": args.max_mem_mb},
        "machine": {"jax": jax.__version__, "backend": jax.default_backend(), "local_devices": local,
                    "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
                    "platform": platform.platform(), "load_average_start": load_start, "load_average_end": load_end},
        "columns": COLUMNS,
        "results": rows,
        "memory_check": mem,
        "eager_check": eager,
    }
    print(format_table(rows))
    if importlib.util.find_spec("gymnax") is None:
        print("gymnax and evosax rows are missing: pip install 'popeval[bench]' adds them")
    if mem is not None:
        print(format_memory(mem))
    if eager is not None:
        print(format_eager(eager))
    if load_end is not None:
        print(f"load average at end: {load_end[0]:.2f} (on {os.cpu_count()} cores); timings are noisy", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
