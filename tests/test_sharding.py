"""Sharding invariance: 1, 2 and 4 devices give bit-identical runs.

Each device count runs in a fresh interpreter with `JAX_NUM_CPU_DEVICES` set before JAX is
imported. Two tiny configs, both with pop_size=10, which 4 devices split as 3+3+3+1
(padding): OpenAI-ES with common random numbers on Pendulum (continuous returns, so any
rounding difference shows in the fitness), and CMA-ES on CartPole with per-member episode
keys and observation normalisation (statistics merged across devices). The per-generation
metrics, the whole final checkpoint (strategy state, key, best parameters, observation
statistics) and the final evaluations must be identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import read_metrics, subprocess_env

from popeval import checkpoint

DEVICE_COUNTS = (1, 2, 4)
TINY = dict(
    env_kwargs={"max_steps_in_episode": 50}, pop_size=10, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
)
CONFIGS = {
    "openai_es": {**TINY, "env_name": "Pendulum-v1", "strategy": "openai_es"},
    "cma_es_obs_norm": {**TINY, "env_name": "CartPole-v1", "strategy": "cma_es", "obs_normalization": True,
                        "common_random_numbers": False, "seed": 3},
}
RESULT_KEYS = ("generations", "env_steps", "best_fitness", "mean_policy_return", "best_policy_return")

SCRIPT = textwrap.dedent("""
    import json, sys
    from popeval.strategies import EvolveConfig, RunOptions, evolve
    for name, config in json.loads(sys.argv[1]).items():
        evolve(EvolveConfig(**config), RunOptions(run_dir=name, wandb="disabled", progress=False))
""")


def flatten(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flatten(sub, f"{prefix}/{key}").items()}
    return {prefix: np.asarray(tree)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`{devices: directory}`: the configs run once per device count (processes in parallel)."""
    env = subprocess_env()
    dirs, procs = {}, {}
    for n in DEVICE_COUNTS:
        dirs[n] = tmp_path_factory.mktemp(f"devices{n}")
        procs[n] = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, json.dumps(CONFIGS)], cwd=dirs[n],
            env={**env, "JAX_NUM_CPU_DEVICES": str(n)}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
    for n, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{n} device(s):\n{out}"
    return dirs


@pytest.mark.parametrize("name", CONFIGS)
def test_devices_used_as_asked(runs, name):
    for n, root in runs.items():
        assert json.loads((root / name / "result.json").read_text())["devices"] == n


@pytest.mark.parametrize("name", CONFIGS)
def test_metrics_identical_across_device_counts(runs, name):
    def rows(n):
        return read_metrics(runs[n] / name, timing=False)

    reference = rows(1)
    assert len(reference) == TINY["num_generations"]
    assert len({r["fitness/mean"] for r in reference}) > 1  # the runs do something
    for n in DEVICE_COUNTS[1:]:
        assert rows(n) == reference, f"{n} devices"
    results = {n: json.loads((runs[n] / name / "result.json").read_text()) for n in DEVICE_COUNTS}
    for n in DEVICE_COUNTS[1:]:
        assert {k: results[n][k] for k in RESULT_KEYS} == {k: results[1][k] for k in RESULT_KEYS}


@pytest.mark.parametrize("name", CONFIGS)
def test_checkpoint_identical_across_device_counts(runs, name):
    def arrays(n):
        return flatten(checkpoint.load_state_dict(runs[n] / name))

    reference = arrays(1)
    if CONFIGS[name].get("obs_normalization"):
        counts = [v for k, v in reference.items() if k.startswith("/obs_stats") and k.endswith("count")]
        assert counts and float(counts[0]) > 0, sorted(reference)  # statistics were gathered
    for n in DEVICE_COUNTS[1:]:
        other = arrays(n)
        assert other.keys() == reference.keys()
        for k in reference:
            if k.startswith("/obs_stats") and np.asarray(reference[k]).dtype.kind == "f":
                # XLA:CPU contracts multiply-adds into FMAs per compiled program, and the
                # per-device batch size changes the program: observations (hence their
                # statistics) may differ in the last bit across device counts. Fitness,
                # strategy state and parameters are compared exactly below. (A mean near 0
                # needs the absolute tolerance: one ulp of the sum is ~1e-8 of it.)
                np.testing.assert_allclose(other[k], reference[k], rtol=1e-6, atol=1e-7, err_msg=f"{k}, {n} devices")
            else:
                np.testing.assert_array_equal(other[k], reference[k], err_msg=f"{k}, {n} devices")


def test_replicated_state_round_trips_through_the_devices():
    """`replicate` -> a call -> `first` keeps every leaf (typed PRNG keys included) exactly."""
    import jax

    from popeval import sharding

    step = sharding.Replicated(lambda tree, seed: (tree, {"seed": seed}), jax.local_device_count())
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int32(7), "key": jax.random.key(5)}
    out, metrics = step(step.replicate(tree), step.replicate(np.int32(3)))
    back = step.first(out)
    np.testing.assert_array_equal(back["w"], tree["w"])
    assert back["n"] == 7 and back["n"].dtype == np.int32
    np.testing.assert_array_equal(jax.random.key_data(back["key"]), jax.random.key_data(tree["key"]))
    assert np.asarray(metrics["seed"]).tolist() == [3] * jax.local_device_count()


def test_compiler_options_on_cpu_and_an_xla_flags_override():
    script = "from popeval import compiler; print(compiler.options())"
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu"}
    default = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert default.stdout.strip() == "{'xla_backend_optimization_level': 1}", default.stderr
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=3"
    chosen = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert chosen.stdout.strip() == "{}", chosen.stderr
