"""The benchmark's checks besides the timed rows: the fitness path's memory, eager `env.step`
calls in a Python loop (`benchmarks.run` prints and saves both), waiting for a quiet
machine before a workload (`wait_for_quiet`), and timing the rows' programs in turns
(`time_interleaved`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from experiments.benchmarks import programs as bp
from popeval.environments import make

MB = 2**20
#: Memory checks: the fitness path's footprint (env, P, B, T) and its growth with T (env, P, B, (T, T')).
MEMORY = {"footprint": ("CartPole-v1", 65_536, 8, None), "over_t": ("Pendulum-v1", 512, 8, (200, 1000))}
QUICK_MEMORY = {"footprint": ("CartPole-v1", 64, 2, 50), "over_t": ("Pendulum-v1", 8, 2, (20, 100))}
MEMORY_TARGET_MB = 2048.0
#: Eager check: Python-loop `env.step` calls per environment (quick: fewer).
EAGER_ENVS, EAGER_STEPS, QUICK_EAGER_STEPS = ("CartPole-v1", "Breakout-MinAtar"), 2000, 50
#: The longest `wait_for_quiet` waits before it gives up (and says so).
QUIET_WAIT_S = 300.0
#: A program faster than this is called once untimed before each timed call (`time_interleaved`).
REWARM_S = 1.0


def wait_for_quiet(below: float | None, log: Callable[[str], None], poll_s: float = 5.0) -> float | None:
    """Waits until the 1-minute load average is below `below` (at most `QUIET_WAIT_S`; None:
    no wait) and returns it then (None where the OS has no load average). The benchmark's own
    threads raise the load while it runs; waiting lets that decay between workloads."""
    if not hasattr(os, "getloadavg"):
        return None
    load, start = os.getloadavg()[0], time.monotonic()
    while below is not None and load >= below and time.monotonic() - start < QUIET_WAIT_S:
        time.sleep(poll_s)
        load = os.getloadavg()[0]
    if below is not None and load >= below:
        log(f"  the load average is still {load:.2f} after {QUIET_WAIT_S:.0f} s; timing anyway")
    return load


def memory_check(footprint: tuple, over_t: tuple) -> dict:
    """The default fitness path's XLA buffers and resident-memory growth for a large population
    (`footprint`), and its XLA buffers at two episode lengths T (`over_t`, episodes of T steps)."""
    env_id, pop_size, num_rollouts, num_steps = footprint
    w, compiled, args = bp.fitness_program(env_id, pop_size, num_rollouts, num_steps, {})
    devices = len(getattr(w, "devices", ())) or 1  # the wrapper's default: all local devices
    xla = bp.xla_bytes(compiled, devices)
    fit, growth = bp.peak_rss_growth(lambda: compiled(*args))
    target = MEMORY_TARGET_MB * MB
    fits = {"env": env_id, "pop_size": pop_size, "num_rollouts": num_rollouts, "num_env_steps": w.num_env_steps,
            "devices": devices,
            **{f"xla_{k}_bytes": bp.xla_bytes(compiled, devices, (k,)) for k in ("temp", "output", "argument")},
            "xla_bytes": xla, "bytes_per_episode": None if xla is None else xla / (pop_size * num_rollouts),
            "rss_growth_bytes": growth, "min_length": int(np.min(fit.lengths)), "target_mb": MEMORY_TARGET_MB,
            "passed": xla is not None and xla <= target and (growth is None or growth <= target)}
    env_id, pop_size, num_rollouts, steps = over_t
    sizes = [bp.xla_bytes(bp.fitness_program(env_id, pop_size, num_rollouts, t, {"max_steps_in_episode": t})[1],
                        devices) for t in steps]
    flat = None not in sizes and sizes[1] <= 1.05 * sizes[0] + 65_536
    grows = {"env": env_id, "pop_size": pop_size, "num_rollouts": num_rollouts, "num_env_steps": list(steps),
             "xla_bytes": sizes, "passed": flat}
    return {"footprint": fits, "over_t": grows}


def eager_check(env_ids: tuple[str, ...], num_steps: int) -> list[dict]:
    """Milliseconds per eager `env.step` call in a Python loop (what a visualiser or a gym-style
    loop does): popeval's default (a per-object compiled step), the traced body dispatched op
    by op (what an eager call cost before), and gymnax's jitted step where installed."""
    gymnax = bp._gymnax()[0]
    rows = []
    for env_id in env_ids:
        env, params = make(env_id)
        impls = {"popeval step": (env.step, env.reset, params),
                 "op by op (old eager)": (env._step, env.reset, params)}
        if gymnax is not None and env_id in gymnax.registered_envs:
            genv, gparams = gymnax.make(env_id)
            impls["gymnax step"] = (genv.step, genv.reset, gparams)
        for impl, (step, reset, p) in impls.items():
            key = jax.random.key(0)
            _, state = reset(key, p)
            action = jax.numpy.int32(1)
            jax.block_until_ready(step(key, state, action, p))  # compile
            n = num_steps if impl != "op by op (old eager)" else max(1, num_steps // 20)
            start = time.perf_counter()
            for _ in range(n):
                out = step(key, state, action, p)
                state = out[1]
            jax.block_until_ready(out)
            rows.append({"env": env_id, "impl": impl, "calls": n,
                         "ms_per_call": (time.perf_counter() - start) / n * 1e3})
    return rows


def format_eager(rows: list[dict]) -> str:
    return "eager env.step in a Python loop (ms per call): " + "; ".join(
        f"{r['env']} {r['impl']} {r['ms_per_call']:.3f}" for r in rows)


def format_memory(m: dict) -> str:
    """The memory checks in two lines."""
    f, g = m["footprint"], m["over_t"]

    def mb(x):
        return "n/a" if x is None else f"{x / MB:.1f} MB"

    per = "n/a" if f["bytes_per_episode"] is None else f"{f['bytes_per_episode']:.0f} B"
    return (f"memory: {f['env']} fitness path, P={f['pop_size']} B={f['num_rollouts']} T={f['num_env_steps']} on "
            f"{f['devices']} device(s): XLA temp+output {mb(f['xla_bytes'])} ({per} per episode), peak RSS growth "
            f"over one run {mb(f['rss_growth_bytes'])}; fits in {f['target_mb']:.0f} MB: "
            f"{'PASS' if f['passed'] else 'FAIL'}\n"
            f"memory over T: {g['env']} fitness path, P={g['pop_size']} B={g['num_rollouts']}: XLA temp+output "
            + ", ".join(f"T={t} {mb(b)}" for t, b in zip(g["num_env_steps"], g["xla_bytes"]))
            + f"; does not grow with T: {'PASS' if g['passed'] else 'FAIL'}")


def time_interleaved(compiled: dict[str, Any], args: tuple, repeats: int) -> dict[str, list[float]]:
    """`repeats` timed calls of each program, taken in turns (one call of each, then the next
    round), so a load change on a shared machine falls on every row alike. A program whose last
    call took under `REWARM_S` is first called once untimed, so it is timed warm as an ES loop's
    back-to-back calls run, not right after another row's long program (Breakout's 25 ms call
    ran 35-45 ms right after gymnax's 3 s one or a second's idling)."""
    times: dict[str, list[float]] = {name: [] for name in compiled}
    for _ in range(repeats):
        for name, fn in compiled.items():
            if not times[name] or times[name][-1] < REWARM_S:
                jax.block_until_ready(fn(*args))
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - t0)
    return times
