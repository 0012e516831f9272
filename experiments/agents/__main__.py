"""The RL agents' command line: Anakin and DQN on popeval's environments, each timed against its
seed's own code with `--anchor`.

    python -m experiments.agents anakin --config experiments/configs/anakin_catch.yaml \\
        [--quick] [--anchor] [--run_dir DIR] [--wandb MODE] [--key=value ...]
    python -m experiments.agents dqn --config experiments/configs/dqn_cartpole.yaml \\
        [--quick] [--anchor] [--anchor_steps N] [--run_dir DIR] [--wandb MODE] [--key=value ...]

`anakin` (seed 003, Podracer; `experiments.agents.anakin`: a Q(lambda) learner vmapped over
environments and run on every device) prints COMPILATION / EXECUTION times and frames per second
as the seed does, and writes `metrics.csv` (per compiled call: frames, return/mean, episodes,
loss, fps), `curve.png`, `config.json` and `result.json` into the run directory. `--anchor` also
runs the seed's own code (its Catch, haiku and rlax: `pip install "popeval[bench]"`) with the
same batch, rollout length and iterations, and prints both FPS and their ratio. `--quick`: a few
seconds (CI). On a CPU every core becomes a JAX device unless JAX_NUM_CPU_DEVICES is set.

`dqn` (seed 002, "CartPole with JAX"; `experiments.agents.dqn`: compiled into one program, seeds
vmapped) prints each seed's final mean greedy return over `eval_episodes` episodes, how many
seeds reach `target_return` (and when seeds stopped learning: `stop_return`), compile / run /
evaluation seconds and environment steps per second, and writes `config.json`, `metrics.csv`
(per chunk: frames, return/mean|min|max over seeds, train/loss, train/epsilon,
train/episode_return), `curve.png` and `result.json` into the run directory. `--anchor` also
times seed 002's per-step Python loop (gymnasium, a deque, `random.sample`, one jitted update
per step: `experiments.agents.dqn_seed`, needs gymnasium) with the same config for
`--anchor_steps` steps of one seed, and the compiled program with one seed over as many
steps, and prints the ratios of steps per second. `--quick`: two seeds, 6,000 steps (CI;
seconds of training after ~10 s of compilation).
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from popeval import sharding

#: `--quick` per agent (applied before the command line's overrides). Anakin: two short calls and
#: a short evaluation. DQN: two seeds, 6,000 steps in two chunks, enough to beat a random policy
#: (~22) by far.
QUICK = {"anakin": ["num_calls=2", "iterations=5", "eval_episodes=8", "eval_max_steps=100"],
         "dqn": ["num_seeds=2", "total_steps=6000", "eval_every=2500", "curve_episodes=10", "eval_episodes=10"]}


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """The agent (`args.agent`), its options, and the config overrides (`--key=value`; the old
    `key=value` too)."""
    ap = argparse.ArgumentParser(prog="python -m experiments.agents", description=__doc__.split("\n\n")[0],
                                 allow_abbrev=False)
    sub = ap.add_subparsers(dest="agent", required=True, metavar="{anakin,dqn}")
    anakin = sub.add_parser("anakin", allow_abbrev=False, help="Anakin (Podracer, seed 003): a Q(lambda) learner",
                            description="Anakin (Podracer, seed 003) on popeval's environments: a Q(lambda) learner "
                                        "vmapped over environments and run on every device.",
                            epilog="config keys: --key=value in YAML syntax, e.g. --batch_size=256; the fields of "
                                   "AnakinConfig (experiments/agents/anakin.py)")
    dqn = sub.add_parser("dqn", allow_abbrev=False, help="DQN (seed 002) compiled into one program",
                         description="DQN (seed 002, \"CartPole with JAX\") compiled into one program, seeds vmapped.",
                         epilog="config keys: --key=value in YAML syntax, e.g. --num_seeds=4; the fields of "
                                "DQNConfig (experiments/agents/dqn.py)")
    for name, p in (("anakin", anakin), ("dqn", dqn)):
        config = "AnakinConfig" if name == "anakin" else "DQNConfig"
        p.add_argument("--config", default=None, help=f"YAML config (default: the {config} defaults)")
        p.add_argument("--quick", action="store_true", help="a few seconds: CI mode")
    anakin.add_argument("--anchor", action="store_true", help="also time the seed's own code, same sizes")
    dqn.add_argument("--anchor", action="store_true", help="also time the seed's per-step Python loop")
    dqn.add_argument("--anchor_steps", "--anchor-steps", type=int, default=None,
                     help="environment steps of the anchor (default 10000, --quick 1500)")
    anakin.add_argument("--run_dir", "--run-dir", default=None,
                        help="new or empty directory (default: runs/anakin-<config>-<time>)")
    dqn.add_argument("--run_dir", "--run-dir", default=None,
                     help="new or empty directory (default: runs/<config>-<time>)")
    for p in (anakin, dqn):
        p.add_argument("--wandb", default="auto", choices=("auto", "offline", "online", "disabled"))
    return ap.parse_known_args(argv)  # what it does not know: config overrides


def run_anakin(args: argparse.Namespace, overrides: list[str]) -> int:
    message = sharding.use_all_cores()  # before JAX starts its backends
    if message:
        print(message, file=sys.stderr)

    from experiments.agents.anakin import AnakinConfig, train
    from experiments.agents.common import RunLogger, default_run_dir, load_config

    config = load_config(AnakinConfig, args.config, (QUICK["anakin"] if args.quick else []) + overrides)
    if args.anchor:
        try:
            import haiku  # noqa: F401
            import rlax  # noqa: F401
        except ImportError as e:
            print(f"--anchor runs the seed's haiku + rlax code: pip install 'popeval[bench]' ({e})", file=sys.stderr)
            return 2
    name = Path(args.config).stem if args.config else "anakin"
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(name)
    with RunLogger(run_dir, f"Anakin / {config.env_name}", dataclasses.asdict(config), x="frames",
                   y=("return/mean",), target=config.target_return, wandb=args.wandb) as logger:
        result = train(config, log=logger.log)
    summary = {k: v for k, v in result.items() if k not in ("params", "history")}
    print(f"popeval: {summary['fps']:.3g} frames/s over {summary['frames']} frames "
          f"({summary['execute_s']:.2f} s), last return/mean {result['history'][-1]['return/mean']:.3f}"
          + (f"; reached {config.target_return} after {summary['target_frames']} frames, {summary['target_s']:.2f} s"
             if summary["target_frames"] else ""))

    if args.anchor:
        from experiments.agents import anakin_seed

        per_device = config.batch_size // result["devices"]
        print(f"anchor (the Podracer notebook's code and Catch): {per_device} environments per device", flush=True)
        anchor = anakin_seed.run_experiment(anakin_seed.Catch(), per_device, config.rollout_len, config.step_size,
                                            config.iterations, config.seed, devices=config.devices)
        summary["anchor"] = anchor
        summary["fps_ratio"] = result["fps"] / anchor["fps"]
        note = "" if config.env_name == "Catch-bsuite" else f" (popeval ran {config.env_name}, the anchor Catch)"
        print(f"FPS popeval {result['fps']:.3e}, anchor {anchor['fps']:.3e}: ratio popeval/anchor "
              f"{summary['fps_ratio']:.2f}{note}")
    (run_dir / "result.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {run_dir}")
    return 0


def run_dqn(args: argparse.Namespace, overrides: list[str]) -> int:
    from experiments.agents.common import RunLogger, default_run_dir, load_config
    from experiments.agents.dqn import DQNConfig, train

    config = load_config(DQNConfig, args.config, (QUICK["dqn"] if args.quick else []) + overrides)
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
        from experiments.agents.dqn_seed import run_seed_loop

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


def main(argv=None) -> int:
    args, overrides = parse_args(argv)
    return run_anakin(args, overrides) if args.agent == "anakin" else run_dqn(args, overrides)


if __name__ == "__main__":
    sys.exit(main())
