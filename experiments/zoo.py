"""The controller zoo (`experiments/controllers/<config>/`): its results table and its
learning-curve figure.

    python experiments/zoo.py table            # docs/zoo.md's table, from each controller's result.json
    python experiments/zoo.py table --eval     # ... and a fresh `popeval eval` of each (64 episodes)
    python experiments/zoo.py figure           # experiments/zoo_curves.png from every metrics.csv

A controller is `popeval export` of a run of `experiments/configs/<config>.yaml`. The return
it is compared with is the config's `# Reference: VALUE (SOURCE)` comment line: the best
published ES result or, where none applies, a derived optimum or a hand-written baseline
(derived in the config's comments). The config's `target:` is the run's own "solved" threshold.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTROLLERS = HERE / "controllers"
CONFIGS = HERE / "configs"
TOLERANCE = 0.02  # "met": within 2% of the target's magnitude (0.02 for a target of 0)


def controllers() -> list[Path]:
    return sorted(p for p in CONTROLLERS.iterdir() if (p / "config.json").is_file())


def reference(stem: str) -> tuple[float | None, str]:
    """`(value, source)` from the config's `# Reference: VALUE (SOURCE)` line."""
    path = CONFIGS / f"{stem}.yaml"
    if path.is_file():
        for line in path.read_text().splitlines():
            m = re.match(r"#\s*Reference:\s*(-?[0-9.]+)\s*\((.*)\)\s*$", line)
            if m:
                return float(m.group(1)), m.group(2).strip()
    return None, ""


def verdict(value: float | None, target: float | None, optimum: bool = False) -> str:
    """`beaten`, `met` or `missed`; an optimum (`the optimum` or `the maximum` in the source)
    can only be met: a return above it is evaluation noise."""
    if target is None or value is None or not math.isfinite(value):
        return "-"
    margin = TOLERANCE * max(abs(target), 1.0)
    if value > target + margin and not optimum:
        return "beaten"
    return "met" if value >= target - margin else "missed"


def is_optimum(source: str) -> bool:
    return re.search(r"(^|; )the (optimum|maximum)\b", source) is not None


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def _policy(config: dict) -> str:
    if config["policy"] == "lstm":
        net = f"LSTM {config['hidden_sizes'][0]}"
    elif config["policy"] == "cnn":
        channels = "-".join(map(str, config.get("conv_channels", [16])))
        net = f"CNN {channels} + MLP {'x'.join(map(str, config['hidden_sizes']))}"
    else:
        net = f"MLP {'x'.join(map(str, config['hidden_sizes'])) or 'linear'}"
    if config.get("head", "greedy") == "sampled":
        net += ", sampled"
    return f"{config['strategy']}, {net}, {config['pop_size']} x {config['num_rollouts']}"


def rows(evaluate: bool = False) -> list[dict]:
    out = []
    for path in controllers():
        config = json.loads((path / "config.json").read_text())
        result = json.loads((path / "result.json").read_text())
        mean, best = result["mean_policy_return"], result["best_policy_return"]
        target, source = reference(path.name)
        row = {"controller": path.name, "env": config["env_name"], "setup": _policy(config),
               "target": target, "source": source, "mean": mean, "best": best,
               "generations": result["generations"], "env_steps": result["env_steps"],
               "wall_s": result["wall_seconds"], "devices": result.get("devices"),
               "verdict": verdict(max(v for v in (mean, best) if v is not None), target, is_optimum(source))}
        if evaluate:
            row["eval_mean"], row["eval_best"] = (_evaluate(path, which) for which in ("mean", "best"))
        out.append(row)
    return out


def _evaluate(path: Path, which: str, episodes: int = 64, seed: int = 12345) -> float:
    """What `popeval eval path --which which` prints as mean_return."""
    import jax
    import numpy as np

    from popeval.strategies import load_policy

    run, params, obs_stats, _ = load_policy(path, which)
    keys = jax.random.split(jax.random.key(seed), episodes)
    result = run.manager.population_fitness(keys, jax.tree.map(lambda x: x[None], params), obs_stats=obs_stats)
    return float(np.mean(result.returns))


def table(evaluate: bool = False) -> str:
    head = ["environment", "setup (strategy, policy, pop x episodes)", "reference (source)", "mean policy",
            "best policy", "generations", "env steps", "wall", "verdict"]
    if evaluate:
        head.insert(5, "`popeval eval` mean / best")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows(evaluate):
        target = "-" if r["target"] is None else _fmt(r["target"]) + (f" ({r['source']})" if r["source"] else "")
        cells = [r["env"], r["setup"], target, _fmt(r["mean"]), _fmt(r["best"]), str(r["generations"]),
                 f"{r['env_steps'] / 1e6:.1f}M", f"{r['wall_s']:.0f} s", r["verdict"]]
        if evaluate:
            cells.insert(5, f"{_fmt(r['eval_mean'])} / {_fmt(r['eval_best'])}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _column(path: Path, name: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    with open(path / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            y = float(row.get(name) or "nan")
            if math.isfinite(y):
                xs.append(float(row["generation"]))
                ys.append(y)
    return xs, ys


def figure(out: Path, cols: int = 6) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [p for p in controllers() if (p / "metrics.csv").is_file()]
    n_rows = max(1, math.ceil(len(paths) / cols))
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.0 * cols, 2.4 * n_rows), squeeze=False)
    for ax, path in zip(axes.flat, paths):
        config = json.loads((path / "config.json").read_text())
        ax.plot(*_column(path, "fitness/mean"), lw=1, label="population mean fitness")
        ax.plot(*_column(path, "eval/return"), "o-", ms=2, lw=1, label="mean policy (evaluation)")
        target = reference(path.name)[0]
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=0.8, label="reference")
        ax.set_title(config["env_name"], fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(paths):]:
        ax.axis("off")
    if paths:
        axes.flat[0].legend(fontsize=6, loc="lower right")
    fig.supxlabel("generation")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="the results table (markdown)")
    t.add_argument("--eval", action="store_true", help="also evaluate each controller afresh (64 episodes)")
    t.add_argument("--json", action="store_true", help="the rows as JSON instead")
    f = sub.add_parser("figure", help="learning curves of every controller's run")
    f.add_argument("--out", type=Path, default=HERE / "zoo_curves.png")
    args = parser.parse_args(argv)
    if args.command == "table":
        print(json.dumps(rows(args.eval), indent=2) if args.json else table(args.eval))
    else:
        print(figure(args.out))


if __name__ == "__main__":
    main()
