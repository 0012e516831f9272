"""Throughput of a population evaluation on a brax environment: popeval vs brax's own loop.

    python -m experiments.benchmarks brax_throughput [--env ant] [--pop_size 64] [--num_rollouts 1]
        [--num_steps 1000] [--backends generalized,mjx] [--repeats 3] [--json out.json]

Rows, per backend, in one process (so their ratio is meaningful on a shared machine):

- `popeval fitness`: `RolloutWrapper(policy.apply, env=brax_env(...)).population_fitness`
  (per-step keys, masking, early exit once every episode is done), on one device;
- `brax scan`: brax's own stepping as its training code writes it, `jax.vmap(env.step)` over
  all P*B episodes inside one `lax.scan` of T steps, each member's policy applied to its B
  observations, the return summed while the episode is alive; no early exit, no keys. It
  resets from popeval's reset keys, and brax's step draws no randomness, so it plays the
  same episodes: the table's `max |dR|` is the largest difference of their returns.

Columns: `compile s` (trace + lower + compile, ahead of time), `time s` (median of
`--repeats` calls after a warm-up call), `steps/s` (P*B*T over the time: the steps of the
whole rollout, as brax counts them), `live` (the share of those steps taken before the
episode ended). Every member is an MLP 2x32 with its own random initialisation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from popeval import MLPPolicy, RolloutWrapper
from popeval import keys as keys_lib
from popeval.environments.suites import brax_env


def brax_scan(env, policy, num_steps: int):
    """brax's own loop: `fn(member_keys (P, B), pop_params) -> (returns, lengths)`, each (P, B)."""
    step = jax.vmap(jax.vmap(env.brax.step))  # over members, then over their episodes

    def run(member_keys, pop_params):
        reset_keys = jax.vmap(jax.vmap(lambda k: keys_lib.split_episode(k)[0]))(member_keys)
        state = jax.vmap(jax.vmap(env.brax.reset))(reset_keys)
        act = jax.vmap(jax.vmap(policy.apply, in_axes=(None, 0)))  # one member, its B episodes

        def body(carry, _):
            state, ret, length, alive = carry
            state = step(state, act(pop_params, state.obs))
            ret = ret + jnp.where(alive, state.reward, 0.0)
            length = length + alive.astype(jnp.int32)
            return (state, ret, length, alive & (state.done == 0)), None

        shape = member_keys.shape
        init = (state, jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.int32), jnp.ones(shape, bool))
        (_, ret, length, _), _ = jax.lax.scan(body, init, None, num_steps)
        return ret, length

    return run


def _time(fn, args, repeats: int) -> tuple[float, tuple]:
    out = jax.block_until_ready(fn(*args))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(env_name: str, backend: str, pop_size: int, num_rollouts: int, num_steps: int, repeats: int) -> list[dict]:
    """The two rows (`popeval fitness`, `brax scan`) of one backend."""
    env = brax_env(env_name, backend=backend)
    params = env.default_params
    policy = MLPPolicy.for_env(env, params, hidden_sizes=(32, 32))
    pop = jax.jit(jax.vmap(lambda k: policy.init_params(k, env, params)))(
        jax.random.split(jax.random.key(0), pop_size))
    keys = jax.random.split(jax.random.key(1), num_rollouts)
    manager = RolloutWrapper(policy.apply, env=env, num_env_steps=num_steps, devices=1)
    member_keys = keys_lib.member_keys(keys, jnp.arange(pop_size), True)  # what the wrapper plays

    rows, returns = [], {}
    programs = {
        "popeval fitness": (lambda k, p: tuple(manager.population_fitness(k, p)[:2]), (keys, pop)),
        "brax scan": (brax_scan(env, policy, num_steps), (member_keys, pop)),
    }
    total = pop_size * num_rollouts * num_steps
    for impl, (fn, args) in programs.items():
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        compile_s = time.perf_counter() - t0
        run_s, (ret, length) = _time(compiled, args, repeats)
        returns[impl] = np.asarray(ret)
        rows.append({"env": env.name, "backend": backend, "impl": impl, "P": pop_size, "B": num_rollouts,
                     "T": num_steps, "compile_s": compile_s, "time_s": run_s, "steps_per_s": total / run_s,
                     "live": float(np.asarray(length).sum()) / total, "mean_return": float(np.mean(ret))})
    diff = float(np.max(np.abs(returns["popeval fitness"] - returns["brax scan"])))
    for row in rows:
        row["max_abs_return_diff"] = diff
        row["x_brax"] = rows[1]["time_s"] / row["time_s"]
    return rows


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m experiments.benchmarks brax_throughput",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="ant")
    ap.add_argument("--pop_size", "--pop-size", type=int, default=64)
    ap.add_argument("--num_rollouts", "--num-rollouts", type=int, default=1)
    ap.add_argument("--num_steps", "--num-steps", type=int, default=1000)
    ap.add_argument("--backends", default="generalized", help="comma-separated brax backends")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="brax_throughput.json")
    args = ap.parse_args(argv)

    rows = []
    for backend in args.backends.split(","):
        rows += measure(args.env, backend, args.pop_size, args.num_rollouts, args.num_steps, args.repeats)
    load = os.getloadavg()
    print(f"{'env':22s} {'backend':12s} {'impl':16s} {'P':>4s} {'B':>3s} {'T':>5s} {'compile s':>9s} "
          f"{'time s':>7s} {'steps/s':>9s} {'x brax':>6s} {'live':>5s} {'max |dR|':>8s}")
    for r in rows:
        print(f"{r['env']:22s} {r['backend']:12s} {r['impl']:16s} {r['P']:4d} {r['B']:3d} {r['T']:5d} "
              f"{r['compile_s']:9.1f} {r['time_s']:7.2f} {r['steps_per_s']:9.0f} {r['x_brax']:6.2f} "
              f"{r['live']:5.2f} {r['max_abs_return_diff']:8.2g}")
    print(f"load average (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    with open(args.json, "w") as f:
        json.dump({"rows": rows, "loadavg": load, "devices": str(jax.devices())}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
