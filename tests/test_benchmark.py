"""`popeval bench --quick` (= `experiments/benchmark.py --quick`) runs and writes the JSON it
documents (no speed asserts)."""

from __future__ import annotations

import json


ROW_KEYS = {"env", "pop_size", "num_rollouts", "num_env_steps", "impl", "compile_s", "time_s", "times_s",
            "mem_bytes", "env_steps", "steps_per_s", "speedup_vs_gymnax"}
MEMORY_KEYS = {"env", "pop_size", "num_rollouts", "num_env_steps", "target_mb", "fitness_xla_mb",
               "fitness_xla_temp_bytes", "fitness_xla_output_bytes", "trajectory_xla_mb",
               "trajectory_xla_temp_bytes", "trajectory_xla_output_bytes",
               "fitness_rss_growth_mb", "fitness_peak_rss_growth_mb", "fitness_min_length", "passed"}


def load_benchmark():
    from popeval import benchmark

    return benchmark


def test_quick_benchmark_writes_json(tmp_path, capsys):
    bench = load_benchmark()
    out = tmp_path / "nested" / "bench.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"config", "machine", "columns", "results", "memory_check"}
    assert report["config"]["quick"] is True and report["config"]["envs"] == ["CartPole-v1"]

    rows = report["results"]
    assert [r["impl"] for r in rows] == list(bench.IMPLS)  # gymnax and evosax are test deps
    for r in rows:
        assert set(r) == ROW_KEYS, r["impl"]
        assert r["env"] == "CartPole-v1" and r["pop_size"] == 8 and r["num_rollouts"] == 2
        assert r["num_env_steps"] == 50 and len(r["times_s"]) == 1
        assert r["time_s"] > 0 and r["compile_s"] > 0 and r["mem_bytes"] > 0
        assert 0 < r["env_steps"] <= 8 * 2 * 50, r
        assert abs(r["steps_per_s"] - r["env_steps"] / r["time_s"]) < 1e-6 * r["steps_per_s"]
    by_impl = {r["impl"]: r for r in rows}
    assert by_impl["gymnax RolloutWrapper"]["speedup_vs_gymnax"] == 1.0
    # Both popeval paths play the same episodes: the same number of steps before done.
    assert by_impl["popeval fitness"]["env_steps"] == by_impl["popeval trajectory"]["env_steps"]

    mem = report["memory_check"]
    assert set(mem) == MEMORY_KEYS
    assert mem["passed"] is True and mem["fitness_min_length"] == mem["num_env_steps"]
    assert mem["fitness_xla_mb"] > 0

    printed = capsys.readouterr().out
    assert "x gymnax" in printed and "memory check" in printed and str(out) in printed
