"""The controller zoo (`experiments/controllers/<config>/`): its results tables and its
learning-curve figures.

    python -m experiments.zoo fresh [CONFIG ...]  # each controller on 4096+ fresh episodes -> fresh.json
    python -m experiments.zoo seeds CONFIG RUN_DIR ...   # a config's runs with other seeds -> seeds.json
    python -m experiments.zoo table [--short]     # docs/zoo.md's (README's) table, from the JSON files
    python -m experiments.zoo table --setups      # docs/zoo.md's second table: each run's setup and cost
    python -m experiments.zoo figure              # experiments/zoo/zoo_curves_<family>.png from every metrics.csv

A controller is `popeval export` of a run of `experiments/configs/<config>.yaml`. The return
it is compared with is the config's `# Reference: VALUE (SOURCE)` line: the best published
ES result or, where none applies, a derived optimum or a hand-written baseline (derived in
the config's comments). The config's `target:` is the run's own "solved" threshold.

Two evaluations per controller: the run's own final evaluation (`result.json`, the episodes
the run chose at its end) and `fresh.json`: at least 4096 episodes from `popeval eval`'s seed,
keys no run's stream uses (`popeval eval CONTROLLER --episodes N` prints the same figure);
MinAtar controllers also play 256 of them uncapped (`uncapped`).
The verdict takes the policy that did better on the run's own episodes and judges its fresh
figure, so choosing between the two policies costs the fresh figure nothing. Where
`seeds.json` holds runs of the config with other seeds, the fresh figure is their median.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent  # where the figures live
CONTROLLERS = HERE.parent / "controllers"
CONFIGS = HERE.parent / "configs"
TOLERANCE = 0.02  # "met": within 2% of the target's magnitude (0.02 for a target of 0)
FRESH_EPISODES, FRESH_PER_EVAL_EPISODE, FRESH_MAX = 4096, 16, 65536


def controllers() -> list[Path]:
    """The zoo's controllers: those of popeval's own environments (a suite's, such as
    `craftax/...`, have results of their own: `experiments.zoo.craftax_eval`)."""
    found = (p for p in CONTROLLERS.iterdir() if (p / "config.json").is_file())
    return sorted(p for p in found if "/" not in json.loads((p / "config.json").read_text())["env_name"])


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
        kernel = "x".join(map(str, config.get("conv_kernel", [3, 3])))
        pool = ", max-pooled" if config.get("conv_pool", "none") == "max" else ""
        net = f"CNN {channels} {kernel}{pool} + MLP {'x'.join(map(str, config['hidden_sizes']))}"
    else:
        net = f"MLP {'x'.join(map(str, config['hidden_sizes'])) or 'linear'}"
    if config.get("head", "greedy") == "sampled":
        net += ", sampled"
    return f"{config['strategy']}, {net}, {config['pop_size']} x {config['num_rollouts']}"


def fresh_eval(run_dir: Path, episodes: int | None = None, overrides: dict | None = None) -> dict:
    """The mean and best policies of a run or controller on fresh episodes from `popeval
    eval`'s seed: 4096, or 16 x the config's `eval_episodes` where it asks for more (a noisy
    task), at most 65536; `episodes` overrides."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from popeval.cli import EVAL_SEED
    from popeval.strategies import load_policy

    run, mean, obs_stats, _ = load_policy(run_dir, "mean", overrides)
    best = load_policy(run_dir, "best", overrides).params
    if episodes is None:
        asked = json.loads((Path(run_dir) / "config.json").read_text())["eval_episodes"]
        episodes = min(max(FRESH_EPISODES, FRESH_PER_EVAL_EPISODE * asked), FRESH_MAX)
    keys = jnp.broadcast_to(jax.random.split(jax.random.key(EVAL_SEED), episodes), (2, episodes))
    both = jax.tree.map(lambda m, b: jnp.stack([m, b]), mean, best)
    returns = np.asarray(run.manager.population_fitness(keys, both, obs_stats=obs_stats).returns)
    out = {"episodes": episodes, "seed": EVAL_SEED}
    for row, which in zip(returns, ("mean", "best")):
        out[f"{which}_policy_return"] = float(np.mean(row))
        out[f"{which}_policy_sem"] = float(np.std(row) / np.sqrt(episodes))
    return out


def write_fresh(names: list[str]) -> None:
    unknown = sorted(set(names) - {p.name for p in controllers()})
    if unknown:
        raise SystemExit(f"python -m experiments.zoo fresh: no controller {', '.join(unknown)}")
    for path in controllers():
        if names and path.name not in names:
            continue
        result = fresh_eval(path)
        config = json.loads((path / "config.json").read_text())
        if config["env_name"].endswith("-MinAtar"):
            uncapped = fresh_eval(path, 256, overrides={"num_env_steps": 20000, "env_kwargs": {}})
            result["uncapped"] = {k: v for k, v in uncapped.items() if k.endswith(("_return", "_sem"))}
        (path / "fresh.json").write_text(json.dumps(result, indent=2) + "\n")
        print(path.name, json.dumps(result))


def write_seeds(name: str, run_dirs: list[Path]) -> None:
    """`seeds.json` of controller `name`: its config's runs with other seeds, each's own final
    evaluation and fresh figures (the shipped controller's seed included if listed)."""
    out = []
    for run_dir in run_dirs:
        config = json.loads((run_dir / "config.json").read_text())
        result = json.loads((run_dir / "result.json").read_text())
        fresh = fresh_eval(run_dir)
        out.append({"seed": config["seed"], "generations": result["generations"],
                    "wall_seconds": result["wall_seconds"],
                    "mean_policy_return": result["mean_policy_return"],
                    "best_policy_return": result["best_policy_return"],
                    "fresh_mean_policy_return": fresh["mean_policy_return"],
                    "fresh_best_policy_return": fresh["best_policy_return"], "fresh_episodes": fresh["episodes"]})
        print(json.dumps(out[-1]))
    (CONTROLLERS / name / "seeds.json").write_text(json.dumps(out, indent=2) + "\n")


def _read(path: Path, name: str) -> dict | list | None:
    return json.loads((path / name).read_text()) if (path / name).is_file() else None


def _preferred(mean: float | None, best: float | None) -> str:
    """The policy that did better on the run's own episodes."""
    return "best" if best is not None and (mean is None or best > mean) else "mean"


def rows() -> list[dict]:
    out = []
    for path in controllers():
        config, result = _read(path, "config.json"), _read(path, "result.json")
        fresh, seeds = _read(path, "fresh.json") or {}, _read(path, "seeds.json") or []
        mean, best = result["mean_policy_return"], result["best_policy_return"]
        which = _preferred(mean, best)
        judged = shipped = fresh.get(f"{which}_policy_return")
        spread = [s[f"fresh_{_preferred(s['mean_policy_return'], s['best_policy_return'])}_policy_return"]
                  for s in seeds]
        if spread:
            judged = statistics.median(spread)
        target, source = reference(path.name)
        out.append({"controller": path.name, "env": config["env_name"], "setup": _policy(config),
                    "target": target, "source": source, "mean": mean, "best": best,
                    "fresh_mean": fresh.get("mean_policy_return"), "fresh_best": fresh.get("best_policy_return"),
                    "fresh_episodes": fresh.get("episodes"), "judged_policy": which, "judged": judged,
                    "shipped": shipped, "seeds": spread, "generations": result["generations"],
                    "env_steps": result["env_steps"],
                    "wall_s": result["wall_seconds"], "devices": result.get("devices"),
                    "verdict": verdict(judged, target, is_optimum(source))})
    return out


def _judged(r: dict) -> str:
    if not r["seeds"]:
        return _fmt(r["judged"]) + f" ({r['judged_policy']})"
    return (f"{_fmt(r['judged'])} (median of {len(r['seeds'])} seeds, "
            f"{_fmt(min(r['seeds']))} to {_fmt(max(r['seeds']))}; the shipped controller {_fmt(r['shipped'])})")


def _popeval_short(r: dict) -> str:
    """README's figure: the judged one and, where it is a median of seeds, the shipped controller's own."""
    if not r["seeds"]:
        return _fmt(r["judged"])
    return f"{_fmt(r['judged'])} (median of {len(r['seeds'])} seeds; the shipped controller {_fmt(r['shipped'])})"


def _reference(r: dict, short: bool) -> str:
    if r["target"] is None:
        return "-"
    source = r["source"]
    if short:
        clauses = [c.strip().replace(", derived above", "") for c in source.split(";")]
        source = next((c for c in clauses if is_optimum(c)), clauses[0])
    return _fmt(r["target"]) + (f" ({source})" if source else "")


def table(short: bool = False) -> str:
    """docs/zoo.md's results table, or with `short` README's (environment, reference, fresh
    figure, verdict). Each run's setup and cost are `setup_table()`, so that neither table is
    wider than a page."""
    if short:
        head = ["environment", "reference", "popeval (fresh episodes)", "verdict"]
    else:
        head = ["environment", "reference (source)", "run's evaluation: mean / best policy",
                "fresh episodes: mean / best policy", "judged (fresh)", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows():
        if short:
            cells = [r["env"], _reference(r, True), _popeval_short(r), r["verdict"]]
        else:
            fresh = f"{_fmt(r['fresh_mean'])} / {_fmt(r['fresh_best'])} ({r['fresh_episodes']})"
            cells = [r["env"], _reference(r, False), f"{_fmt(r['mean'])} / {_fmt(r['best'])}", fresh, _judged(r),
                     r["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def setup_table() -> str:
    """docs/zoo.md's second table: each controller's run, its setup and what it cost."""
    head = ["environment", "setup (strategy, policy, pop x episodes)", "generations", "env steps", "wall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows():
        cells = [r["env"], r["setup"], str(r["generations"]), f"{r['env_steps'] / 1e6:.1f}M", f"{r['wall_s']:.0f} s"]
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


#: The figure's families, by environment id suffix (classic control has none), and their file names.
FAMILIES = {"classic control": "classic_control", "bsuite": "bsuite", "MinAtar": "minatar", "misc": "misc"}


def family(env_id: str) -> str:
    """`"bsuite"`, `"MinAtar"`, `"misc"` or `"classic control"`, from the id's suffix."""
    suffix = env_id.rsplit("-", 1)[-1]
    return suffix if suffix in FAMILIES else "classic control"


def figure(out_dir: Path = HERE, cols: int = 3) -> list[Path]:
    """The learning curves of every controller's run, one figure per family:
    `out_dir/zoo_curves_<family>.png` (`FAMILIES`); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(json.loads((p / "config.json").read_text())["env_name"], p)
            for p in controllers() if (p / "metrics.csv").is_file()]
    written = []
    for name, slug in FAMILIES.items():
        members = [(env, path) for env, path in runs if family(env) == name]
        if not members:
            continue
        n_rows = math.ceil(len(members) / cols)
        fig, axes = plt.subplots(n_rows, cols, figsize=(3.6 * cols, 2.8 * n_rows), squeeze=False)
        for ax, (env, path) in zip(axes.flat, members):
            ax.plot(*_column(path, "fitness/mean"), lw=1, label="population mean fitness")
            ax.plot(*_column(path, "eval/return"), "o-", ms=2, lw=1, label="mean policy (evaluation)")
            target = reference(path.name)[0]
            if target is not None:
                ax.axhline(target, color="grey", ls="--", lw=0.8, label="reference")
            ax.set_title(env, fontsize=11)
            ax.tick_params(labelsize=9)
        for ax in list(axes.flat)[len(members):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=8, loc="lower right")
        fig.suptitle(f"The zoo's runs: {name}", fontsize=12)
        fig.supxlabel("generation", fontsize=10)
        fig.tight_layout()
        out = Path(out_dir) / f"zoo_curves_{slug}.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.zoo", description=__doc__.split("\n\n")[0],
                                     epilog="also: python -m experiments.zoo references [CONFIG ...] (the derived "
                                            "references) and craftax_eval [RUN_DIR ...] (Craftax-Classic's results); "
                                            "--help after either for its options")
    sub = parser.add_subparsers(dest="command", required=True)
    fr = sub.add_parser("fresh", help="evaluate controllers on fresh episodes (writes fresh.json)")
    fr.add_argument("names", nargs="*", metavar="CONFIG", help="controllers (default: all)")
    se = sub.add_parser("seeds", help="a config's runs with other seeds (writes seeds.json)")
    se.add_argument("name", metavar="CONFIG")
    se.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    t = sub.add_parser("table", help="the results table (markdown)")
    t.add_argument("--json", action="store_true", help="the rows as JSON instead")
    t.add_argument("--short", action="store_true", help="README's shorter table")
    t.add_argument("--setups", action="store_true", help="docs/zoo.md's second table: each run's setup and cost")
    f = sub.add_parser("figure", help="learning curves of every controller's run, one figure per family")
    f.add_argument("--out_dir", type=Path, default=HERE, help="where zoo_curves_<family>.png go")
    args = parser.parse_args(argv)
    if args.command == "fresh":
        write_fresh(args.names)
    elif args.command == "seeds":
        write_seeds(args.name, args.runs)
    elif args.command == "table":
        print(json.dumps(rows(), indent=2) if args.json else setup_table() if args.setups else table(args.short))
    else:
        print("\n".join(map(str, figure(args.out_dir))))


if __name__ == "__main__":
    main()
