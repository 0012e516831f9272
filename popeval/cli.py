"""The `popeval` command line (also `python -m popeval`).

    popeval evolve --config experiments/configs/cartpole.yaml [--run_dir RUN] [--key=value ...]
    popeval evolve --env_module my_pkg.envs --env_name MyTask-v0 [--key=value ...]
    popeval evolve --resume RUN_DIR [--num_generations=N]
    popeval evolve ... --coordinator_address=HOST:PORT --num_processes=N --process_id=I
    popeval launch --processes N [--devices_per_process K] -- evolve ...
    popeval eval RUN_DIR [--episodes=64 --seed=S | --episodes_from_run] [--which best|mean]
                 [--num_env_steps=N --env_kwargs={...}]
    popeval list-envs [--all]
    popeval bench [--env ID] [--pop_size P] [--num_rollouts B] [--num_env_steps T] [--json FILE]
    popeval render RUN_DIR --out x.gif

This is the application layer, and the only place that changes process-wide state: it keeps
compiled programs in a persistent cache (`POPEVAL_CACHE_DIR`, see
`_use_compilation_cache`), silences W&B's console output (`WANDB_SILENT`, unless set) and the
INFO lines of JAX and matplotlib (`_QUIET_LOGGERS`), makes SIGTERM stop a command as Ctrl-C
does (`popeval.signals`, from `run`; JAX's preemption service off), searches the current
directory last for a config's `env_module` (`_search_working_directory`) and skips the
interpreter's teardown (`run`). It imports `popeval.strategies` lazily.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from popeval import signals

__all__ = ["main"]

log = logging.getLogger("popeval")


def _config_keys(help_asked: bool) -> str | None:
    if not help_asked:  # importing the strategies costs a second: only for --help
        return None
    from popeval.strategies.run.config import describe_fields

    return ("config keys (in the YAML file, or --key=value or --key value in YAML syntax, e.g. --pop_size 128 "
            "'--strategy_kwargs={learning_rate: 0.03}'):\n" + describe_fields())


#: `popeval eval`'s fresh episodes by default: how many, and their seed.
EVAL_EPISODES, EVAL_SEED = 64, 12345


_METAVARS = {"num_env_steps": "N", "env_kwargs": "{...}", "env_module": "MODULE"}


def _eval_keys(help_asked: bool) -> str | None:
    """`eval`'s and `render`'s help on the config keys they take (`EVAL_OVERRIDES`)."""
    if not help_asked:
        return None
    from popeval.strategies.run.config import FIELD_HELP
    from popeval.strategies.run.run_dir import EVAL_OVERRIDES

    flags = {k: f"--{k}={_METAVARS.get(k, 'VALUE')}" for k in EVAL_OVERRIDES}
    return ("how the policy plays (config keys, --key=value or --key value in YAML syntax; default: the run's own; "
            "--num_env_steps=20000 plays past the training episode cap):\n"
            + "\n".join(f"  {flag:<22}{FIELD_HELP[k]}" for k, flag in flags.items()))


def _parser(help_asked: bool = False) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's parser must not reset a `--debug` given before the command.
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    p = argparse.ArgumentParser(prog="popeval", description=__doc__.split("\n\n")[0], parents=[common])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("evolve", help="evolve a controller from a YAML config and/or --key=value settings",
                       parents=[common],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_config_keys(help_asked))
    e.add_argument("--config", help="YAML config (experiments/configs/*.yaml); without it, the defaults")
    e.add_argument("--run_dir", "--run-dir", help="the new run's directory (default runs/<env>-...)")
    e.add_argument("--resume", help="continue the run in this directory")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.add_argument("--wandb", choices=["auto", "disabled", "offline", "online"], default="auto",
                   help="W&B mode (auto: online with an API key, else offline)")
    e.add_argument("--wandb_project", "--wandb-project", default="popeval")
    d = e.add_argument_group("several processes (one per host, say; SLURM and Open MPI jobs need none of these)")
    d.add_argument("--coordinator_address", "--coordinator-address", metavar="HOST:PORT",
                   help="where process 0 listens (the same on every process)")
    d.add_argument("--num_processes", "--num-processes", type=int, metavar="N", help="how many processes")
    d.add_argument("--process_id", "--process-id", type=int, metavar="I", help="this process, in [0, N)")
    d.add_argument("--distributed_timeout", "--distributed-timeout", type=float, default=300.0, metavar="S",
                   help="seconds to wait for the coordinator and the other processes (default 300)")
    d.add_argument("--distributed_heartbeat", "--distributed-heartbeat", type=float, default=100.0, metavar="S",
                   help="seconds after which a process that stopped answering is declared dead; JAX then "
                        "ends the others (default 100)")
    v = sub.add_parser("eval", help="returns of a saved controller", parents=[common],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_eval_keys(help_asked))
    v.add_argument("run_dir")
    v.add_argument("--episodes", type=int, default=None, metavar="N",
                   help=f"play N fresh episodes, ones the run never played (default {EVAL_EPISODES})")
    v.add_argument("--seed", type=int, default=None, help=f"the fresh episodes' seed (default {EVAL_SEED})")
    v.add_argument("--episodes_from_run", "--episodes-from-run", action="store_true",
                   help="replay the run's own final evaluation (its eval_episodes episodes) instead: "
                        "reproduces result.json's mean_policy_return or best_policy_return")
    v.add_argument("--which", choices=["best", "mean"], default=None,
                   help="the policy (default: mean for distribution-based strategies, else best)")
    x = sub.add_parser("export", help="a run's controller alone (mean and best policies, config, result, metrics)",
                       parents=[common])
    x.add_argument("run_dir")
    x.add_argument("out_dir", help="a new (or empty) directory")
    x.add_argument("--force", action="store_true", help="replace out_dir when it holds an earlier export")
    sub.add_parser("launch", add_help=False,
                   help="run a command in N local processes (popeval launch --help)")
    ls = sub.add_parser("list-envs", help="registered environment ids", parents=[common])
    ls.add_argument("--all", action="store_true",
                    help="also the ids of every installed suite (brax/ant, craftax/..., jumanji/..., ...)")
    b = sub.add_parser("bench", help="time popeval's fitness path on this machine (popeval.bench)",
                       parents=[common])
    b.add_argument("--env", default="CartPole-v1", help="environment id (default CartPole-v1)")
    b.add_argument("--pop_size", "--pop-size", type=int, default=256, help="members P (default 256)")
    b.add_argument("--num_rollouts", "--num-rollouts", type=int, default=8, help="episodes per member B (default 8)")
    b.add_argument("--num_env_steps", "--num-env-steps", type=int, default=None,
                   help="steps per episode T (default: the environment's episode limit)")
    b.add_argument("--hidden", type=int, default=32, help="units in each of the MLP's two hidden layers (default 32)")
    b.add_argument("--repeats", type=int, default=3, help="timed calls after the compiling one (default 3)")
    b.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON")
    r = sub.add_parser("render", help="GIF of a saved controller", parents=[common],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_eval_keys(help_asked))
    r.add_argument("run_dir")
    r.add_argument("--out", default=None)
    r.add_argument("--which", choices=["best", "mean"], default=None,
                   help="the policy (default: mean for distribution-based strategies, else best)")
    r.add_argument("--seed", type=int, default=0)
    return p


#: Libraries whose INFO lines are noise on the command line (JAX's backend probing, e.g. for a
#: TPU; matplotlib's "generated new fontManager"): warnings and errors still show.
_QUIET_LOGGERS = ("jax", "jaxlib", "matplotlib", "absl")


def main(argv: list[str] | None = None) -> int:
    """Runs one `popeval` command; returns its exit code. Ctrl-C, also while JAX is still being
    imported, ends it with one line (exit code 130; SIGTERM as well, 143: `popeval.signals`)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except KeyboardInterrupt as e:
        text = _interrupted(e)
        if signals.received() == signal.SIGTERM:
            text = text.replace("interrupted", "interrupted by SIGTERM", 1)
        print(f"{_prefix(argv)}: {text}", file=sys.stderr)
        return 128 + (signals.received() or signal.SIGINT)


def _prefix(argv: list[str]) -> str:
    """`popeval COMMAND`, what the command's one-line messages start with."""
    command = next((a for a in argv if a in _COMMANDS or a == "launch"), None)
    return f"popeval{f' {command}' if command else ''}"


def _interrupted(e: KeyboardInterrupt) -> str:
    """What Ctrl-C stopped, in one line. A second Ctrl-C while a run was stopping (saving its
    checkpoint, closing its sinks) is raised with the first one (`RunInterrupted`) as context."""
    first = e.__context__
    while first is not None and not (isinstance(first, KeyboardInterrupt) and hasattr(first, "run_dir")):
        first = first.__context__
    if first is not None:
        return (f"interrupted again while stopping, so it stopped at once; {first.run_dir} keeps its last "
                f"complete checkpoint; resume with popeval evolve --resume {first.run_dir}")
    return " ".join(str(e).split()) or "interrupted"


#: The commands that take config keys (`--key=value` or `--key value`).
_CONFIG_COMMANDS = ("evolve", "eval", "render")


def _main(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:  # no JAX in the launcher: its processes run their own
        from popeval import launch

        signals.now_writing()  # a signal raises KeyboardInterrupt, which the launcher forwards
        return launch.main(argv[1:])
    parser = _parser("-h" in argv or "--help" in argv)
    own, config_keys = _split_config_keys(parser, argv)
    args, extra = parser.parse_known_args(own)
    extra = config_keys + extra
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if getattr(args, "process_id", None):  # process 0 of a multi-process run speaks for it
        log.setLevel(logging.ERROR)
    if args.command in _CONFIG_COMMANDS:
        msg = _use_compilation_cache()
        if msg and args.command == "evolve":
            log.info(msg)
    _search_working_directory()
    try:
        if extra and args.command not in _CONFIG_COMMANDS:
            raise ValueError(f"unrecognised arguments: {' '.join(extra)}")
        return _COMMANDS[args.command](args, extra)
    except Exception as e:  # noqa: BLE001 - one line for the user; --debug for the traceback
        if getattr(args, "debug", False):
            raise
        print(f"popeval {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _search_working_directory() -> None:
    """Lets a config's `env_module` name a module in the current directory, as `python -m popeval`
    does (the `popeval` script puts its own directory first instead). It is searched last, so a
    file there never hides an installed package."""
    try:
        here = os.getcwd()
    except OSError:  # the current directory was removed
        return
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)


def _split_config_keys(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """`argv` as (the parser's own arguments, the config keys as `--key=value`): options the
    parser does not know take the next token as their value (`--pop_size 8`, as argparse's own
    do), and are set aside so that argparse never takes a value, or an option with a space
    (`--env_kwargs={a: 1}`), for a positional argument (`eval --num_env_steps 500 RUN`)."""
    from popeval.typed_config import join_values

    dests = vars(parser.parse_known_args(argv)[0])  # every option of the command, given or not
    if dests["command"] not in _CONFIG_COMMANDS:
        return argv, []
    flags = {f"--{d}" for d in dests} | {f"--{d.replace('_', '-')}" for d in dests} | {"--help"}

    def parsers_own(token: str) -> bool:  # argparse also takes a unique prefix of its options
        return any(f.startswith(token.split("=", 1)[0]) for f in flags)

    own, config_keys = [], []
    for token in join_values(argv, {t for t in argv if t.startswith("--") and parsers_own(t)}):
        ours = token.startswith("--") and token != "--" and not parsers_own(token)
        (config_keys if ours else own).append(token)
    return own, config_keys


def _one_line(e: BaseException) -> str:
    """What went wrong, in one line."""
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror}{where}"
    text = " ".join(str(e).split())
    if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in text or "Out of memory" in text:
        return (f"out of memory{f' ({text[:300]})' if text else ''}; try a smaller pop_size or num_rollouts, "
                "or a smaller policy (hidden_sizes, conv_channels)")
    if not text:  # `raise SomeError()`: its name is all there is to say
        return f"{type(e).__name__}, without a message (--debug shows the traceback)"
    if isinstance(e, (ValueError, TypeError, FileNotFoundError, FileExistsError, KeyError, ModuleNotFoundError)):
        return text
    return f"{type(e).__name__}: {text[:500]} (--debug shows the traceback)"


def run() -> None:
    """The `popeval` command and `python -m popeval`: `main()`, then a quick exit.

    By then everything popeval writes is closed (run files and checkpoints are written and
    closed as they go; a W&B run is finished, and its service is torn down here), so the
    interpreter's own teardown of JAX, XLA and the imported libraries is skipped
    (experiments/README.md, "Process exit"). A process of a multi-process run that fails exits at once, without
    JAX's shutdown barrier (which would wait for the others), so the others fail fast too.
    """
    signals.install(_prefix(sys.argv[1:]))  # before JAX is imported
    code = main()
    if code == 0 and "jax" in sys.modules:
        from popeval import distributed

        try:
            distributed.finish()  # a multi-process run: wait for the others (process 0 hosts the coordinator)
        except KeyboardInterrupt:
            print("popeval: interrupted while waiting for the run's other processes to finish", file=sys.stderr)
            code = 128 + (signals.received() or signal.SIGINT)
    signals.uninstall()  # the last line is said; what is left is bounded
    if "wandb" in sys.modules:
        _teardown_wandb()  # bounded; skipped when a W&B run's close gave up already
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _teardown_wandb() -> None:
    """Stops W&B's service, waiting no longer than a W&B run's close does
    (`POPEVAL_WANDB_CLOSE_TIMEOUT`), and not at all once a close gave up: a hung service must
    not hold up the exit."""
    from popeval.sinks.weights_and_biases import CLOSE_TIMEOUT, close_timeout_from_env, gave_up

    if gave_up.is_set():
        return
    try:
        timeout = close_timeout_from_env()
    except ValueError:
        timeout = CLOSE_TIMEOUT
    teardown = sys.modules["wandb"].teardown

    def quietly():
        try:
            teardown()
        except Exception:  # noqa: BLE001 - the process is exiting; W&B's files are closed or lost
            pass

    thread = threading.Thread(target=quietly, name="popeval-wandb-teardown", daemon=True)
    thread.start()
    thread.join(timeout)


def _use_compilation_cache() -> str | None:
    """Keeps compiled XLA programs on disk (JAX's persistent compilation cache), so that a
    second run of a config (another seed included: it is an argument of the programs) skips
    compilation. `POPEVAL_CACHE_DIR` picks the directory (default `~/.cache/popeval/xla`;
    empty turns it off); a cache the user configured for JAX is left alone."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return None
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "popeval" / "xla"
    path = os.environ.get("POPEVAL_CACHE_DIR", str(default))
    if not path:
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    return f"compilation cache: {path} (POPEVAL_CACHE_DIR= turns it off)"


def _evolve(args, extra) -> int:
    import jax

    from popeval import distributed

    # SIGTERM stops a run as Ctrl-C does (`popeval.signals`); JAX's preemption service, which a
    # multi-process run would start, catches SIGTERM and lets the run carry on.
    jax.config.update("jax_enable_preemption_service", False)
    # Before anything starts a JAX backend (importing the strategies does).
    joined = distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                                    timeout=args.distributed_timeout, heartbeat=args.distributed_heartbeat)
    if joined and distributed.process_index() == 0:
        log.info(joined)
    from popeval.strategies import RunOptions, evolve, load_config, parse_overrides
    from popeval.strategies.run.run_dir import read_config

    os.environ.setdefault("WANDB_SILENT", "true")
    options = RunOptions(run_dir=args.run_dir, resume=args.resume, wandb=args.wandb,
                         wandb_project=args.wandb_project, progress=False if args.quiet else None,
                         coordinator_address=args.coordinator_address, num_processes=args.num_processes,
                         process_id=args.process_id, distributed_timeout=args.distributed_timeout,
                         distributed_heartbeat=args.distributed_heartbeat)
    if args.resume and not args.config:
        # Process 0 reads the run directory and tells the others (which need not see it).
        config = read_config(args.resume, parse_overrides(extra)) if distributed.process_index() == 0 else None
    elif args.config or extra:
        config = load_config(args.config, extra)  # no --config: the defaults and the overrides
    else:
        raise ValueError("evolve needs --config FILE and/or --key=value settings (or --resume RUN_DIR); "
                         "see popeval evolve --help")
    signals.now_writing()  # the run saves its last generation and releases its directory
    summary = evolve(config, options)
    if distributed.process_index() == 0:
        print(json.dumps(summary, indent=2))
    if summary.get("stopped"):
        print(f"popeval evolve: stopped: {summary['stopped']}", file=sys.stderr)
        return 1
    return 0


def _eval(args, extra) -> int:
    """Plays the saved policy on fresh episodes, or with `--episodes_from_run` replays the run's
    final evaluation, and prints the returns' statistics as JSON."""
    import numpy as np

    returns, which, episodes_from = (_run_episodes if args.episodes_from_run else _fresh_episodes)(args, extra)
    # numpy's float32 mean, as the run's summary takes it: the same figure to the last bit.
    out = {"run_dir": args.run_dir, "policy": which, "episodes": len(returns), "episodes_from": episodes_from,
           "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
           "min_return": float(np.min(returns)), "max_return": float(np.max(returns))}
    print(json.dumps(out, indent=2))
    return 0


def _fresh_episodes(args, extra):
    """`args.episodes` episodes from `args.seed`'s key, which no run's streams use."""
    import jax
    import numpy as np

    from popeval.strategies import load_policy

    episodes = EVAL_EPISODES if args.episodes is None else args.episodes
    seed = EVAL_SEED if args.seed is None else args.seed
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    run, params, obs_stats, which = load_policy(args.run_dir, args.which, extra)
    log.info("playing the %s policy on %d fresh episodes (--seed %d), not the run's: --episodes_from_run "
             "replays its final evaluation", which, episodes, seed)
    keys = jax.random.split(jax.random.key(seed), episodes)
    result = run.manager.population_fitness(keys, jax.tree.map(lambda x: x[None], params), obs_stats=obs_stats)
    return np.asarray(result.returns[0]), which, "fresh"


def _run_episodes(args, extra):
    """The run's final evaluation again: its program, its episodes, the mean and best policies
    as rows 0 and 1 (`strategies.run.programs.policies_eval_fn`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from popeval import compiler
    from popeval import keys as keys_lib
    from popeval.strategies import load_policy, parse_overrides
    from popeval.strategies.run.programs import policies_eval_fn
    from popeval.strategies.run.run_dir import read_config

    if args.episodes is not None or args.seed is not None:
        raise ValueError("--episodes_from_run plays the run's own episodes (its config's eval_episodes "
                         "and seed); drop --episodes and --seed")
    (run, mean, obs_stats, _), best = load_policy(args.run_dir, "mean", extra), load_policy(args.run_dir, "best", extra)
    config = read_config(args.run_dir, parse_overrides(extra))
    which = "mean" if args.which is None else args.which
    same = f"as in result.json's {which}_policy_return" if not extra else f"played with {' '.join(extra)}"
    log.info("replaying the run's final evaluation of the %s policy: its %d episodes (seed %d), %s",
             which, config.run.eval_episodes, config.run.seed, same)
    both = jax.tree.map(lambda m, b: jnp.stack([m, b]), mean, best.params)
    returns = compiler.jit(policies_eval_fn(run, config))(both, obs_stats, np.int32(config.run.seed),
                                                          np.int32(keys_lib.FINAL_EVALUATION))
    return np.asarray(returns)[("mean", "best").index(which)], which, "run"


def _export(args, extra) -> int:
    from popeval.strategies.run.run_dir import export_policy

    signals.now_writing()
    print(export_policy(args.run_dir, args.out_dir, force=args.force))
    return 0


def _list_envs(args, extra) -> int:
    from popeval.environments import registered_envs
    from popeval.environments.registry import SUITES, suite_env_ids

    print("\n".join(registered_envs))
    for namespace in SUITES if args.all else ():  # imports each installed suite
        try:
            ids = suite_env_ids(namespace)
        except ModuleNotFoundError as e:  # stderr: stdout stays a list of ids
            print(f"popeval list-envs: {e}", file=sys.stderr)
            continue
        print("\n".join(ids))
    return 0


def _bench(args, extra) -> int:
    from popeval import bench

    result = bench.bench(args.env, args.pop_size, args.num_rollouts, args.num_env_steps, args.hidden, args.repeats)
    print(bench.format_result(result))
    if args.json:
        signals.now_writing()
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _gif_path(run_dir: str, out: str | None) -> str:
    """Where `render` writes: `--out` (a file ending in .gif), else RUN/policy.gif; checked
    before the episode is computed."""
    if out is None:
        return str(Path(run_dir) / "policy.gif")
    if Path(out).is_dir() or out.endswith(("/", os.sep)):
        raise ValueError(f"--out {out}: a directory; give a file name ending in .gif "
                         f"(e.g. --out {Path(out) / 'policy.gif'})")
    if Path(out).suffix.lower() != ".gif":
        raise ValueError(f"--out {out}: render writes GIFs; the allowed extension is .gif, got "
                         f"{Path(out).suffix or 'none'!r}")
    return out


def _render(args, extra) -> int:
    from popeval import visualize
    from popeval.strategies import load_policy

    out = _gif_path(args.run_dir, args.out)
    run, params, obs_stats, which = load_policy(args.run_dir, args.which, extra)
    log.info("drawing the %s policy of %s", which, args.run_dir)
    frames = visualize.render_policy(run.manager, params, obs_stats=obs_stats, seed=args.seed)
    signals.now_writing()
    visualize.save_gif(frames, out)
    print(out)
    return 0


_COMMANDS = {"evolve": _evolve, "eval": _eval, "export": _export, "list-envs": _list_envs, "bench": _bench,
             "render": _render}
