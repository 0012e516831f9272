"""DQN (seed 002, "CartPole with JAX") compiled into one program, seeds vmapped
(`experiments/agents/dqn.py`).

    python experiments/dqn.py --config experiments/configs/dqn_cartpole.yaml \\
        [--quick] [--anchor] [--anchor_steps N] [--run_dir DIR] [--wandb MODE] [--key=value ...]

Prints each seed's final mean greedy return over `eval_episodes` episodes, how many seeds
reach `target_return` (and when seeds stopped learning: `stop_return`), compile / run /
evaluation seconds and environment steps per second, and writes `config.json`, `metrics.csv`
(per chunk: frames, return/mean|min|max over seeds, train/loss, train/epsilon,
train/episode_return), `curve.png` and `result.json` into the run directory. `--anchor` also
times seed 002's per-step Python loop (gymnasium, a deque, `random.sample`, one jitted update
per step: `agents.dqn_seed`, needs gymnasium) with the same config for
`--anchor_steps` steps of one seed, and the compiled program with one seed over as many
steps, and prints the ratios of steps per second. `--quick`: two seeds, 6,000 steps (CI;
seconds of training after ~10 s of compilation).
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

#: `--quick`: two seeds, 6,000 steps in two chunks, enough to beat a random policy (~22) by
#: far (applied before the command line's overrides).
QUICK = ["num_seeds=2", "total_steps=6000", "eval_every=2500", "curve_episodes=10", "eval_episodes=10"]


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the config overrides (`--key=value`; the old `key=value` too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                 epilog="config keys: --key=value in YAML syntax, e.g. --num_seeds=4; the fields of "
                                        "DQNConfig (experiments/agents/dqn.py)")
    ap.add_argument("--config", default=None, help="YAML config (default: the DQNConfig defaults)")
    ap.add_argument("--quick", action="store_true", help="a few seconds: CI mode")
    ap.add_argument("--anchor", action="store_true", help="also time the seed's per-step Python loop")
    ap.add_argument("--anchor_steps", "--anchor-steps", type=int, default=None,
                    help="environment steps of the anchor (default 10000, --quick 1500)")
    ap.add_argument("--run_dir", "--run-dir", default=None,
                    help="new or empty directory (default: runs/<config>-<time>)")
    ap.add_argument("--wandb", default="auto", choices=("auto", "offline", "online", "disabled"))
    return ap.parse_known_args(argv)  # what it does not know: config overrides


def main(argv=None) -> int:
    args, overrides = parse_args(argv)

    from agents.common import RunLogger, default_run_dir, load_config
    from agents.dqn import DQNConfig, train

    config = load_config(DQNConfig, args.config, (QUICK if args.quick else []) + overrides)
    if args.anchor:
        try:
            import gymnasium  # noqa: F401
        except ImportError as e:
            print(f"--anchor steps gymnasium's CartPole: pip install 'popeval[bench]' ({e})", file=sys.stderr)
            return 2
    name = Path(args.config).stem if args.config else "dqn"
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(name)

    def log(step, row):
        logger.log(step, {"frames": step, **row})
        print(f"env steps {step:8d}  greedy return mean {row['return/mean']:6.1f} "
              f"[{row['return/min']:5.1f}, {row['return/max']:5.1f}]  epsilon {row['train/epsilon']:.3f}  "
              f"loss {row['train/loss']:.4f}", flush=True)

    with RunLogger(run_dir, f"DQN / {config.env_name} ({config.num_seeds} seeds)", dataclasses.asdict(config),
                   x="frames", y=("return/mean", "return/min", "return/max"), target=config.target_return,
                   wandb=args.wandb) as logger:
        result = train(config, log=log)
    returns = [round(float(r), 1) for r in result["returns"]]
    summary = {k: v for k, v in result.items() if k not in ("returns", "curve", "state")}
    summary.update(returns=returns, num_seeds=config.num_seeds, target_return=config.target_return,
                   steps_per_s_per_seed=result["steps_per_s"] / config.num_seeds)
    print(f"final mean greedy return over {config.eval_episodes} episodes, per seed: {returns}")
    print(f"solved (>= {config.target_return}): {result['solved']} of {config.num_seeds} seeds "
          f"after {result['env_steps']} environment steps per seed; stopped learning (curve point >= "
          f"{config.stop_return}) at env steps {result['stopped_at']} (0: never)")
    print(f"compile {result['compile_s']:.1f} s, run {result['run_s']:.1f} s (training), evaluation "
          f"{result['eval_s']:.1f} s; {result['steps_per_s']:.0f} env steps/s over {config.num_seeds} seeds "
          f"({summary['steps_per_s_per_seed']:.0f} per seed)")

    if args.anchor:
        from agents.dqn_seed import run_seed_loop

        steps = args.anchor_steps or (1500 if args.quick else 10_000)
        print(f"anchor: the blog post's Python loop, one seed, {steps} environment steps ...", flush=True)
        anchor = run_seed_loop(config, steps, seed=config.seed)
        # Per seed, like for like: the compiled program with one seed over the anchor's steps.
        single = train(dataclasses.replace(config, num_seeds=1, total_steps=steps, curve_episodes=1, eval_episodes=1,
                                           eval_every=max(steps - config.learning_starts, 1)))
        # A full run is mostly steps with updates: extrapolate at the anchor's rate over those.
        rate = anchor["learning_steps_per_s"] if anchor["updates"] else anchor["steps_per_s"]
        summary.update(anchor=anchor, compiled_one_seed_steps_per_s=single["steps_per_s"],
                       ratio_per_seed=single["steps_per_s"] / anchor["steps_per_s"],
                       ratio_all_seeds=result["steps_per_s"] / rate,
                       anchor_full_run_s=result["env_steps"] * config.num_seeds / rate)
        print(f"anchor: {anchor['steps_per_s']:.0f} env steps/s over {steps} steps ({anchor['run_s']:.1f} s, "
              f"{anchor['updates']} updates, compile {anchor['compile_s']:.1f} s), {rate:.0f} once updates run; "
              f"compiled, one seed, same steps: {single['steps_per_s']:.0f} env steps/s")
        print(f"compiled/anchor: {summary['ratio_per_seed']:.1f}x for one seed, {summary['ratio_all_seeds']:.1f}x with "
              f"{config.num_seeds} seeds vmapped; the anchor would take about {summary['anchor_full_run_s']:.0f} s "
              f"for this run's {config.num_seeds} x {result['env_steps']} steps (extrapolated from its measured "
              f"rate), the compiled run took {result['run_s']:.0f} s")
    (run_dir / "result.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
