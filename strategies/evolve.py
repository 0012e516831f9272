"""The evolve loop: ask -> shard -> evaluate -> gather -> tell -> log -> checkpoint.

    from popeval.strategies import EvolveConfig, RunOptions, evolve
    summary = evolve(EvolveConfig(env_name="CartPole-v1", pop_size=256, num_generations=50),
                     RunOptions(run_dir="runs/cartpole"))

A generation runs on CPU devices as one-device programs (ask, evaluate pieces of the population
on every device, tell: `sharding.Pieces`), so any device count gives the same bits; on
accelerators as one program over the devices (`sharding.Replicated`). Its state stays on the
devices between generations (`strategies.programs.generation_step`). Metrics go to the sinks it is given
(`popeval.sinks`; default: CSV, plot, W&B and a progress bar on a terminal). The state is
checkpointed every `checkpoint_every` generations and when the run stops, for any reason;
`RunOptions(resume=RUN)` continues exactly where it stopped.

Start-up overlaps on two helper threads, owned by `_Startup` and joined before `evolve`
returns or raises: while this thread initialises the state, one helper traces and compiles
the generation program from shapes; the other starts the sinks (W&B's service, matplotlib's
import) and then, once the generation program is traced (tracing is Python: one thread at a
time), compiles the evaluation program. XLA compiles on every core, so on a small machine the
overlap mainly hides Python and waiting.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from popeval import checkpoint, compiler, distributed, sharding
from popeval import keys as keys_lib
from popeval.sinks import CSVSink, LogSink, PlotSink, ProgressSink, RunInfo, Sink, WandbSink

from . import run_dir as run_dir_lib
from .config import EvolveConfig, RunOptions
from .programs import build, eval_fn, generation_step, init_fn, init_state

__all__ = ["evolve", "default_sinks", "RunInterrupted"]

log = logging.getLogger("popeval")


def default_sinks(options: RunOptions) -> list[Sink]:
    """`metrics.csv`, `fitness.png`, W&B as `options.wandb` says, and progress: a bar on a
    terminal, a log line every 30 s otherwise (`options.progress=False`: neither)."""
    sinks: list[Sink] = [CSVSink(), PlotSink(), WandbSink(options.wandb, options.wandb_project)]
    if options.progress is False:
        return sinks
    bar = sys.stderr.isatty() if options.progress is None else True
    return sinks + [ProgressSink() if bar else LogSink()]


class _Startup:
    """The two helper threads of a run's start-up (see the module docstring)."""

    def __init__(self, step, evaluate, spec, seed, sinks: Sequence[Sink], info: RunInfo):
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="popeval-startup")
        traced = threading.Event()

        def compile_generation():
            try:
                lowered = step.lower(spec, seed)
            finally:
                traced.set()
            step.compile(lowered)

        def start_sinks():
            for sink in sinks:
                sink.start(info)

        def compile_evaluation():
            traced.wait()
            lowered = evaluate.lower(spec.strategy, spec.best_params, spec.obs_stats, seed, seed)
            return lowered.compile(compiler.options())

        # Two threads, three tasks: the sinks start on the second thread, then the evaluation
        # program compiles on whichever thread is free first.
        self.generation: Future = self._pool.submit(compile_generation)
        self._sinks: Future = self._pool.submit(start_sinks)
        self._evaluation: Future = self._pool.submit(compile_evaluation)

    def wait_for_sinks(self) -> None:
        """Returns once every sink has started (raises what a sink's start raised)."""
        self._sinks.result()

    @property
    def evaluate(self):
        """The compiled evaluation program."""
        return self._evaluation.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; its state up to `generation` is saved in `run_dir`."""

    def __init__(self, run_dir: Path, generation: int):
        super().__init__(f"interrupted; saved generation {generation}; resume with "
                         f"popeval evolve --resume {run_dir}")
        self.run_dir, self.generation = run_dir, generation


def evolve(config: EvolveConfig | None = None, options: RunOptions | None = None, *,
           sinks: Sequence[Sink] | None = None) -> dict:
    """Runs (or resumes) an experiment; returns a summary dict (also in `RUN/result.json`).

    Args:
        config: the experiment (`None` when resuming: the saved one).
        options: how this run is run (run directory, resume, W&B, progress).
        sinks: where metrics go (default `default_sinks(options)`); each is started, logged to
            and closed by the loop, which closes them also when the run fails. In a
            multi-process run (`options.num_processes`) only process 0 uses them.

    A resumed run that is complete (all its generations run, or its target reached with
    `stop_at_target`) changes nothing and returns its summary, unless `num_generations` was
    raised. When the strategy state becomes non-finite (a diverging strategy), the run stops
    before that generation: the last checkpoint holds the last finite state, and the summary
    says why it stopped (`stopped`).
    """
    t_start = time.perf_counter()
    options = RunOptions() if options is None else options
    joined = distributed.initialize(options.coordinator_address, options.num_processes, options.process_id,
                                    timeout=options.distributed_timeout)
    primary = distributed.process_index() == 0  # the one process that writes and logs
    say = log.info if primary else (lambda *args: None)
    if joined:
        say("%s", joined)
    opened = run_dir_lib.open_shared(config, options, primary)
    if "done" in opened:
        return opened["done"]
    run_dir, resuming, config, meta = Path(opened["run_dir"]), opened["resuming"], opened["config"], opened["meta"]
    lock = opened.get("lock")
    run = opened.get("run") or build(config)
    startup = None
    sinks = (default_sinks(options) if sinks is None else list(sinks)) if primary else []
    start_gen, elapsed0 = int(meta["generation"]), float(meta.get("elapsed_seconds") or 0.0)
    solved_before = meta.get("solved_at") is not None
    gen, stacked, state, stopped = start_gen, None, None, None
    runner = ThreadPoolExecutor(1, thread_name_prefix="popeval-generation")
    elapsed = lambda: elapsed0 + time.perf_counter() - t_start  # noqa: E731 - cumulative over resumptions
    try:
        devices = sharding.num_devices()
        seed = np.int32(config.seed)
        step = generation_step(run, config, devices)
        spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            jax.eval_shape(init_fn(run, config), seed))
        say("run %s: %s on %s, pop %d x %d rollouts, %d device(s)%s%s", run_dir, run.strategy.name,
            config.env_name, config.pop_size, config.num_rollouts, devices,
            f" in {distributed.process_count()} processes" if distributed.process_count() > 1 else "",
            f" (resumed at generation {start_gen})" if resuming else "")
        info = RunInfo(run_dir=run_dir, name=run_dir.name, title=f"{config.env_name} / {run.strategy.name}",
                       config=config.to_dict(), start_generation=start_gen,
                       num_generations=config.num_generations, meta=meta, target=config.target)
        startup = _Startup(step, eval_fn(run, config), spec, seed, sinks, info)
        state = init_state(run, config)
        if resuming:
            if primary:
                state, _ = checkpoint.load(run_dir, state)
            state = distributed.broadcast(state)  # the other processes need not see the run directory
        stacked, stacked_seed = step.replicate(state), step.replicate(seed)
        compile_time = None
        t0 = time.perf_counter()
        startup.generation.result()
        # Generation g+1 runs (on the runner's thread) while generation g's metrics are fetched,
        # logged and checkpointed here. A run that stops early drops one generation.
        pending = runner.submit(step, stacked, stacked_seed) if gen < config.num_generations else None
        while pending is not None:
            new, metrics = pending.result()
            pending = runner.submit(step, new, stacked_seed) if gen + 1 < config.num_generations else None
            metrics = {k: v.item() for k, v in step.first(metrics).items()}
            dt = time.perf_counter() - t0
            t0 += dt
            if compile_time is None:
                compile_time = dt
            gen_steps = int(metrics.pop("steps/generation"))
            metrics.update({"generation": gen + 1, "steps/env_total": meta["env_steps"] + gen_steps,
                            "steps/per_second": gen_steps / max(dt, 1e-9)})
            metrics["eval/return"] = metrics["eval/best_return"] = math.nan
            diverged = metrics["nonfinite/state"] > 0
            if not diverged and ((gen + 1) % config.eval_every == 0 or gen + 1 == config.num_generations):
                state = step.first(new)
                returns = startup.evaluate(state.strategy, state.best_params, state.obs_stats, seed,
                                           np.int32(gen + 1))
                metrics["eval/return"], metrics["eval/best_return"] = np.asarray(returns).mean(axis=1).tolist()
            metrics["time/elapsed"] = elapsed()
            solved = config.target is not None and metrics["fitness/mean"] >= config.target
            solved_at = meta.get("solved_at")
            if solved and solved_at is None:
                solved_at = {"generation": gen + 1, "seconds": metrics["time/elapsed"]}
            startup.wait_for_sinks()
            for sink in sinks:
                sink.log(gen + 1, metrics)
            if diverged:
                stopped = (f"the strategy state became non-finite at generation {gen + 1} "
                           f"({int(metrics['nonfinite/state'])} values); kept generation {gen}")
                if primary:
                    log.warning("run %s: %s. Its settings diverge (e.g. a too large std_init or learning_rate).",
                                run_dir, stopped)
                break
            # What a checkpoint saves moves together, after the generation is logged.
            gen, stacked = gen + 1, new
            meta.update(generation=gen, env_steps=metrics["steps/env_total"], solved_at=solved_at,
                        elapsed_seconds=metrics["time/elapsed"])
            if gen % config.checkpoint_every == 0 and primary:
                state = step.first(stacked)
                checkpoint.save(run_dir, state, meta)
            if solved and config.stop_at_target and not solved_before:
                break
        if gen > start_gen:
            state = step.first(stacked)
        mean_returns, best_returns = np.asarray(startup.evaluate(
            state.strategy, state.best_params, state.obs_stats, seed, np.int32(keys_lib.FINAL_EVALUATION)))
    except KeyboardInterrupt:
        raise RunInterrupted(run_dir, gen) from None
    except Exception as e:
        if distributed.lost_peer(e):
            saved = (f"generation {gen} is saved in {run_dir}" if primary and gen > start_gen
                     else f"process 0 keeps the last checkpoint in {run_dir}")
            raise RuntimeError(f"process {distributed.process_index()}: another process of this run stopped "
                               f"({' '.join(str(e).split())[:200]}); {saved}; restart every process with "
                               f"--resume {run_dir}") from e
        raise
    finally:
        try:
            if gen > start_gen and primary:
                meta["elapsed_seconds"] = elapsed()
                checkpoint.save(run_dir, step.first(stacked), meta)
        finally:
            runner.shutdown(wait=False, cancel_futures=True)
            _close(sinks, startup, failing=sys.exc_info()[0] is not None)
            if lock is not None:
                lock.release()

    summary = {
        "env_name": config.env_name,
        "strategy": run.strategy.name,
        "generations": gen,
        "env_steps": meta["env_steps"],
        "mean_policy_return": float(np.mean(mean_returns)),
        "best_policy_return": float(np.mean(best_returns)),
        "eval_episodes": config.eval_episodes,
        "best_fitness": float(state.best_fitness),
        "solved_at": meta.get("solved_at"),
        "wall_seconds": elapsed(),
        "first_generation_seconds": compile_time,
        "devices": devices,
        "processes": distributed.process_count(),
        "run_dir": str(run_dir),
    }
    if stopped:
        summary["stopped"] = stopped
    if not primary:
        return run_dir_lib.clean_result(summary)
    return run_dir_lib.write_result(Path(run_dir), summary)


def _close(sinks: Sequence[Sink], startup: _Startup | None, failing: bool = False) -> None:
    """Joins the start-up threads, then closes every sink. A failing close is logged as a
    warning, or only at debug level while the run is already failing (a full disk fails both:
    the user gets one error, not one per sink)."""
    try:
        if startup is not None:
            startup.close()
    finally:
        for sink in sinks:
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001 - one sink must not keep the others open
                (log.debug if failing else log.warning)("closing %s failed (%s: %s)", type(sink).__name__,
                                                        type(e).__name__, e)
