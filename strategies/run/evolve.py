"""The evolve loop: ask -> shard -> evaluate -> gather -> tell -> log -> checkpoint.

    from popeval.strategies import EvolveConfig, RunOptions, evolve
    summary = evolve(EvolveConfig.from_flat(env_name="CartPole-v1", pop_size=256, num_generations=50),
                     RunOptions(run_dir="runs/cartpole"))

A generation runs on CPU devices as one-device programs (ask, evaluate pieces of the population
on every device, tell: `sharding.Pieces`), so any device count gives the same bits; on
accelerators as one program over the devices (`sharding.Replicated`). Its state stays on the
devices between generations (`strategies.run.programs.generation_step`). Metrics go to the sinks it is given
(`popeval.sinks`; default: CSV, plot, W&B and a progress bar on a terminal). The state is
checkpointed every `checkpoint_every` generations and when the run stops, for any reason;
`RunOptions(resume=RUN)` continues exactly where it stopped.

Start-up overlaps on two helper threads, owned by `_Startup`: while this thread initialises
the state, one helper traces and compiles the generation program from shapes; the other
starts the sinks (W&B's service, matplotlib's import) and then, once the generation program is
traced (tracing is Python: one thread at a time), compiles the evaluation program. XLA
compiles on every core, so on a small machine the overlap mainly hides Python and waiting.
The helpers are joined before `evolve` returns or raises; after Ctrl-C neither is: a compilation,
and a sink still starting (no further one starts), are left to end with the process, and the
sinks that started are closed, so Ctrl-C stops a run at once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from popeval import checkpoint, compiler, distributed, sharding
from popeval import keys as keys_lib
from popeval.sinks import CSVSink, LogSink, PlotSink, ProgressSink, RunInfo, Sink, WandbSink

from . import run_dir as run_dir_lib
from .config import EvolveConfig, RunOptions
from .programs import eval_fn, generation_step, init_fn, init_state

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
    """The two helper threads of a run's start-up (see the module docstring). Made first and
    started then, so that the run can close it whenever Ctrl-C comes."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="popeval-startup")
        self._guard = threading.Lock()
        self._abandoned = False  # Ctrl-C: no further sink starts
        self._starting: Sink | None = None  # the sink whose start runs now

    def start(self, step, evaluate, spec, seed, sinks: Sequence[Sink], info: RunInfo) -> None:
        traced = threading.Event()

        def compile_generation():
            try:
                lowered = step.lower(spec, seed)
            finally:
                traced.set()
            step.compile(lowered)

        def start_sinks():
            for sink in sinks:
                with self._guard:
                    if self._abandoned:
                        return
                    self._starting = sink
                sink.start(info)
                self._starting = None

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
        _result(self._sinks)

    @property
    def evaluate(self):
        """The compiled evaluation program."""
        return _result(self._evaluation)

    def close(self, interrupted: bool = False) -> Sink | None:
        """Joins the helper threads; after Ctrl-C neither the compilation nor the sinks' start
        (both end with the process): returns the sink still starting, which must not be closed."""
        self._pool.shutdown(wait=not interrupted, cancel_futures=True)
        with self._guard:
            self._abandoned = True
            return self._starting if interrupted else None


def _result(future: Future):
    """`future.result()`, waking every 0.1 s: Ctrl-C reaches a process on any of its threads,
    and only a main thread that wakes runs Python's handler, which raises KeyboardInterrupt."""
    while not futures.wait([future], timeout=0.1).done:
        pass
    return future.result()


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or, under the `popeval` command, SIGTERM) stopped a run; its state up to
    `generation` is saved in `run_dir`."""

    def __init__(self, run_dir: Path, generation: int):
        saved = f"; saved generation {generation}" if generation else " before the first generation (nothing to save)"
        super().__init__(f"interrupted{saved}; resume with popeval evolve --resume {run_dir}")
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
    raised; one stopped before writing its `result.json` runs only its final evaluation. When
    the strategy state becomes non-finite (a diverging strategy), the run stops before that
    generation: the last checkpoint holds the last finite state, and the summary says why it
    stopped (`stopped`).
    """
    t_start = time.perf_counter()
    options = RunOptions() if options is None else options
    joined = distributed.initialize(options.coordinator_address, options.num_processes, options.process_id,
                                    timeout=options.distributed_timeout, heartbeat=options.distributed_heartbeat)
    primary = distributed.process_index() == 0  # the one process that writes and logs
    if joined and primary:
        log.info("%s", joined)
    opened = run_dir_lib.open_shared(config, options, primary)
    if isinstance(opened, run_dir_lib.Done):
        return opened.summary
    ctx = _RunContext(opened, options, sinks, primary, t_start)
    progress = ctx.progress
    try:
        _start(ctx)
        _run_generations(ctx)
        if progress.final_returns is None:  # a resumed run that had run its generations (or reached its target)
            progress.final_returns = _final_evaluation(ctx, ctx.step.first(progress.stacked))
    except KeyboardInterrupt:
        raise RunInterrupted(ctx.run_dir, progress.gen) from None
    except Exception as e:
        if distributed.lost_peer(e):
            raise _lost_peer(ctx, e) from e
        raise
    finally:
        ctx.close()
    return _summary(ctx, ctx.step.first(progress.stacked))


@dataclasses.dataclass
class Progress:
    """What a run has done so far (the loop's state): generations run and logged, the state
    after the last of them on the devices, and, once known, why it stopped early, the first
    generation's seconds and the final evaluation. With `_RunContext.meta` (the counters a
    checkpoint saves) it moves once a generation is logged."""

    gen: int
    stacked: Any = None
    stopped: str | None = None  # why the run stopped before its last generation
    compile_time: float | None = None  # the first generation's seconds, compilation included
    final_returns: np.ndarray | None = None  # (2, eval_episodes): the final evaluation's, once run


class _RunContext:
    """One run: its directory, experiment and programs, the resources it started (lock, sinks,
    start-up and generation threads; `close` releases them), and its `progress`."""

    def __init__(self, opened: run_dir_lib.Opened, options: RunOptions, sinks: Sequence[Sink] | None,
                 primary: bool, t_start: float):
        self.run_dir, self.resuming, self.config, self.run = opened.run_dir, opened.resuming, opened.config, opened.run
        self.meta: dict = opened.meta
        self.lock = opened.lock
        self.saved = opened.saved  # the checkpoint read under the lock, whose metadata `meta` is
        self.primary = primary
        self.sinks: list[Sink] = (default_sinks(options) if sinks is None else list(sinks)) if primary else []
        self.startup: _Startup | None = None
        self.start_gen = int(self.meta["generation"])
        self.last = opened.last  # the generation the run ends at (run_dir.last_generation)
        self.solved_before = self.meta.get("solved_at") is not None
        self.progress = Progress(self.start_gen)
        self.step, self.devices = None, 0  # the generation program (`generation_step`), built by `_start`
        self.seed = np.int32(self.config.run.seed)
        self.runner = ThreadPoolExecutor(1, thread_name_prefix="popeval-generation")
        self._t_start, self._elapsed0 = t_start, float(self.meta.get("elapsed_seconds") or 0.0)

    def say(self, *args) -> None:
        """Logs on process 0 only."""
        if self.primary:
            log.info(*args)

    def elapsed(self) -> float:
        """Seconds run, cumulative over resumptions."""
        return self._elapsed0 + time.perf_counter() - self._t_start

    def close(self) -> None:
        """Checkpoints the last generation run, or a resumed run's final evaluation (its
        `checkpoint.json` may be one checkpoint behind), on process 0, then releases what the run
        started."""
        try:
            progress = self.progress
            resumed_to_its_end = self.resuming and progress.final_returns is not None
            if (progress.gen > self.start_gen or resumed_to_its_end) and self.primary:
                self.meta["elapsed_seconds"] = self.elapsed()
                checkpoint.save(self.run_dir, self.step.first(progress.stacked), self.meta)
        finally:
            self.runner.shutdown(wait=False, cancel_futures=True)
            error = sys.exc_info()[0]
            _close(self.sinks, self.startup, failing=error is not None,
                   interrupted=error is not None and issubclass(error, KeyboardInterrupt))
            if self.lock is not None:
                # A run that failed before running a generation leaves no directory it created.
                failed = isinstance(sys.exc_info()[1], Exception)
                self.lock.release(discard_dir=failed and self.progress.gen == self.start_gen)


def _start(ctx: _RunContext) -> None:
    """Builds the generation program, starts the start-up threads and puts the initial (or
    resumed) state on the devices (`ctx.progress.stacked`)."""
    config, run = ctx.config, ctx.run
    ctx.devices = sharding.num_devices()
    ctx.step = generation_step(run, config, ctx.devices)
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                        jax.eval_shape(init_fn(run, config), ctx.seed))
    processes = distributed.process_count()
    ctx.say("run %s: %s on %s, pop %d x %d rollouts, %d device(s)%s%s", ctx.run_dir, run.strategy.name,
            config.environment.name, config.strategy.pop_size, config.run.num_rollouts, ctx.devices,
            f" in {processes} processes" if processes > 1 else "",
            f" (resumed at generation {ctx.start_gen})" if ctx.resuming else "")
    info = RunInfo(run_dir=ctx.run_dir, name=ctx.run_dir.name, title=f"{config.environment.name} / {run.strategy.name}",
                   config=config.to_dict(), start_generation=ctx.start_gen,
                   num_generations=ctx.last, meta=ctx.meta, target=config.run.target)
    ctx.startup = _Startup()
    ctx.startup.start(ctx.step, eval_fn(run, config), spec, ctx.seed, ctx.sinks, info)
    state = _result(ctx.runner.submit(init_state, run, config))  # it compiles: Ctrl-C must not wait
    if ctx.resuming:
        if ctx.primary:
            # The state of the same read as ctx.meta's counters (taken under the lock).
            state, _ = checkpoint.load(ctx.run_dir, state, ctx.saved)
            ctx.saved = None
        state = distributed.broadcast(state)  # the other processes need not see the run directory
    ctx.progress.stacked = ctx.step.replicate(state)


def _run_generations(ctx: _RunContext) -> None:
    """Runs generations until the budget, the target (`stop_at_target`) or a non-finite state:
    each one's row goes to the sinks, then `_advance` makes it the run's progress."""
    step, progress = ctx.step, ctx.progress
    stacked_seed = step.replicate(ctx.seed)
    t0 = time.perf_counter()
    _result(ctx.startup.generation)
    # Generation g+1 runs (on the runner's thread) while generation g's metrics are fetched,
    # logged and checkpointed here. A run that stops early drops one generation.
    pending = ctx.runner.submit(step, progress.stacked, stacked_seed) if progress.gen < ctx.last else None
    while pending is not None:
        new, metrics = _result(pending)
        pending = ctx.runner.submit(step, new, stacked_seed) if progress.gen + 1 < ctx.last else None
        dt = time.perf_counter() - t0
        t0 += dt
        row, ends = _row(ctx, new, {k: v.item() for k, v in step.first(metrics).items()}, dt)
        ctx.startup.wait_for_sinks()
        for sink in ctx.sinks:
            sink.log(progress.gen + 1, row)
        if not _advance(ctx, new, row) or ends:
            break


def _row(ctx: _RunContext, new, metrics: dict, dt: float) -> tuple[dict, bool]:
    """`(generation gen + 1's logged row, whether it is the run's last)`: the program's metrics,
    the step counts and rate, the evaluation of the mean and best policy when one is due (NaN
    otherwise), the time elapsed; the last row (the budget, the target with `stop_at_target`, or
    a non-finite state) also carries the final evaluation (`_with_final_evaluation`)."""
    config, gen, progress = ctx.config, ctx.progress.gen, ctx.progress
    if progress.compile_time is None:
        progress.compile_time = dt
        _warn_nonfinite_returns(ctx, metrics)
    gen_steps = int(metrics.pop("steps/generation"))
    metrics.update({"generation": gen + 1, "steps/env_total": ctx.meta["env_steps"] + gen_steps,
                    "steps/per_second": gen_steps / max(dt, 1e-9)})
    metrics["eval/return"] = metrics["eval/best_return"] = math.nan
    metrics["eval/final_return"] = metrics["eval/final_best_return"] = math.nan  # sinks.FINAL_COLUMNS
    diverged = metrics["nonfinite/state"] > 0
    if not diverged and ((gen + 1) % config.run.eval_every == 0 or gen + 1 == config.run.num_generations):
        state = ctx.step.first(new)
        returns = ctx.startup.evaluate(state.strategy, state.best_params, state.obs_stats, ctx.seed,
                                       np.int32(gen + 1))
        metrics["eval/return"], metrics["eval/best_return"] = np.asarray(returns).mean(axis=1).tolist()
    metrics["time/elapsed"] = ctx.elapsed()
    ends = diverged or gen + 1 == config.run.num_generations or (
        _solved(config, metrics) and config.run.stop_at_target and not ctx.solved_before)
    if ends:  # the final evaluation is of the last finite state
        _with_final_evaluation(ctx, ctx.step.first(progress.stacked if diverged else new), metrics)
    return metrics, ends


def _advance(ctx: _RunContext, new, row: dict) -> bool:
    """Makes a logged generation the run's progress (checkpointed when one is due); False,
    keeping the progress as it was, when its strategy state is non-finite."""
    progress = ctx.progress
    if row["nonfinite/state"] > 0:
        progress.stopped = (f"the strategy state became non-finite at generation {progress.gen + 1} "
                            f"({int(row['nonfinite/state'])} values); kept generation {progress.gen}")
        if ctx.primary:
            log.warning("run %s: %s. Its settings diverge (e.g. a too large std_init or learning_rate).",
                        ctx.run_dir, progress.stopped)
        return False
    solved_at = ctx.meta.get("solved_at")
    if solved_at is None and _solved(ctx.config, row):
        solved_at = {"generation": progress.gen + 1, "seconds": row["time/elapsed"]}
    progress.gen, progress.stacked = progress.gen + 1, new
    ctx.meta.update(generation=progress.gen, env_steps=row["steps/env_total"], solved_at=solved_at,
                    elapsed_seconds=row["time/elapsed"])
    if progress.gen % ctx.config.run.checkpoint_every == 0 and ctx.primary:
        checkpoint.save(ctx.run_dir, ctx.step.first(progress.stacked), ctx.meta)
    return True


def _solved(config: EvolveConfig, metrics: dict) -> bool:
    return config.run.target is not None and metrics["fitness/mean"] >= config.run.target


def _warn_nonfinite_returns(ctx: _RunContext, metrics: dict) -> None:
    """Warns, once, when every member's return of the first generation run is NaN or infinite:
    non-finite fitness ranks worst, so such a run learns nothing."""
    if ctx.primary and math.isnan(metrics["fitness/max"]):
        log.warning("run %s: every member's return in generation %d is NaN or infinite; check the rewards "
                    "of %s's step_env (non-finite fitness ranks worst, so nothing is learned)",
                    ctx.run_dir, ctx.progress.gen + 1, ctx.config.environment.name)


def _lost_peer(ctx: _RunContext, e: Exception) -> RuntimeError:
    """The error a process raises when another process of the run stopped."""
    gen = ctx.progress.gen
    saved = (f"generation {gen} is saved in {ctx.run_dir}" if ctx.primary and gen > ctx.start_gen
             else f"process 0 keeps the last checkpoint in {ctx.run_dir}")
    return RuntimeError(f"process {distributed.process_index()}: another process of this run stopped "
                        f"({' '.join(str(e).split())[:200]}); {saved}; restart every process with "
                        f"--resume {ctx.run_dir}")


def _final_evaluation(ctx: _RunContext, state) -> np.ndarray:
    """The run's final evaluation of `state`'s mean and best policies: `(2, eval_episodes)`
    returns, the episodes of `keys.FINAL_EVALUATION` (what `result.json` reports)."""
    return np.asarray(ctx.startup.evaluate(state.strategy, state.best_params, state.obs_stats, ctx.seed,
                                           np.int32(keys_lib.FINAL_EVALUATION)))


def _with_final_evaluation(ctx: _RunContext, state, row: dict) -> None:
    """Runs the final evaluation, into the run's last row (and, later, its summary)."""
    ctx.progress.final_returns = _final_evaluation(ctx, state)
    row["eval/final_return"], row["eval/final_best_return"] = (float(np.mean(r)) for r in ctx.progress.final_returns)


def _summary(ctx: _RunContext, state) -> dict:
    """The run's summary, with its final evaluation; process 0 writes it to `RUN/result.json`."""
    progress = ctx.progress
    mean_returns, best_returns = progress.final_returns
    summary = {
        "env_name": ctx.config.environment.name,
        "strategy": ctx.run.strategy.name,
        "generations": progress.gen,
        "env_steps": ctx.meta["env_steps"],
        "mean_policy_return": float(np.mean(mean_returns)),
        "best_policy_return": float(np.mean(best_returns)),
        "eval_episodes": ctx.config.run.eval_episodes,
        "best_fitness": float(state.best_fitness),
        "solved_at": ctx.meta.get("solved_at"),
        "wall_seconds": ctx.elapsed(),
        "first_generation_seconds": progress.compile_time,
        "devices": ctx.devices,
        "processes": distributed.process_count(),
        "run_dir": str(ctx.run_dir),
    }
    if progress.stopped:
        summary["stopped"] = progress.stopped
    if not ctx.primary:
        return run_dir_lib.clean_result(summary)
    return run_dir_lib.write_result(ctx.run_dir, summary)


def _close(sinks: Sequence[Sink], startup: _Startup | None, failing: bool = False,
           interrupted: bool = False) -> None:
    """Joins the start-up threads (after Ctrl-C, not the compilation or a sink's start:
    `_Startup.close`), then closes every sink (but one still starting). A failing close is logged
    as a warning, or only at debug level while the run is already failing (a full disk fails
    both: the user gets one error, not one per sink)."""
    starting = None
    try:
        if startup is not None:
            starting = startup.close(interrupted)
    finally:
        for sink in (s for s in sinks if s is not starting):
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001 - one sink must not keep the others open
                (log.debug if failing else log.warning)("closing %s failed (%s: %s)", type(sink).__name__,
                                                        type(e).__name__, e)
