"""Time to solve CartPole-v1 (population mean return 500) from process start.

Compares, each in a fresh Python process on the same machine:
  * popeval: `python -m popeval evolve --config experiments/configs/cartpole.yaml`
  * the anchor: evosax's OpenAI-ES (`evosax.algorithms.Open_ES`, same population 256 x 8
    rollouts, Adam 0.05, std 0.1, centred ranks) driving gymnax's CartPole-v1 through
    gymnax's `RolloutWrapper.population_rollout`, in the loop evosax's examples use.

    python -m experiments.benchmarks time_to_solve [--repeats 1] [--out bench_results/time_to_solve.json]
    python -m experiments.benchmarks time_to_solve --compile_options [--repeats 2]  # XLA's defaults vs popeval's

Reported: wall seconds from process start until the process exits after reaching the target
(so popeval's figure includes its final 64-episode evaluation and the PNG), generations, the
first generation's seconds (mostly compilation) and seconds per generation after the first.
popeval runs twice: with an empty compilation cache (cold) and with the cache the first run
filled (warm, what a re-run of a config costs). Timings are noisy on shared machines: compare the
two rows of one run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MAX_GENERATIONS = 200


def _anchor() -> None:
    """The evosax + gymnax loop (runs in its own process)."""
    import jax
    import jax.numpy as jnp
    import optax
    from evosax.algorithms import Open_ES
    from gymnax.experimental import RolloutWrapper

    from popeval import MLPPolicy, make

    env, env_params = make("CartPole-v1")  # only to build the same policy network
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(32, 32))
    params = policy.init_params(jax.random.key(0), env, env_params)
    manager = RolloutWrapper(policy.apply, env_name="CartPole-v1")
    es = Open_ES(256, params, optimizer=optax.adam(0.05), std_schedule=optax.constant_schedule(0.1))
    es_params = es.default_params
    key = jax.random.key(1)
    state = es.init(key, params, es_params)
    times = []
    for gen in range(MAX_GENERATIONS):  # noqa: B007 (the count is printed after the loop)
        t0 = time.perf_counter()
        key, k_ask, k_eval, k_tell = jax.random.split(key, 4)
        population, state = es.ask(k_ask, state, es_params)
        returns = manager.population_rollout(jax.random.split(k_eval, 8), population)[-1]
        fitness = returns.reshape(256, -1).mean(axis=1)
        state, _ = es.tell(k_tell, population, -fitness, state, es_params)  # evosax minimises
        mean = float(jnp.mean(fitness))
        times.append(time.perf_counter() - t0)
        if mean >= 500.0:
            break
    print(json.dumps({"generations": gen + 1, "solved": mean >= 500.0, "generation_seconds": times}))


def _run(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return wall, out.stdout


def _popeval_row(name: str, repeat: int, env: dict, tmp: Path) -> dict:
    run_dir = tmp / name.replace(" ", "-").replace("(", "").replace(")", "")
    wall, _ = _run([sys.executable, "-m", "popeval", "evolve", "--config",
                    "experiments/configs/cartpole.yaml", f"--run_dir={run_dir}",
                    "--quiet", "--wandb=disabled", f"--num_generations={MAX_GENERATIONS}"], env)
    result = json.loads((run_dir / "result.json").read_text())
    with open(run_dir / "metrics.csv") as f:
        elapsed = [float(x["time/elapsed"]) for x in csv.DictReader(f)]
    per_gen = (elapsed[-1] - elapsed[0]) / max(len(elapsed) - 1, 1)
    return {"name": name, "repeat": repeat, "wall_seconds": wall,
            "generations": result["generations"], "solved": result["solved_at"] is not None,
            "seconds_per_generation": per_gen, "devices": result["devices"],
            "first_generation_seconds": result["first_generation_seconds"],
            "final_mean_policy_return": result["mean_policy_return"]}


def measure(repeats: int = 1) -> list[dict]:
    """Runs each side `repeats` times; returns one row per run.

    popeval runs twice per repeat: with an empty compilation cache (cold: everything
    compiles) and again with the cache that run filled (warm: a re-run of the config, as
    `popeval evolve` does by default with `~/.cache/popeval/xla`).
    """
    env = {**os.environ, "WANDB_MODE": "disabled"}
    rows = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            env["POPEVAL_CACHE_DIR"] = str(Path(tmp) / "xla-cache")
            rows.append(_popeval_row("popeval evolve (cold cache)", r, env, Path(tmp)))
            rows.append(_popeval_row("popeval evolve (warm cache)", r, env, Path(tmp)))
        wall, out = _run([sys.executable, "-m", "experiments.benchmarks", "time_to_solve", "--anchor"], env)
        anchor = json.loads(out.strip().splitlines()[-1])
        gen_s = anchor["generation_seconds"]
        rows.append({"name": "evosax Open_ES + gymnax RolloutWrapper", "repeat": r, "wall_seconds": wall,
                     "generations": anchor["generations"], "solved": anchor["solved"],
                     "seconds_per_generation": sum(gen_s[1:]) / max(len(gen_s) - 1, 1), "devices": 1,
                     "first_generation_seconds": gen_s[0], "final_mean_policy_return": None})
    return rows


def compile_options(repeats: int = 1, generations: int = 40) -> list[dict]:
    """CartPole's generation program (the shipped config, one device per core) compiled with
    XLA's default options and with popeval's (`popeval.compiler.options()`), in this process:
    wall and process-CPU seconds of the XLA compilation, seconds per generation over
    `generations` generations from the same initial state, and whether all programs give the
    same fitness curve bit for bit. `repeats` alternates the two."""
    import resource

    import jax

    from popeval import compiler, sharding
    from popeval.strategies import load_config
    from popeval.strategies.run.programs import build, generation_step, init_fn

    def cpu():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    config = load_config(ROOT / "experiments" / "configs" / "cartpole.yaml")
    run, devices, seed = build(config), sharding.num_devices(), np.int32(config.run.seed)
    state = jax.jit(init_fn(run, config))(seed)
    rows, curves = [], []
    for name, options in [("XLA default", {}), ("popeval", compiler.options())] * repeats:
        step = generation_step(run, config, devices)
        lowered = step.lower(state, seed)
        t0, c0 = time.perf_counter(), cpu()
        step.compile(lowered, options)
        compile_s, compile_cpu_s = time.perf_counter() - t0, cpu() - c0
        stacked, stacked_seed = step.replicate(state), step.replicate(seed)
        curve, t0 = [], time.perf_counter()
        for _ in range(generations):
            stacked, metrics = step(stacked, stacked_seed)
            curve.append(float(np.asarray(step.first(metrics)["fitness/mean"]).reshape(-1)[0]))
        curves.append(curve)
        rows.append({"name": name, "options": options, "devices": devices, "compile_s": compile_s,
                     "compile_cpu_s": compile_cpu_s, "seconds_per_generation": (time.perf_counter() - t0) / generations,
                     "final_fitness_mean": curve[-1]})
    for row in rows:
        row["same_fitness_curve"] = all(c == curves[0] for c in curves)
    return rows


def _table(rows: list[dict], first: tuple[str, int], columns: list[tuple[str, str, str]]) -> str:
    """Rows as text: `first` = (header, width) of the name column; `columns` = (header, key,
    format spec) each."""
    widths = [max(len(h), 5) for h, _, _ in columns]
    lines = [" ".join([f"{first[0]:{first[1]}s}"] + [f"{h:>{w}s}" for (h, _, _), w in zip(columns, widths)])]
    for row in rows:
        cells = [f"{str(row[k]) if isinstance(row[k], bool) else format(row[k], spec):>{w}s}"
                 for (_, k, spec), w in zip(columns, widths)]
        lines.append(" ".join([f"{row['name']:{first[1]}s}"] + cells))
    return "\n".join(lines)


def format_options_table(rows: list[dict]) -> str:
    return _table(rows, ("generation program", 22), [
        ("compile s", "compile_s", ".2f"), ("cpu s", "compile_cpu_s", ".2f"),
        ("s/gen", "seconds_per_generation", ".3f"), ("same fitness", "same_fitness_curve", "")])


def format_table(rows: list[dict]) -> str:
    return _table(rows, ("", 42), [
        ("wall s", "wall_seconds", ".2f"), ("gens", "generations", "d"),
        ("gen 1 s", "first_generation_seconds", ".2f"), ("s/gen", "seconds_per_generation", ".3f"),
        ("solved", "solved", "")])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.benchmarks time_to_solve",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default="bench_results/time_to_solve.json")
    ap.add_argument("--compile_options", "--compile-options", action="store_true",
                    help="instead: CartPole's generation program at XLA's default options and at popeval's")
    args = ap.parse_args(argv)
    if args.anchor:
        _anchor()
        return 0
    if args.compile_options:
        rows = compile_options(args.repeats)
        print(format_options_table(rows))
        out = Path(args.out).with_name("compile_options.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2))
        return 0
    rows = measure(args.repeats)
    print(format_table(rows))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
