"""`popeval bench` (`popeval.bench`): times popeval's own fitness path, in-process, at tiny sizes."""

from __future__ import annotations

import json

from popeval import bench, cli


def test_bench_prints_and_writes_its_timing(tmp_path, capsys):
    out = tmp_path / "nested" / "bench.json"
    argv = ["bench", "--env", "CartPole-v1", "--pop_size", "4", "--num_rollouts", "2", "--num_env_steps", "20",
            "--hidden", "4", "--repeats", "2", "--json", str(out)]
    assert cli.main(argv) == 0
    r = json.loads(out.read_text())
    assert (r["env"], r["pop_size"], r["num_rollouts"], r["num_env_steps"], r["hidden"], r["repeats"]) == (
        "CartPole-v1", 4, 2, 20, 4, 2)
    assert 0 < r["env_steps"] <= 4 * 2 * 20
    assert r["compile_s"] > 0 and r["time_s"] > 0 and r["devices"] >= 1
    assert abs(r["steps_per_s"] - r["env_steps"] / r["time_s"]) <= 1e-9 * r["steps_per_s"]
    assert r["load_average"] is None or len(r["load_average"]) == 3
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:3] == ["env", "P", "B"] and printed[1].split()[:4] == ["CartPole-v1", "4", "2", "20"]
    assert "load average" in printed[2]


def test_bench_defaults_are_the_documented_ones():
    defaults = cli._parser().parse_args(["bench"])
    assert (defaults.env, defaults.pop_size, defaults.num_rollouts, defaults.num_env_steps, defaults.hidden,
            defaults.repeats, defaults.json) == ("CartPole-v1", 256, 8, None, 32, 3, None)
    assert bench.bench.__defaults__[:6] == ("CartPole-v1", 256, 8, None, 32, 3)


def test_bench_rejects_bad_sizes_and_the_old_benchmark_options(capsys):
    assert cli.main(["bench", "--pop_size", "0"]) == 2
    assert "pop_size, num_rollouts, hidden and repeats must be >= 1" in capsys.readouterr().err
    assert cli.main(["bench", "--max-mem-mb", "10"]) == 2
    assert "unrecognised arguments: --max-mem-mb 10" in capsys.readouterr().err
