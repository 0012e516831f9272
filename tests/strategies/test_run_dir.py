"""Run directories that never get stuck: restarts and resumes after any stop, one process at a
time, damaged files repaired or refused by name, diverging strategies stopped, completed runs
left alone, cumulative time. Tiny CartPole runs (episodes capped at 50 steps)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from popeval import checkpoint
from popeval.sinks import CSVSink, LogSink
from popeval.strategies import EvolveConfig, RunOptions, evolve, make_strategy, openai_es
from popeval.strategies.run.run_dir import Lock, load_policy
from tests.helpers import REPO, read_metrics, subprocess_env

TINY = dict(
    env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 50}, pop_size=8, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
)
QUIET = dict(wandb="disabled", progress=False)


def snapshot(directory):
    return {p.relative_to(directory): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(directory.rglob("*")) if p.is_file()}


class Failing:
    """A sink that fails when the run starts (before the first checkpoint)."""

    def start(self, info):
        raise RuntimeError("out of memory")

    def log(self, step, metrics):
        pass

    def close(self):
        pass


def test_a_run_stopped_before_its_first_checkpoint_restarts_or_resumes(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # made by the user: a failed run leaves it as a run (one it made is removed)
    with pytest.raises(RuntimeError, match="out of memory"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET), sinks=[Failing()])
    assert (run_dir / "config.json").is_file() and not checkpoint.exists(run_dir)
    # Started again over the same directory ...
    fresh = evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    assert fresh["generations"] == 4
    # ... or resumed, which starts from generation 0.
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(RuntimeError):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(other), **QUIET), sinks=[Failing()])
    resumed = evolve(None, RunOptions(resume=str(other), **QUIET))
    assert resumed["generations"] == 4
    assert read_metrics(other, timing=False) == read_metrics(run_dir, timing=False)


def test_a_checkpoint_without_its_json_still_resumes(tmp_path):
    run_dir = tmp_path / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    (run_dir / "checkpoint.json").unlink()
    out = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(run_dir), **QUIET))
    assert out["generations"] == 6 and [int(r["generation"]) for r in read_metrics(run_dir)] == list(range(1, 7))


def test_resuming_with_fewer_generations_than_run_is_refused_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(ValueError, match="num_generations 2 is below the 4 generations the run has run"):
        evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 2}), RunOptions(resume=str(run_dir), **QUIET))
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_a_run_without_the_result_of_its_last_generation_runs_only_its_final_evaluation(tmp_path):
    """Killed after its last checkpoint (no `result.json`), or stopped at a checkpoint and
    shortened to it (a `result.json` of an earlier generation): resuming writes the result the
    uninterrupted run wrote, and runs no generation."""
    run_dir = tmp_path / "run"
    first = evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    rows = read_metrics(run_dir, timing=False)
    (run_dir / "result.json").unlink()
    again = evolve(None, RunOptions(resume=str(run_dir), **QUIET))
    same = ("generations", "env_steps", "mean_policy_return", "best_policy_return", "best_fitness")
    assert {k: again[k] for k in same} == {k: first[k] for k in same}
    assert json.loads((run_dir / "result.json").read_text())["mean_policy_return"] == first["mean_policy_return"]
    assert read_metrics(run_dir, timing=False) == rows
    stale = (run_dir / "result.json").read_text()
    longer = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(run_dir), **QUIET))
    (run_dir / "result.json").write_text(stale)
    finished = evolve(None, RunOptions(resume=str(run_dir), **QUIET))
    assert {k: finished[k] for k in same} == {k: longer[k] for k in same} and finished["generations"] == 6


def test_a_second_process_is_refused_and_a_dead_ones_lock_is_not_in_the_way(tmp_path):
    run_dir = tmp_path / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    holder = Lock(run_dir)
    try:
        with pytest.raises(ValueError, match="in use by another popeval process"):
            evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(run_dir), **QUIET))
    finally:
        holder.release()
    # A process killed while holding the lock: the kernel releases it.
    code = (f"from pathlib import Path\nfrom popeval.strategies.run.run_dir import Lock\nLock(Path({str(run_dir)!r}))\n"
            "import os; os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(), timeout=120)
    out = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(run_dir), **QUIET))
    assert out["generations"] == 6


def test_a_partial_metrics_row_is_repaired_on_resume(tmp_path):
    run_dir = tmp_path / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    with open(run_dir / "metrics.csv", "a") as f:
        f.write("-")  # what a full disk leaves
    evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(run_dir), **QUIET))
    rows = read_metrics(run_dir)
    assert [int(r["generation"]) for r in rows] == list(range(1, 7))
    assert all(None not in r.values() for r in rows)


def test_a_corrupted_checkpoint_is_refused_by_name(tmp_path):
    run_dir = tmp_path / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    data = bytearray((run_dir / "checkpoint.msgpack").read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in the state
    (run_dir / "checkpoint.msgpack").write_bytes(bytes(data))
    before = snapshot(run_dir)
    with pytest.raises(ValueError, match="checkpoint.msgpack: corrupted"):
        evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(run_dir), **QUIET))
    assert snapshot(run_dir) == before


def test_a_diverging_strategy_stops_the_run_and_result_json_stays_json(tmp_path):
    run_dir = tmp_path / "run"
    config = EvolveConfig.from_flat(**{**TINY, "strategy_kwargs": {"learning_rate": 0.05, "std_init": 3.0e38}})
    out = evolve(config, RunOptions(run_dir=str(run_dir), **QUIET))
    assert "non-finite" in out["stopped"]
    rows = read_metrics(run_dir)
    assert int(rows[-1]["nonfinite/state"]) > 0
    strict = json.loads((run_dir / "result.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert strict["stopped"] == out["stopped"]
    assert not checkpoint.exists(run_dir)  # it diverged at generation 1: nothing finite to keep


def test_a_run_that_diverges_later_keeps_its_last_finite_checkpoint(tmp_path):
    import jax

    run_dir = tmp_path / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    # The same run, its saved experiment edited to a search std that overflows float32.
    diverging = {"learning_rate": 0.05, "std_init": 3.0e38}
    saved = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**saved, "strategy_kwargs": diverging}))
    state_dict, meta = checkpoint.read(run_dir)
    del meta["config_sha256"]  # as an earlier version saved it: the edit cannot be detected
    checkpoint.save(run_dir, state_dict, meta)
    out = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 8, "strategy_kwargs": diverging}),
                 RunOptions(resume=str(run_dir), **QUIET))
    kept_generation = out["generations"]
    assert f"non-finite at generation {kept_generation + 1}" in out["stopped"] and 4 <= kept_generation < 8
    assert checkpoint.load_meta(run_dir)["generation"] == kept_generation
    kept = load_policy(run_dir, "mean").params
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(kept))


def test_resuming_a_run_that_reached_its_target_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    config = EvolveConfig.from_flat(**{**TINY, "num_generations": 20, "target": 5.0, "stop_at_target": True})
    first = evolve(config, RunOptions(run_dir=str(run_dir), **QUIET))
    assert first["generations"] < 20 and first["solved_at"] is not None
    before = snapshot(run_dir)
    again = evolve(None, RunOptions(resume=str(run_dir), **QUIET))
    assert snapshot(run_dir) == before and again["generations"] == first["generations"]
    # Raising num_generations continues it (past the target, which it reached already).
    more = evolve(EvolveConfig.from_flat(**{**config.to_dict(), "num_generations": 23}),
                  RunOptions(resume=str(run_dir), **QUIET))
    assert more["generations"] == 23


def test_time_columns_are_cumulative_over_resumptions(tmp_path):
    run_dir = tmp_path / "run"
    first = evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    second = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(run_dir), **QUIET))
    elapsed = [float(r["time/elapsed"]) for r in read_metrics(run_dir)]
    assert elapsed == sorted(elapsed) and elapsed[4] > elapsed[3]
    assert second["wall_seconds"] > first["wall_seconds"]


def test_a_full_disk_gives_one_line_and_leaves_no_litter(tmp_path):
    """Files may not grow past 20 KB (RLIMIT_FSIZE): the first checkpoint fails to write."""
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps({**TINY, "hidden_sizes": [64, 64], "num_generations": 4}))
    script = textwrap.dedent("""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        from popeval.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    out = subprocess.run([sys.executable, "-c", script, "evolve", "--config", str(config), "--run_dir", "run",
                          "--quiet", "--wandb", "disabled"], cwd=tmp_path,
                         env=subprocess_env(JAX_COMPILATION_CACHE_DIR=""),  # the limit would hit the cache too
                         capture_output=True, text=True, timeout=300)
    errors = [line for line in out.stderr.splitlines() if "rror" in line or "fail" in line or "arning" in line]
    assert out.returncode == 2 and len(errors) == 1 and "File too large" in errors[0], out.stderr
    assert errors[0].startswith("popeval evolve: error: ") and "Traceback" not in out.stderr
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_strategy_settings_whose_sign_matters_are_checked():
    solution = {"w": np.zeros(4, np.float32)}
    for bad in ({"learning_rate": -0.1}, {"std_init": 0.0}, {"std_decay": 1.5}, {"std_min": -1.0},
                {"learning_rate": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_strategy("openai_es", 8, solution, **bad)


def test_make_strategy_and_the_factories_share_one_set_of_defaults():
    import jax

    solution = {"w": np.zeros(4, np.float32)}
    key = jax.random.key(0)
    a = make_strategy("openai_es", 8, solution).init(key, solution)
    b = openai_es(8, solution).init(key, solution)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(x) if x.dtype == jax.random.key(0).dtype else x),
                                      np.asarray(jax.random.key_data(y) if y.dtype == jax.random.key(0).dtype else y))
    population, _ = make_strategy("openai_es", 8, solution).ask(key, a)
    assert 0.01 < float(np.std(population["w"])) < 0.5  # std 0.1, not evosax's 1.0


def test_progress_is_logged_when_output_is_not_a_terminal(caplog):
    sink = LogSink(every_seconds=3600)
    metrics = {"fitness/mean": 1.0, "fitness/max": 2.0, "best/fitness": 2.0, "steps/per_second": 10.0,
               "time/elapsed": 1.0}
    from popeval.sinks import RunInfo

    with caplog.at_level(logging.INFO, logger="popeval"):
        sink.start(RunInfo(None, "r", "t", {}, 0, 5, {}))
        for g in range(1, 4):
            sink.log(g, metrics)
        sink.close()  # the run stopped at generation 3: its last line is written
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("compiling generation 1/5")  # before the first generation's long wait
    assert [line.split(":")[0] for line in lines[1:]] == ["generation 1/5", "generation 3/5"]


def test_eval_and_render_default_to_the_mean_policy(tmp_path):
    run_dir = tmp_path / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    assert load_policy(run_dir).which == "mean"


def test_wandb_mode_from_the_environment_is_honoured(monkeypatch):
    from popeval.sinks import wandb_mode

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "disabled" and wandb_mode("offline") == "offline"


def test_wandb_never_holds_up_the_loop(tmp_path, monkeypatch):
    """W&B's start blocks until the run has logged every generation: the loop went on."""
    import threading

    import wandb

    release, seen = threading.Event(), []

    class Recorder(CSVSink):
        def log(self, step, metrics):
            seen.append(step)
            super().log(step, metrics)
            if step == TINY["num_generations"]:
                release.set()

    def slow_init(*args, **kwargs):
        assert release.wait(120), "the loop waited for W&B"
        raise RuntimeError("no network")

    monkeypatch.setattr(wandb, "init", slow_init)
    from popeval.sinks import WandbSink

    out = evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(tmp_path / "run"), progress=False),
                 sinks=[WandbSink("online"), Recorder()])
    assert out["generations"] == 4 and seen == [1, 2, 3, 4]


def test_ctrl_c_says_what_was_saved_and_how_to_resume(tmp_path):
    import signal
    import time

    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps({**TINY, "num_generations": 100000, "checkpoint_every": 2}))
    # A Python started with SIGINT ignored (as xdist's workers start children) keeps ignoring it:
    # the child puts Python's own handler back before it runs `python -m popeval`.
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "sys.argv[0] = 'popeval'; runpy.run_module('popeval', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", start, "evolve", "--config", str(config), "--run_dir=run",
                             "--quiet", "--wandb=disabled"], cwd=tmp_path, env=subprocess_env(JAX_NUM_CPU_DEVICES="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.csv"
    deadline = time.monotonic() + 300
    try:
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 6):
            assert proc.poll() is None and time.monotonic() < deadline, "no 5 generations in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # a 100,000-generation run never outlives the test
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    saved = checkpoint.load_meta(tmp_path / "run")["generation"]
    assert "Traceback" not in err and f"saved generation {saved}; resume with popeval evolve --resume run" in last


def test_fitness_plot_shows_the_target_and_is_not_squashed_by_one_diverging_member(tmp_path):
    from popeval.sinks import plot_fitness

    rows = ["generation,fitness/min,fitness/max,fitness/mean,best/fitness,eval/return,eval/best_return"]
    for g in range(1, 21):
        worst = -1e9 if g == 3 else -200.0 + g  # one member diverged in generation 3
        rows.append(f"{g},{worst},{-100 + g},{-150 + g},{-100 + g},{'nan' if g % 5 else -140 + g},nan")
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    low, high = plot_fitness(tmp_path / "metrics.csv", tmp_path / "fitness.png", "t", target=-50.0)
    assert -160 < low < -149 and -50 < high < -40  # the curves and the target, not -1e9
    assert (tmp_path / "fitness.png").read_bytes()[:4] == b"\x89PNG"


def test_out_of_memory_is_one_line_with_a_hint():
    from popeval.cli import _one_line

    assert _one_line(MemoryError()).startswith("out of memory")
    assert "smaller pop_size" in _one_line(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 GiB"))


def test_a_run_directory_saved_with_flat_config_keys_resumes_as_it_would_have(tmp_path):
    """`tests/data/run_saved_by_0_1`: a 2-generation CartPole run saved by popeval before its
    config had sections (flat keys in config.json and in checkpoint.json's experiment). It loads,
    resumes to 4 generations, and plays the generations that version played when resumed
    (`run_saved_by_0_1.resumed_to_4.csv`, all but the timing columns)."""
    import csv
    import shutil

    from popeval.strategies import load_config
    from popeval.strategies.run.run_dir import read_config

    data = REPO / "tests" / "data"
    run_dir = tmp_path / "run"
    shutil.copytree(data / "run_saved_by_0_1", run_dir)
    flat = json.loads((run_dir / "config.json").read_text())
    assert read_config(run_dir) == load_config(None, flat) and read_config(run_dir).to_dict() == flat
    summary = evolve(read_config(run_dir, {"num_generations": 4}), RunOptions(resume=str(run_dir), **QUIET))
    assert summary["generations"] == 4

    def rows(path):
        with open(path) as f:
            return [{k: v for k, v in r.items() if not k.startswith(("time/", "steps/per_second"))}
                    for r in csv.DictReader(f)]

    assert rows(run_dir / "metrics.csv") == rows(data / "run_saved_by_0_1.resumed_to_4.csv")
