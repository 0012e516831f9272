"""EGGROLL against OpenAI-ES at equal environment budgets: each comparison runs both
strategies on the same task, network, population, episodes and generations, with three seeds
each, one run after another, and prints a markdown table (median and range over the seeds).

    python -m experiments.learning                      # every comparison (about 70 minutes here)
    python -m experiments.learning cartpole acrobot pendulum  # the small tasks (about 10 minutes)
    python -m experiments.learning acrobot --seeds 0 1  # some, with other seeds
    python -m experiments.learning --json out.json      # the rows as JSON as well

A row's return is the run's final evaluation of the mean policy (its config's `eval_episodes`
episodes, 64 here); its target is the config's (Breakout: a population mean fitness of 5), and
the wall time to it counts from the run's start, compilation included. OpenAI-ES is evosax's
`Open_ES`; EGGROLL is `popeval.strategies.algorithms.eggroll` at rank 1, and at rank 4, with the same
sigma, learning rate and optimizer (Adam). Both start from the same policy parameters (the
seed's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SETTINGS = {"learning_rate": 0.05, "std_init": 0.1}
STRATEGIES = {"openai_es": {"strategy": "openai_es", "strategy_kwargs": SETTINGS},
              "eggroll": {"strategy": "eggroll", "strategy_kwargs": {"rank": 1, "sigma": 0.1, "learning_rate": 0.05}},
              "eggroll r=4": {"strategy": "eggroll", "strategy_kwargs": {"rank": 4, "sigma": 0.1,
                                                                        "learning_rate": 0.05}}}
#: name: (shipped config, overrides shared by both strategies)
COMPARISONS = {
    "cartpole": ("cartpole.yaml", {}),
    "acrobot": ("acrobot.yaml", {}),
    "pendulum": ("pendulum.yaml", {"num_rollouts": 32, "num_generations": 400, "eval_every": 100}),
    "breakout": ("breakout_minatar.yaml", {"hidden_sizes": [256, 256], "activation": "tanh", "target": 5.0,
                                           "num_generations": 800, "eval_every": 100}),
}


def run(name: str, strategy: str, seed: int, root: Path) -> dict:
    from popeval.strategies import RunOptions, evolve, load_config

    config_file, shared = COMPARISONS[name]
    config = load_config(CONFIGS / config_file, {**shared, **STRATEGIES[strategy], "seed": seed,
                                                 "checkpoint_every": 10**6})
    start = time.perf_counter()
    run_dir = root / f"{name}-{strategy.replace(' ', '_')}-{seed}"
    summary = evolve(config, RunOptions(run_dir=str(run_dir), wandb="disabled", progress=False))
    sizes = "x".join(map(str, config.policy.hidden_sizes))
    setup = (f"{config.environment.name} (MLP {sizes}, {config.strategy.pop_size} x "
             f"{config.run.num_rollouts}, {config.run.num_generations} generations)")
    solved = summary.get("solved_at")
    return {"comparison": name, "setup": setup, "strategy": strategy, "seed": seed,
            "return": summary["mean_policy_return"], "solved_at": solved and solved["generation"],
            "solved_s": solved and solved["seconds"],
            "generations": summary["generations"], "env_steps": summary["env_steps"],
            "wall_s": time.perf_counter() - start}


def _solved(row: dict) -> str:
    if row["solved_at"] is None:
        return "-"
    return f"{row['solved_at']} ({row['solved_s']:.0f} s)" if row.get("solved_s") else str(row["solved_at"])


def table(rows: list[dict]) -> str:
    lines = ["| task (network, pop x episodes, generations) | strategy | final return: median (range) "
             "| target reached at generation (wall) | env steps (median) | wall (median) |",
             "|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["comparison"] for r in rows):
        for strategy in STRATEGIES:
            group = [r for r in rows if r["comparison"] == name and r["strategy"] == strategy]
            if not group:
                continue
            returns = [r["return"] for r in group]
            solved = ", ".join(_solved(r) for r in group)
            lines.append(f"| {group[0]['setup']} | {strategy} | {statistics.median(returns):.1f} "
                         f"({min(returns):.1f} to {max(returns):.1f}) | {solved} "
                         f"| {statistics.median(r['env_steps'] for r in group) / 1e6:.1f}M "
                         f"| {statistics.median(r['wall_s'] for r in group):.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m experiments.learning", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"comparisons (default: all): {', '.join(COMPARISONS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(COMPARISONS))
    if unknown:
        parser.error(f"no comparison {', '.join(unknown)}; choose from {', '.join(COMPARISONS)}")
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name in args.names or COMPARISONS:
            for strategy in STRATEGIES:
                for seed in args.seeds:
                    rows.append(run(name, strategy, seed, Path(root)))
                    print(json.dumps(rows[-1]), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}\n" + table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
