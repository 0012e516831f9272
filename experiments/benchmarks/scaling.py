"""Scaling of the evolve loop: time per generation over processes and devices, the bytes a
generation communicates, and per-device memory with and without `sharded_sampling`.

    python -m experiments.benchmarks scaling [--quick] [--configs cartpole pendulum_cma_es]
        [--layouts 1x1 2x1 4x1 1x2 1x4]

Every layout is a fresh `popeval launch` (or one `popeval evolve`) of a shipped config for a
few generations; a generation's time is the median of `metrics.csv`'s `time/elapsed`
differences after the first two (compilation, and the generation dispatched with it).
Communicated bytes and per-device memory come from the generation compiled as one program over
the devices (`programs.generation_fn`, what accelerators run; XLA's collectives in its HLO and
`memory_analysis()`), compiled in a process with the layout's device count, so a memory row
does not need the memory it reports. On CPUs the timed runs evaluate in one-device programs
and gather on the host (`sharding.Pieces`). Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1]
CONFIGS = EXPERIMENTS / "configs"
#: The repository's root: a worker process runs `python -m experiments.benchmarks scaling --worker` there.
REPO = EXPERIMENTS.parent
LAYOUTS = ("1x1", "2x1", "4x1", "1x2", "1x4")
#: The memory comparison: OpenAI-ES, P = 65,536, a 4-96-96-2 MLP (9,986 parameters), 4 devices.
MEMORY_CASE = {"env_name": "CartPole-v1", "strategy": "openai_es", "pop_size": 65536, "num_rollouts": 1,
               "hidden_sizes": [96, 96], "num_env_steps": 200, "compaction": False}
QUICK_MEMORY_CASE = {**MEMORY_CASE, "pop_size": 4096, "hidden_sizes": [32, 32]}
_DTYPE_BYTES = {"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "pred": 1, "s8": 1, "u8": 1,
                "f16": 2, "bf16": 2}


def collective_bytes(hlo: str) -> dict[str, int]:
    """Bytes of the results of each kind of cross-device collective in an optimised HLO module
    (per device: what one device receives, its own share included)."""
    out: dict[str, int] = {}
    for line in hlo.splitlines():
        m = re.search(r"=\s*(\(?[^=]*?\)?)\s+(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)"
                      r"(-start)?\(", line)
        if not m:
            continue
        size = 0
        for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", m.group(1)):
            n = 1
            for d in filter(None, dims.split(",")):
                n *= int(d)
            size += n * _DTYPE_BYTES.get(dtype, 4)
        out[m.group(2)] = out.get(m.group(2), 0) + size
    return out


def _program_worker(config: dict) -> dict:
    """In a process with the layout's devices: the generation program's memory and collectives."""
    import jax
    import numpy as np

    from popeval import sharding
    from popeval.strategies.run.config import config_from_dict
    from popeval.strategies.run.programs import build, generation_fn, init_fn

    cfg = config_from_dict(config)
    run, devices = build(cfg), sharding.num_devices()
    step = sharding.Replicated(generation_fn(run, cfg, devices), devices)
    seed = np.int32(0)
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), jax.eval_shape(init_fn(run, cfg), seed))
    compiled = step.lower(spec, seed).compile()
    mem = compiled.memory_analysis()
    params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(run.template))
    return {"devices": devices, "params": params, "pop_size": cfg.strategy.pop_size,
            "argument_bytes": int(mem.argument_size_in_bytes), "output_bytes": int(mem.output_size_in_bytes),
            "temp_bytes": int(mem.temp_size_in_bytes),
            "collective_bytes": collective_bytes(compiled.as_text())}


def program_stats(config: dict, devices: int) -> dict:
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-m", "experiments.benchmarks", "scaling", "--worker", json.dumps(config)],
                         capture_output=True, text=True, env=env, cwd=REPO)
    if out.returncode:
        raise RuntimeError(f"compiling {config} on {devices} devices failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_layout(config_path: Path, processes: int, devices: int, generations: int, work: Path) -> dict:
    """Runs a config for `generations` in `processes` x `devices`; per-generation seconds."""
    run_dir = work / f"{config_path.stem}-{processes}x{devices}"
    args = ["evolve", f"--config={config_path}", f"--num_generations={generations}", "--stop_at_target=false",
            f"--run_dir={run_dir}", "--quiet", "--wandb=disabled", "--eval_every=1000"]
    env = dict(os.environ, POPEVAL_CACHE_DIR="", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    if processes == 1:
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
        cmd = [sys.executable, "-m", "popeval", *args]
    else:
        cmd = [sys.executable, "-m", "popeval", "launch", f"--processes={processes}",
               f"--devices_per_process={devices}", f"--log_dir={run_dir}-logs", "--", *args]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    import csv

    with open(run_dir / "metrics.csv", newline="") as f:
        elapsed = [float(r["time/elapsed"]) for r in csv.DictReader(f)]
    per_gen = [b - a for a, b in zip(elapsed[1:], elapsed[2:])]
    return {"config": config_path.stem, "processes": processes, "devices_per_process": devices,
            "generations": len(elapsed), "seconds_per_generation": statistics.median(per_gen),
            "first_generation_seconds": elapsed[0], "wall_seconds": wall}


def run_case(config: dict, devices: int, generations: int, work: Path) -> dict:
    """Runs `config` for `generations` in one process with `devices` CPU devices: seconds per
    generation after the first, and the process's peak resident memory."""
    run_dir = work / "memory-case"
    overrides = [f"--{k}={json.dumps(v)}" for k, v in config.items()]
    cmd = [sys.executable, "-m", "popeval", "evolve", *overrides, f"--num_generations={generations}",
           "--eval_every=1000", "--eval_episodes=2", "--checkpoint_every=1000", f"--run_dir={run_dir}",
           "--quiet", "--wandb=disabled"]
    peak = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), JAX_PLATFORMS="cpu", POPEVAL_CACHE_DIR="")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", peak, *cmd], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    import csv

    with open(run_dir / "metrics.csv", newline="") as f:
        elapsed = [float(r["time/elapsed"]) for r in csv.DictReader(f)]
    return {"seconds_per_generation": statistics.median(b - a for a, b in zip(elapsed, elapsed[1:])),
            "first_generation_seconds": elapsed[0], "peak_rss_bytes": int(out.stdout.split()[-1]) * 1024}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.benchmarks scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="*", default=["cartpole", "pendulum_cma_es"],
                   help="experiments/configs/<name>.yaml (none: the memory rows only)")
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), help="PROCESSESxDEVICES each (default: %(default)s)")
    p.add_argument("--generations", type=int, default=12)
    p.add_argument("--quick", action="store_true", help="2 layouts, 5 generations, a small memory case")
    p.add_argument("--no_memory", "--no-memory", action="store_true",
                   help="skip the sharded_sampling memory comparison")
    p.add_argument("--no_run", "--no-run", action="store_true", help="compile the memory case only (do not run it)")
    p.add_argument("--out", default="bench_results/scaling.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(_program_worker(json.loads(args.worker))))
        return 0
    layouts = ["1x1", "2x1"] if args.quick else args.layouts
    generations = 5 if args.quick else args.generations
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"scaling benchmark on {platform.node()} ({os.cpu_count()} CPUs), load average {load:.2f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="popeval-scaling-") as tmp:
        for name in args.configs:
            path = CONFIGS / f"{name}.yaml"
            import yaml

            config = yaml.safe_load(path.read_text())
            for layout in layouts:
                processes, devices = (int(v) for v in layout.split("x"))
                row = time_layout(path, processes, devices, generations, Path(tmp))
                stats = program_stats({**config, "num_generations": generations}, processes * devices)
                total = processes * devices  # a device receives all but its own share of what is gathered
                row["received_bytes_per_device"] = sum(stats["collective_bytes"].values()) * (total - 1) // total
                rows.append(row)
                _write(args.out, load, rows, [])
                print(f"{name:10s} {processes} proc x {devices} dev: {row['seconds_per_generation'] * 1e3:8.1f} ms "
                      f"per generation, {row['received_bytes_per_device']:,} bytes received per device, "
                      f"first generation {row['first_generation_seconds']:.1f} s", flush=True)
    memory = []
    if not args.no_memory:
        case = QUICK_MEMORY_CASE if args.quick else MEMORY_CASE
        for sharded in (False, True):
            stats = program_stats({**case, "sharded_sampling": sharded}, 4)
            stats["sharded_sampling"] = sharded
            stats["per_device_bytes"] = stats["argument_bytes"] + stats["output_bytes"] + stats["temp_bytes"]
            memory.append(stats)
            _write(args.out, load, rows, memory)
            print(f"OpenAI-ES P={case['pop_size']:,} x {stats['params']:,} params on 4 devices, "
                  f"sharded_sampling={sharded}: {stats['per_device_bytes'] / 2**20:,.1f} MiB per device "
                  f"(temp {stats['temp_bytes'] / 2**20:,.1f} MiB)", flush=True)
        print(f"ratio sharded / replicated: {memory[1]['per_device_bytes'] / memory[0]['per_device_bytes']:.3f}")
        if not args.no_run:
            with tempfile.TemporaryDirectory(prefix="popeval-scaling-") as tmp:
                ran = run_case({**case, "sharded_sampling": True}, 4, 3, Path(tmp))
            memory[1]["run"] = ran
            print(f"  ran sharded_sampling on 4 devices: {ran['seconds_per_generation']:.1f} s per generation, "
                  f"peak resident memory {ran['peak_rss_bytes'] / 2**30:.2f} GiB (all 4 devices)", flush=True)
    _write(args.out, load, rows, memory)
    print(f"wrote {args.out}")
    return 0


def _write(out: str, load: float, rows: list, memory: list) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"load_average": load, "load_average_end": os.getloadavg()[0],
                                     "cpus": os.cpu_count(), "timing": rows, "memory": memory}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
