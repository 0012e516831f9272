"""The suites benchmark: popeval on the environments users bring, against each suite's own loop.

    python -m experiments.benchmarks suites [--quick] [--workloads ...] [--repeats N] [--out FILE]

Per workload, in one process, three programs evaluate the same population (`P` members x `B`
episodes, episodes up to `T` steps) and return each episode's return and length:

- `popeval fitness`: `RolloutWrapper.population_fitness` (early exit: it stops at the last `done`);
- `fused limit`: popeval's environment and the policy fused in one `lax.scan` over all `T`
  steps (`benchmarks.programs.fused_limit`: this machine's limit for the same work, no early exit);
- the peer's program, written as its users write it, over all `T` steps:
  - Craftax: `gymnax full scan`, the program gymnax's `RolloutWrapper` and evosax's
    `GymnaxProblem` compile: craftax's own auto-resetting five-value `step`
    (`make_craftax_env_from_name(..., auto_reset=True)`), returns masked after the first `done`;
  - Brax, Jumanji, Navix: `suite scan`, `vmap` of the suite's own auto-resetting step
    (`brax.envs.create`, jumanji's `AutoResetWrapper`, navix's `step`) in a `lax.scan`.

Workloads named `... evolved` evaluate a population around a trained controller (`--evolved`
run directories, each for its environment's workload; the shipped Craftax-Classic controller by
default, so the full game's evolved workload needs a run of its own): its mean policy, each
member with Gaussian noise of `EVOLVED_NOISE` on every weight. The others evaluate a fresh
population (an MLP of 64 tanh units, greedy). Live steps count only the
steps before each episode's `done`; every row's steps/s is live steps over its time.
Needs the suites extra (`pip install 'popeval[suites]'`); a suite that is not installed is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import programs as bp
from experiments.benchmarks.checks import time_interleaved
from experiments.benchmarks.run import prepare
from popeval import compiler
from popeval.policies import MLPPolicy
from popeval.rollout import RolloutWrapper

REPO = Path(__file__).resolve().parents[2]
#: The trained controller of the Craftax-Classic evolved workload (`--evolved` adds or changes it).
CONTROLLER = REPO / "experiments" / "controllers" / "craftax_classic"
EVOLVED_NOISE = 0.01


class Workload(NamedTuple):
    env_id: str
    pop_size: int
    num_rollouts: int
    num_env_steps: int
    suite: str  # the suite's package, which also names the peer program: craftax, brax, jumanji or navix
    evolved: bool = False


WORKLOADS = {
    "Craftax-Classic random": Workload("craftax/Craftax-Classic-Symbolic-v1", 8, 4, 10_000, "craftax"),
    "Craftax-Classic evolved": Workload("craftax/Craftax-Classic-Symbolic-v1", 8, 4, 10_000, "craftax", True),
    "Craftax random": Workload("craftax/Craftax-Symbolic-v1", 4, 4, 10_000, "craftax"),
    "Craftax evolved": Workload("craftax/Craftax-Symbolic-v1", 4, 4, 10_000, "craftax", True),
    "Brax inverted_pendulum random": Workload("brax/inverted_pendulum", 64, 4, 1000, "brax"),
    "Brax hopper random": Workload("brax/hopper", 16, 4, 1000, "brax"),
    "Jumanji Snake random": Workload("jumanji/Snake-v1", 32, 4, 4000, "jumanji"),
    "Navix Empty-8x8 random": Workload("navix/Navix-Empty-8x8-v0", 64, 4, 256, "navix"),
}
#: --quick: the same programs, small (a check that every row runs, not a timing).
QUICK = {"pop_size": 4, "num_rollouts": 2, "num_env_steps": 64}
HIDDEN = (64,)  # the fresh populations' MLP (tanh)
def _craftax_peer(env: Any) -> tuple[Callable, Callable]:
    """craftax's own auto-resetting env (gymnax's API): `reset(key)`, `step(key, state, action)`."""
    from craftax.craftax_env import make_craftax_env_from_name

    peer = make_craftax_env_from_name(env.env_name, auto_reset=True)
    params = peer.default_params

    def step(key, state, action):
        obs, state, reward, done, _ = peer.step(key, state, action, params)
        return obs, state, reward, done

    return lambda key: peer.reset(key, params), step


def _brax_peer(env: Any, num_steps: int) -> tuple[Callable, Callable]:
    """brax's own environment with its training wrappers (episode limit, auto-reset)."""
    from brax import envs

    peer = envs.create(env.env_name, episode_length=num_steps, backend=env.backend)

    def reset(key):
        state = peer.reset(key)
        return state.obs, state

    def step(key, state, action):
        state = peer.step(state, action)
        return state.obs, state, state.reward, state.done > 0

    return reset, step


def _jumanji_peer(env: Any) -> tuple[Callable, Callable]:
    """jumanji's environment in its `AutoResetWrapper`; observations flattened as popeval's."""
    from jumanji.wrappers import AutoResetWrapper

    peer = AutoResetWrapper(env._env)

    def reset(key):
        state, timestep = peer.reset(key)
        return env._observe(timestep.observation), state

    def step(key, state, action):
        state, timestep = peer.step(state, action)
        return env._observe(timestep.observation), state, timestep.reward, timestep.last()

    return reset, step


def _navix_peer(env: Any) -> tuple[Callable, Callable]:
    """navix's environment, whose `step` resets a finished episode."""
    peer = env._env

    def reset(key):
        timestep = peer.reset(key)
        return timestep.observation, timestep

    def step(key, timestep, action):
        timestep = peer.step(timestep, action)
        return timestep.observation, timestep, timestep.reward, timestep.is_done()

    return reset, step


def peer_scan(reset: Callable, step: Callable, policy: MLPPolicy, num_steps: int) -> Callable:
    """The peer's program: `fn(keys (B,), pop_params, env_params) -> (returns, lengths)`, each (P, B).

    Every episode is a `lax.scan` over all `num_steps` steps of the suite's own `step` (which
    resets a finished episode itself), the reward summed until the first `done`, all `P x B`
    episodes side by side (`vmap` over members of `vmap` over episodes), as gymnax's
    `RolloutWrapper` and evosax's `GymnaxProblem` evaluate a population."""
    def episode(key, params):
        reset_key, key = jax.random.split(key)
        obs, state = reset(reset_key)

        def body(carry, _):
            obs, state, key, ret, length, alive = carry
            key, policy_key, step_key = jax.random.split(key, 3)
            obs, state, reward, done = step(step_key, state, policy.apply(params, obs, policy_key))
            ret = ret + jnp.where(alive, reward, 0.0)
            return (obs, state, key, ret, length + alive.astype(jnp.int32), alive & ~done), None

        init = (obs, state, key, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), jnp.ones((), bool))
        (*_, ret, length, _), _ = jax.lax.scan(body, init, None, num_steps)
        return ret, length

    members = jax.vmap(jax.vmap(episode, (0, None)), (None, 0))
    return lambda keys, pop_params, env_params: members(keys, pop_params)


def peer_program(name: str, env: Any, policy: MLPPolicy, num_steps: int) -> tuple[str, Callable]:
    """`(row name, program)` of the suite `name`'s own loop (see the module's docstring)."""
    if name == "craftax":
        return "gymnax full scan", peer_scan(*_craftax_peer(env), policy, num_steps)
    peers = {"brax": lambda: _brax_peer(env, num_steps), "jumanji": lambda: _jumanji_peer(env),
             "navix": lambda: _navix_peer(env)}
    return "suite scan", peer_scan(*peers[name](), policy, num_steps)


def controller_of(env_id: str, runs: list[Path]) -> Path | None:
    """The first of `runs` (run directories or controllers) that evolved on `env_id`."""
    from popeval.strategies.run.run_dir import read_config

    return next((run for run in runs if read_config(run).environment.name == env_id), None)


def population(workload: Workload, controller: Path | None) -> tuple[Any, Any, MLPPolicy, Any]:
    """`(env, env_params, policy, pop_params)`: a fresh population (`benchmarks.programs.population`
    with `HIDDEN`), or for an evolved workload the controller's mean policy with noise (the
    controller's architecture)."""
    if not workload.evolved:
        pop = bp.population(workload.env_id, workload.pop_size, workload.num_env_steps, HIDDEN)
        return pop.env, pop.env_params, pop.policy, pop.pop_params
    from popeval.strategies import load_policy

    saved = load_policy(controller, "mean")
    leaves, treedef = jax.tree.flatten(saved.params)
    noise = jax.random.split(jax.random.key(2), len(leaves))
    pop = [x + EVOLVED_NOISE * jax.random.normal(k, (workload.pop_size,) + x.shape, x.dtype)
           for x, k in zip(leaves, noise)]
    return saved.run.env, saved.run.env_params, saved.run.policy, jax.tree.unflatten(treedef, pop)


def bench(name: str, workload: Workload, repeats: int, controller: Path | None,
          log: Callable[[str], None]) -> list[dict]:
    """The rows of one workload: every program compiled and warmed up, then timed in turns."""
    env, env_params, policy, pop_params = population(workload, controller)
    keys = jax.random.split(jax.random.key(1), workload.num_rollouts)
    env_params = env_params.replace(max_steps_in_episode=max(workload.num_env_steps,
                                                             int(env_params.max_steps_in_episode)))
    wrapper = RolloutWrapper(policy.apply, env=env, env_params=env_params, num_env_steps=workload.num_env_steps,
                             devices=1)
    peer_name, peer = peer_program(workload.suite, env, policy, workload.num_env_steps)
    rows_programs = {
        "popeval fitness": (lambda k, p, e: wrapper.population_fitness(k, p, e), lambda r: r.lengths),
        "fused limit": (bp.fused_limit(env, policy, workload.num_env_steps), lambda r: r[1]),
        peer_name: (peer, lambda r: r[1]),
    }
    args, rows, compiled = (keys, pop_params, env_params), {}, {}
    for impl, (fn, lengths_of) in rows_programs.items():
        stats, fast, out = prepare(fn, args, float("inf"), options=compiler.options())
        lengths = np.asarray(lengths_of(out))
        if fast is not None:
            compiled[impl] = fast
        rows[impl] = {"workload": name, "env": workload.env_id, "pop_size": workload.pop_size,
                      "num_rollouts": workload.num_rollouts, "num_env_steps": workload.num_env_steps, "impl": impl,
                      **stats, "live_steps": int(lengths.sum()), "mean_length": float(lengths.mean()),
                      "max_length": int(lengths.max())}
        log(f"  {name} {impl}: compiled in {stats['compile_s']:.1f} s, first call {stats['time_s'] or 0:.1f} s")
    for impl, times in time_interleaved(compiled, args, repeats).items():
        rows[impl].update(time_s=statistics.median(times), times_s=times)
    peer_time = rows[peer_name]["time_s"]
    limit_time = rows["fused limit"]["time_s"]
    for row in rows.values():
        row["live_steps_per_s"] = row["live_steps"] / row["time_s"]
        row["speedup_vs_peer"] = peer_time / row["time_s"]
        row["speedup_vs_limit"] = limit_time / row["time_s"]
    return list(rows.values())


def format_table(rows: list[dict]) -> str:
    header = (f"{'workload':<30} {'P x B':>7} {'T':>6} {'impl':<18} {'time s':>9} {'compile s':>9} "
              f"{'live steps/s':>12} {'mean len':>8} {'x peer':>8} {'x limit':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['workload']:<30} {r['pop_size']:>3}x{r['num_rollouts']:<3} {r['num_env_steps']:>6} "
                     f"{r['impl']:<18} {r['time_s']:>9.3f} {r['compile_s']:>9.1f} {r['live_steps_per_s']:>12.4g} "
                     f"{r['mean_length']:>8.1f} {r['speedup_vs_peer']:>8.2f} {r['speedup_vs_limit']:>8.2f}")
    lines.append("live steps/s: steps before done per second. x peer: the peer's program (gymnax full scan or suite "
                 "scan) time / time. x limit: the fused limit's time / time. Times are medians of the timed calls "
                 "(one call where the first took over 30 s).")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.benchmarks suites", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"every row once, small: {QUICK}")
    p.add_argument("--workloads", nargs="+", default=None, choices=list(WORKLOADS), metavar="WORKLOAD",
                   help=f"default: all ({'; '.join(WORKLOADS)})")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per row, median reported (default 3)")
    p.add_argument("--evolved", type=Path, nargs="+", default=[CONTROLLER], metavar="RUN_DIR",
                   help="run directories or controllers for the evolved workloads, each used for the workload of "
                        "its environment (default: the shipped Craftax-Classic controller)")
    p.add_argument("--out", default="bench_results/suites.json", help="JSON output path")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    log = partial(print, file=sys.stderr, flush=True)
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} (on {os.cpu_count()} cores)", flush=True)
    rows, skipped = [], []
    for name in args.workloads or WORKLOADS:
        workload = WORKLOADS[name]
        controller = controller_of(workload.env_id, args.evolved) if workload.evolved else None
        if importlib.util.find_spec(workload.suite) is None or (workload.evolved and controller is None):
            skipped.append(name)
            continue
        if args.quick:
            workload = workload._replace(**QUICK)
        rows.extend({**row, "load_before": os.getloadavg()[0]}
                    for row in bench(name, workload, 1 if args.quick else args.repeats, controller, log))
    load_end = os.getloadavg()
    print(format_table(rows))
    if skipped:
        print(f"skipped (suite not installed, pip install 'popeval[suites]', or no --evolved run of its "
              f"environment): {', '.join(skipped)}")
    print(f"load average at end: {load_end[0]:.2f} (on {os.cpu_count()} cores)")
    report = {"config": {"quick": args.quick, "repeats": args.repeats, "hidden_sizes": list(HIDDEN),
                         "evolved": [str(p) for p in args.evolved], "evolved_noise": EVOLVED_NOISE},
              "machine": {"jax": jax.__version__, "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
                          "platform": platform.platform(), "load_average_start": load_start,
                          "load_average_end": load_end},
              "results": rows, "skipped": skipped}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0
