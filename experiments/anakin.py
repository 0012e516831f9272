"""Anakin (Podracer, seed 003) on popeval's environments: a Q(lambda) learner vmapped over
environments and run on every device (`experiments/agents/anakin.py`).

    python experiments/anakin.py --config experiments/configs/anakin_catch.yaml \\
        [--quick] [--anchor] [--run_dir DIR] [--wandb MODE] [--key=value ...]

Prints COMPILATION / EXECUTION times and frames per second as the seed does, and writes
`metrics.csv` (per compiled call: frames, return/mean, episodes, loss, fps), `curve.png`,
`config.json` and `result.json` into the run directory. `--anchor` also runs the seed's own
code (its Catch, haiku and rlax: `pip install "popeval[bench]"`) with the same batch,
rollout length and iterations, and prints both FPS and their ratio. `--quick`: a few
seconds (CI). On a CPU every core becomes a JAX device unless JAX_NUM_CPU_DEVICES is set.
"""

import argparse
import json
import sys
from pathlib import Path

from popeval import sharding

#: `--quick`: two short calls and a short evaluation (applied before the command line's overrides).
QUICK = ["num_calls=2", "iterations=5", "eval_episodes=8", "eval_max_steps=100"]


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the config overrides (`--key=value`; the old `key=value` too)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                 epilog="config keys: --key=value in YAML syntax, e.g. --batch_size=256; the fields of "
                                        "AnakinConfig (experiments/agents/anakin.py)")
    ap.add_argument("--config", default=None, help="YAML config (default: the AnakinConfig defaults)")
    ap.add_argument("--quick", action="store_true", help="a few seconds: CI mode")
    ap.add_argument("--anchor", action="store_true", help="also time the seed's own code, same sizes")
    ap.add_argument("--run_dir", "--run-dir", default=None,
                    help="new or empty directory (default: runs/anakin-<config>-<time>)")
    ap.add_argument("--wandb", default="auto", choices=("auto", "offline", "online", "disabled"))
    return ap.parse_known_args(argv)  # what it does not know: config overrides


def main(argv=None) -> int:
    args, overrides = parse_args(argv)

    message = sharding.use_all_cores()  # before JAX starts its backends
    if message:
        print(message, file=sys.stderr)
    import dataclasses

    from agents.anakin import AnakinConfig, train
    from agents.common import RunLogger, default_run_dir, load_config

    config = load_config(AnakinConfig, args.config, (QUICK if args.quick else []) + overrides)
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
        from agents import anakin_seed

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


if __name__ == "__main__":
    sys.exit(main())
