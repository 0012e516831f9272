"""Craftax-Classic as Craftax reports it: reward and achievements, for controllers and a random policy.

    python -m experiments.zoo craftax_eval [RUN_DIR ...] [--episodes 64] [--seed 12345] [--out FILE] [--figure PNG]

Plays each run's mean policy (and a policy of uniformly random actions) on the same fresh
episodes, to the game's own 10,000-step limit, and prints per policy the mean episode
reward, the mean number of achievements unlocked (of 22), the episode length and how often
each achievement was unlocked. The episodes are `popeval eval`'s: the same keys
(`--seed`), reset and step keys, so the reward equals `popeval eval RUN --num_env_steps=10000`'s.
`--figure` draws the runs' learning curves (their `metrics.csv`) against environment steps,
with the random policy's reward. Needs the suites extra (`pip install 'popeval[suites]'`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from popeval import keys as keys_lib
from popeval import make

ENV_ID = "craftax/Craftax-Classic-Symbolic-v1"
LIMIT = 10_000


def play(env, env_params, act: Callable, keys: jax.Array) -> dict[str, np.ndarray]:
    """Episodes of `act(key, obs) -> action` from `keys` (B,), each to its `done`: the reward, the
    length and the achievements (B, 22) of its last state, as popeval's rollouts play them."""
    def episode(key):
        key_reset, key_episode = keys_lib.split_episode(key)
        obs, state = env.reset(key_reset, env_params)

        def body(carry):
            t, obs, state, ret, _, achieved = carry
            key_policy, key_env = keys_lib.step_keys(key_episode, t)
            obs, state, reward, done, _ = env.step_env(key_env, state, act(key_policy, obs), env_params)
            return t + 1, obs, state, ret + reward, done, state.inner.achievements

        init = (jnp.int32(0), obs, state, jnp.float32(0.0), jnp.bool_(False), state.inner.achievements)
        t, _, _, ret, _, achieved = jax.lax.while_loop(lambda c: ~c[4] & (c[0] < LIMIT), body, init)
        return {"reward": ret, "length": t, "achievements": achieved}

    return jax.tree.map(np.asarray, jax.jit(jax.vmap(episode))(keys))


def summary(name: str, out: dict[str, np.ndarray]) -> dict:
    from craftax.craftax_classic.constants import Achievement

    rates = out["achievements"].mean(0)
    return {"policy": name, "episodes": len(out["reward"]), "mean_reward": float(out["reward"].mean()),
            "std_reward": float(out["reward"].std()), "mean_achievements": float(out["achievements"].sum(1).mean()),
            "mean_length": float(out["length"].mean()), "max_length": int(out["length"].max()),
            "achievement_rates": {a.name.lower(): float(rates[a.value]) for a in Achievement if rates[a.value] > 0}}


def figure(runs: list[Path], random_reward: float, path: Path) -> None:
    """The runs' population mean fitness and mean-policy evaluations against env steps."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, run in enumerate(runs):
        with open(run / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        steps = np.array([float(r["steps/env_total"]) for r in rows]) / 1e6
        fitness = np.array([float(r["fitness/mean"]) for r in rows])
        evals = np.array([float(r["eval/return"] or "nan") for r in rows])
        seed = json.loads((run / "config.json").read_text())["seed"]
        ax.plot(steps, fitness, lw=0.6, alpha=0.5, color=f"C{i}")
        ax.plot(steps[np.isfinite(evals)], evals[np.isfinite(evals)], "o-", ms=2, lw=1.2, color=f"C{i}",
                label=f"seed {seed}: mean policy")
    ax.axhline(random_reward, color="grey", ls="--", lw=0.8, label="random policy")
    ax.set_xlabel("environment steps (millions)")
    ax.set_ylabel("episode reward")
    ax.set_title("Craftax-Classic: SNES (thin lines: population mean fitness)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.zoo craftax_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", type=Path, help="run directories or controllers of " + ENV_ID)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--seed", type=int, default=12345, help="the fresh episodes' seed (popeval eval's default)")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    p.add_argument("--figure", type=Path, default=None, help="draw the runs' learning curves here (PNG)")
    args = p.parse_args(argv)
    keys = jax.random.split(jax.random.key(args.seed), args.episodes)
    env, env_params = make(ENV_ID)
    env_params = env_params.replace(max_steps_in_episode=LIMIT)
    num_actions = env.action_space(env_params).n
    results = [summary("random", play(env, env_params, lambda k, o: jax.random.randint(k, (), 0, num_actions),
                                      keys))]
    from popeval.strategies import load_policy

    for run in args.runs:
        saved = load_policy(run, "mean")
        act = partial(lambda policy, params, k, o: policy.apply(params, o, k), saved.run.policy, saved.params)
        results.append(summary(str(run), play(env, env_params, act, keys)))
    for r in results:
        print(f"{r['policy']}: reward {r['mean_reward']:.2f} +- {r['std_reward']:.2f}, achievements "
              f"{r['mean_achievements']:.2f} of 22, length {r['mean_length']:.0f} (max {r['max_length']}), "
              f"rates {r['achievement_rates']}")
    if args.figure is not None:
        figure(args.runs, results[0]["mean_reward"], args.figure)
    if args.out is not None:
        args.out.write_text(json.dumps({"env": ENV_ID, "seed": args.seed, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
