"""The evolve loop: ask -> shard -> evaluate -> gather -> tell -> log -> checkpoint.

    from popeval.strategies import EvolveConfig, evolve
    result = evolve(EvolveConfig(env_name="CartPole-v1", pop_size=256, num_generations=50))

A generation is one `pmap`ped program per device (`popeval.sharding`): each device asks the
strategy for the (same) population, evaluates its slice with the fitness-only path, the
fitness is all-gathered and each device tells the strategy. Episode keys derive from
(seed, generation, member index), so results do not depend on the number of devices. The
state (strategy state, generation, best-so-far, observation statistics) is checkpointed
every `checkpoint_every` generations; `resume=RUN_DIR` continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from flax import struct

from popeval import checkpoint, compiler, normalization, sharding
from popeval.environments import make
from popeval.logging import CSVSink, WandbSink, plot_fitness, preload_plotting
from popeval.policies import LSTMPolicy, MLPPolicy
from popeval.rollout import RolloutWrapper

from .core import make_strategy, sanitize_fitness

__all__ = ["EvolveConfig", "EvolveState", "evolve", "load_config", "build"]

log = logging.getLogger("popeval")

# Fields that may differ between a run and its resumption.
_RUN_CONTROL = {"resume", "quiet", "wandb", "run_dir", "num_generations"}


@dataclasses.dataclass(frozen=True)
class EvolveConfig:
    """One experiment: environment, policy, strategy, budget and logging."""

    env_name: str = "CartPole-v1"
    env_kwargs: dict = dataclasses.field(default_factory=dict)
    num_env_steps: typing.Optional[int] = None
    policy: str = "mlp"  # "mlp" | "lstm"
    hidden_sizes: tuple = (32, 32)
    activation: str = "tanh"
    strategy: str = "openai_es"
    strategy_kwargs: dict = dataclasses.field(default_factory=dict)
    fitness_shaping: str = "centered_rank"
    pop_size: int = 256
    num_rollouts: int = 8
    num_generations: int = 100
    common_random_numbers: bool = True
    obs_normalization: bool = False
    compaction: bool = True  # RolloutWrapper(compaction=...): pays while most episodes are short
    seed: int = 0
    target: typing.Optional[float] = None  # reached when the population mean fitness >= target
    stop_at_target: bool = False
    eval_every: int = 10
    eval_episodes: int = 64
    checkpoint_every: int = 10
    run_dir: typing.Optional[str] = None
    resume: typing.Optional[str] = None
    wandb: str = "auto"  # auto | disabled | offline | online
    wandb_project: str = "popeval"
    quiet: bool = False
    budget: str = ""  # free text: the wall-time budget the config was tuned for

    def __post_init__(self):
        if self.pop_size < 2:
            raise ValueError(f"pop_size must be >= 2, got {self.pop_size}")
        if self.num_rollouts < 1 or self.num_generations < 1:
            raise ValueError("num_rollouts and num_generations must be >= 1")
        if self.policy not in ("mlp", "lstm"):
            raise ValueError(f"policy must be 'mlp' or 'lstm', got {self.policy!r}")
        if self.wandb not in ("auto", "disabled", "offline", "online"):
            raise ValueError(f"wandb must be auto, disabled, offline or online, got {self.wandb!r}")
        if self.eval_every < 1 or self.checkpoint_every < 1 or self.eval_episodes < 1:
            raise ValueError("eval_every, checkpoint_every and eval_episodes must be >= 1")
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hidden_sizes"] = list(self.hidden_sizes)
        return d


def _check_type(name: str, value: Any, annotation: Any) -> Any:
    hint = typing.get_type_hints(EvolveConfig)[name]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    allowed = args if origin is typing.Union else (hint,)
    for t in allowed:
        if t is type(None) and value is None:
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is tuple and isinstance(value, (list, tuple)):
            return tuple(value)
        if t is not type(None) and isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return value
    names = " or ".join(getattr(t, "__name__", str(t)) for t in allowed)
    raise TypeError(f"config key {name!r}: expected {names}, got {value!r} ({type(value).__name__})")


def parse_overrides(items: list[str]) -> dict:
    """`["--key=value", "key2=value2"]` -> `{key: value}` (values in YAML syntax)."""
    out = {}
    for item in items:
        item = item[2:] if item.startswith("--") else item
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected key=value")
        k, v = item.split("=", 1)
        out[k.replace("-", "_")] = yaml.safe_load(v)
    return out


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None) -> EvolveConfig:
    """Builds an `EvolveConfig` from a YAML file and `key=value` overrides (values in YAML syntax).

    Raises:
        ValueError / TypeError naming an unknown or mistyped key.
    """
    data: dict = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config file holds a mapping of keys to values")
    data.update(overrides if isinstance(overrides, dict) else parse_overrides(overrides or []))
    fields = {f.name for f in dataclasses.fields(EvolveConfig)}
    for k in data:
        if k not in fields:
            import difflib

            close = difflib.get_close_matches(k, fields, n=1)
            raise ValueError(f"unknown config key {k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    typed = {k: _check_type(k, v, None) for k, v in data.items()}
    return EvolveConfig(**typed)


@struct.dataclass
class EvolveState:
    strategy: Any
    generation: jax.Array  # int32
    best_params: Any
    best_fitness: jax.Array  # float32
    obs_stats: Any  # ObsStats or None


class Run(typing.NamedTuple):
    """Everything built from a config (no state)."""

    env: Any
    env_params: Any
    policy: Any
    manager: RolloutWrapper
    strategy: Any
    template: Any  # one policy's parameters as zeros (shapes and dtypes; values come from the seed)


def build(config: EvolveConfig) -> Run:
    """Environment, policy, rollout manager and strategy for a config (nothing is compiled)."""
    env, env_params = make(config.env_name, **config.env_kwargs)
    if config.policy == "lstm":
        policy = LSTMPolicy.for_env(env, env_params, hidden_size=config.hidden_sizes[0])
        init_carry = policy.initialize_carry()
    else:
        policy = MLPPolicy.for_env(env, env_params, hidden_sizes=config.hidden_sizes,
                                   activation=config.activation)
        init_carry = None
    manager = RolloutWrapper(
        policy.apply, env=env, env_params=env_params, num_env_steps=config.num_env_steps,
        init_carry=init_carry, common_random_numbers=config.common_random_numbers,
        obs_normalization=config.obs_normalization, compaction=config.compaction,
    )
    shapes = jax.eval_shape(lambda k: policy.init_params(k, env, env_params), jax.random.key(0))
    template = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    strategy = make_strategy(config.strategy, config.pop_size, template, config.fitness_shaping,
                             **config.strategy_kwargs)
    return Run(env, env_params, policy, manager, strategy, template)


def _init_fn(run: Run, config: EvolveConfig):
    """`init(seed) -> EvolveState`: the policy initialised from the seed is the strategy's mean."""
    def init(seed):
        key = jax.random.key(seed)
        params = run.policy.init_params(key, run.env, run.env_params)
        stats = normalization.init(run.manager.obs_shape) if config.obs_normalization else None
        return EvolveState(
            strategy=run.strategy.init(jax.random.fold_in(key, 1), params),
            generation=jnp.int32(0),
            best_params=params,
            best_fitness=jnp.float32(-jnp.inf),
            obs_stats=stats,
        )

    return init


def _init_state(run: Run, config: EvolveConfig) -> EvolveState:
    seed = np.int32(config.seed)  # one program, not one per eager op:
    return jax.jit(_init_fn(run, config)).lower(seed).compile(compiler.options())(seed)


def _generation_fn(run: Run, config: EvolveConfig, devices: int):
    """The per-device generation program (traced once; the seed is an argument, so runs that
    differ only in their seed share the compiled program and the compilation cache)."""
    pop_size, num_rollouts = config.pop_size, config.num_rollouts

    def generation(state: EvolveState, seed: jax.Array):
        gen_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 2), state.generation)
        key_ask, key_eval = jax.random.split(gen_key)
        population, strategy_state = run.strategy.ask(key_ask, state.strategy)
        members, per_device = sharding.local_slice(pop_size, devices)
        mine = jax.tree.map(lambda x: x[jnp.minimum(members, pop_size - 1)], population)
        if config.common_random_numbers:
            keys = jnp.broadcast_to(jax.random.split(key_eval, num_rollouts), (per_device, num_rollouts))
        else:
            keys = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(key_eval, i), num_rollouts))(members)
        result = run.manager.population_fitness(keys, mine, obs_stats=state.obs_stats)
        fitness = sharding.gather_members(result.returns.mean(axis=-1), pop_size)
        steps = sharding.gather_members(result.lengths.sum(axis=-1), pop_size)
        strategy_state, tell_metrics = run.strategy.tell(strategy_state, population, fitness)

        clean, _ = sanitize_fitness(fitness)
        best = jnp.argmax(clean)
        improved = jnp.isfinite(fitness[best]) & (fitness[best] > state.best_fitness)
        best_params = jax.tree.map(lambda b, p: jnp.where(improved, p[best], b), state.best_params, population)
        best_fitness = jnp.where(improved, fitness[best], state.best_fitness)
        obs_stats = state.obs_stats
        if config.obs_normalization:
            obs_stats = normalization.merge_stacked(sharding.gather_members(result.obs_stats, pop_size), obs_stats)

        finite = jnp.isfinite(fitness)
        masked = jnp.where(finite, fitness, jnp.nan)
        metrics = {
            "fitness/max": jnp.nanmax(masked),
            "fitness/mean": jnp.nanmean(masked),
            "fitness/min": jnp.nanmin(masked),
            "fitness/std": jnp.nanstd(masked),
            "best/fitness": best_fitness,
            "steps/generation": jnp.sum(steps).astype(jnp.float32),
            **tell_metrics,
        }
        new = EvolveState(
            strategy=strategy_state, generation=state.generation + 1, best_params=best_params,
            best_fitness=best_fitness, obs_stats=obs_stats,
        )
        return new, metrics

    return generation


def _eval_fn(run: Run, config: EvolveConfig):
    """`evaluate(strategy_state, best_params, obs_stats, seed, index) -> returns (2, E)`: the
    strategy's mean policy (row 0) and the best policy (row 1) on the same `eval_episodes`
    episodes; `index` picks them."""
    manager, episodes = run.manager, config.eval_episodes

    def evaluate(strategy_state, best_params, obs_stats, seed, index):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 3), index)
        keys = jnp.broadcast_to(jax.random.split(key, episodes), (2, episodes))
        both = jax.tree.map(lambda m, b: jnp.stack([m, b]), run.strategy.mean(strategy_state), best_params)
        return manager.population_fitness(keys, both, obs_stats=obs_stats).returns

    return jax.jit(evaluate)  # compiled by the caller, with `compiler.options()`


def _prepare_run_dir(config: EvolveConfig) -> tuple[Path, bool]:
    if config.resume:
        run_dir = Path(config.resume)
        if not checkpoint.exists(run_dir) or not (run_dir / "config.json").is_file():
            raise ValueError(f"--resume {run_dir}: not a popeval run directory (no checkpoint found)")
        saved = json.loads((run_dir / "config.json").read_text())
        mine = config.to_dict()
        diff = sorted(k for k in set(saved) | set(mine)
                      if k not in _RUN_CONTROL and saved.get(k) != mine.get(k))
        if diff:
            raise ValueError(f"--resume {run_dir}: the run was made with another config (differs in {diff})")
        return run_dir, True
    run_dir = Path(config.run_dir or f"runs/{config.env_name}-{config.strategy}-seed{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(f"run directory {run_dir} is not empty; pass resume={run_dir} to continue it")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True))
    return run_dir, False


def evolve(config: EvolveConfig, *, progress: bool | None = None) -> dict:
    """Runs (or resumes) an experiment; returns a summary dict (also in `result.json`)."""
    t_start = time.perf_counter()
    run = build(config)  # a bad config fails here, before the run directory is touched
    run_dir, resuming = _prepare_run_dir(config)
    devices = sharding.num_devices()
    seed = np.int32(config.seed)
    step = sharding.Replicated(_generation_fn(run, config, devices), devices)
    evaluate = _eval_fn(run, config)
    spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), jax.eval_shape(_init_fn(run, config), seed))
    meta: dict = {"generation": 0, "env_steps": 0, "wandb_id": None, "solved_at": None}
    if resuming:
        meta = checkpoint.load_meta(run_dir)
    # While this thread initialises the state, two helpers trace and compile the generation
    # program from shapes, start W&B (mostly waiting on its service process) and, once the
    # generation program is traced (tracing is Python: one thread at a time), compile the
    # evaluation program and import matplotlib. XLA compiles on every core, so on a small
    # machine the overlap mainly hides Python and waiting.
    traced = threading.Event()

    def compile_generation():
        try:
            lowered = step.lower(spec, seed)
        finally:
            traced.set()
        step.compile(lowered)

    def compile_evaluation():
        traced.wait()
        lowered = evaluate.lower(spec.strategy, spec.best_params, spec.obs_stats, seed, seed)
        compiled = lowered.compile(compiler.options())
        preload_plotting()
        return compiled

    pool = ThreadPoolExecutor(2)
    compiling = pool.submit(compile_generation)
    starting = pool.submit(WandbSink, config.wandb, config.wandb_project, run_dir, config.to_dict(),
                           name=run_dir.name, resume_id=meta.get("wandb_id"))
    evaluating = pool.submit(compile_evaluation)
    pool.shutdown(wait=False)
    state = _init_state(run, config)
    if resuming:
        state, _ = checkpoint.load(run_dir, state)
    start_gen = int(meta["generation"])
    csv = CSVSink(run_dir / "metrics.csv", keep_until=start_gen if resuming else None)
    stacked, stacked_seed = step.replicate(state), step.replicate(seed)
    wandb = None
    show = (not config.quiet and sys.stderr.isatty()) if progress is None else progress
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=config.num_generations, initial=start_gen, desc=config.env_name, unit="gen")
    log.info("run %s: %s on %s, pop %d x %d rollouts, %d device(s)%s", run_dir, run.strategy.name,
             config.env_name, config.pop_size, config.num_rollouts, devices, " (resumed)" if resuming else "")

    def save():
        checkpoint.save(run_dir, state, meta)

    compile_time = None
    gen = start_gen
    t0 = time.perf_counter()
    try:
        compiling.result()
        # Generation g+1 is dispatched before generation g's metrics are fetched, so logging and
        # checkpointing overlap the devices' work. A run that stops early drops one generation.
        pending = step(stacked, stacked_seed) if gen < config.num_generations else None
        while pending is not None:
            new, metrics = pending
            pending = step(new, stacked_seed) if gen + 1 < config.num_generations else None
            metrics = {k: v[0].item() for k, v in jax.device_get(metrics).items()}
            dt = time.perf_counter() - t0
            t0 += dt
            if compile_time is None:
                compile_time = dt
            gen_steps = int(metrics.pop("steps/generation"))
            metrics.update({"generation": gen + 1, "steps/env_total": meta["env_steps"] + gen_steps,
                            "steps/per_second": gen_steps / max(dt, 1e-9)})
            metrics["eval/return"] = metrics["eval/best_return"] = math.nan
            if (gen + 1) % config.eval_every == 0 or gen + 1 == config.num_generations:
                state = step.first(new)
                returns = evaluating.result()(state.strategy, state.best_params, state.obs_stats, seed,
                                              np.int32(gen + 1))
                metrics["eval/return"], metrics["eval/best_return"] = np.asarray(returns).mean(axis=1).tolist()
            metrics["time/elapsed"] = time.perf_counter() - t_start
            solved = config.target is not None and metrics["fitness/mean"] >= config.target
            solved_at = meta.get("solved_at")
            if solved and solved_at is None:
                solved_at = {"generation": gen + 1, "seconds": metrics["time/elapsed"]}
            csv.log(metrics)
            if wandb is None:
                wandb = starting.result()
                meta["wandb_id"] = wandb.run_id or meta.get("wandb_id")
            wandb.log(metrics, step=gen + 1)
            # What a checkpoint saves moves together, after the generation is logged.
            gen, stacked = gen + 1, new
            meta.update(generation=gen, env_steps=metrics["steps/env_total"], solved_at=solved_at)
            if bar is not None:
                bar.set_postfix(best=f"{metrics['best/fitness']:.1f}", mean=f"{metrics['fitness/mean']:.1f}",
                                sps=f"{metrics['steps/per_second']:.2e}")
                bar.update(1)
            if gen % config.checkpoint_every == 0:
                state = step.first(stacked)
                save()
            if solved and config.stop_at_target:
                break
    finally:
        if bar is not None:
            bar.close()
        if gen > start_gen:
            state = step.first(stacked)
            save()
        plot_fitness(run_dir / "metrics.csv", run_dir / "fitness.png", f"{config.env_name} / {run.strategy.name}")
        starting.result().finish()

    mean_returns, best_returns = np.asarray(
        evaluating.result()(state.strategy, state.best_params, state.obs_stats, seed, np.int32(10**6)))
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
        "wall_seconds": time.perf_counter() - t_start,
        "first_generation_seconds": compile_time,
        "devices": devices,
        "run_dir": str(run_dir),
    }
    (run_dir / "result.json").write_text(json.dumps(summary, indent=2))
    return summary


#: Config keys a saved policy may be evaluated with differently (they change no parameter shape).
EVAL_OVERRIDES = ("env_kwargs", "num_env_steps")


def load_policy(run_dir: str | os.PathLike, which: str = "best", overrides: list[str] | dict | None = None):
    """`(run, params, obs_stats)` of a saved run: its `best` or `mean` policy.

    `overrides` (`["--num_env_steps=20000", "--env_kwargs={}"]` or a dict) change how the
    policy is evaluated: only the keys in `EVAL_OVERRIDES`.
    """
    run_dir = Path(run_dir)
    if which not in ("best", "mean"):
        raise ValueError(f"which must be 'best' or 'mean', got {which!r}")
    if not (run_dir / "config.json").is_file() or not checkpoint.exists(run_dir):
        raise FileNotFoundError(f"{run_dir}: not a popeval run directory (config.json and a checkpoint)")
    changes = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    refused = sorted(set(changes) - set(EVAL_OVERRIDES))
    if refused:
        raise ValueError(f"cannot evaluate a saved policy with other {refused}; "
                         f"only {list(EVAL_OVERRIDES)} may change")
    saved = json.loads((run_dir / "config.json").read_text())
    config = load_config(None, {**saved, "resume": None, **changes})
    run = build(config)
    state, _ = checkpoint.load(run_dir, _init_state(run, config))
    params = state.best_params if which == "best" else run.strategy.mean(state.strategy)
    return run, params, state.obs_stats
