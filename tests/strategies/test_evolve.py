"""The evolve loop: compile once, checkpoints and exact resumption, bad input, logging sinks.

Tiny CartPole runs (episodes capped at 50 steps). The exact-resume test drives the real
command line: it SIGKILLs a run mid-way and resumes it.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import wandb
import yaml
from PIL import Image

from popeval import checkpoint
from popeval.strategies import EvolveConfig, RunOptions, evolve, load_config
from tests.helpers import read_metrics, subprocess_env

TINY = dict(
    env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 50}, pop_size=8, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
)
QUIET = dict(wandb="disabled", progress=False)
REQUIRED_COLUMNS = ["fitness/max", "fitness/mean", "fitness/min", "fitness/std", "best/fitness",
                    "eval/return", "steps/env_total", "steps/per_second", "nonfinite/count"]


def checkpoint_arrays(run_dir: Path) -> dict[str, np.ndarray]:
    """Every array of the checkpoint (strategy state, key, best params, ...), by path."""
    tree = checkpoint.load_state_dict(run_dir)
    flat = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}/{k}")
        else:
            flat[prefix] = np.asarray(node)

    walk(tree, "")
    return flat


def assert_same_checkpoint(a: Path, b: Path) -> None:
    arrays_a, arrays_b = checkpoint_arrays(a), checkpoint_arrays(b)
    assert arrays_a.keys() == arrays_b.keys()
    for k in arrays_a:
        np.testing.assert_array_equal(arrays_a[k], arrays_b[k], err_msg=k)


def snapshot(directory: Path) -> dict:
    """Every file below `directory` with its mtime and bytes."""
    return {p.relative_to(directory): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(directory.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ one run, then its resumption
class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


class _Recorder:
    """A sink that keeps what the loop tells it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def start(self, info):
        self.calls.append(("start", info.start_generation, info.num_generations))

    def log(self, step, metrics):
        self.calls.append(("log", step, metrics["generation"]))

    def close(self):
        self.calls.append(("close",))


@pytest.fixture(scope="session")
def base_run(tmp_path_factory):
    """4 generations with `wandb.init` raising (W&B failure), then resumed to 6 generations with
    W&B offline."""
    run_dir = tmp_path_factory.mktemp("evolve") / "run"
    wandb_dir = tmp_path_factory.mktemp("wandb")

    def broken_init(*args, **kwargs):
        raise RuntimeError("no network")

    warnings = _Warnings()
    logger = logging.getLogger("popeval")
    logger.addHandler(warnings)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
                mp.setenv(var, str(wandb_dir))
            mp.setenv("WANDB_MODE", "offline")
            mp.setenv("WANDB_SILENT", "true")
            with mp.context() as failing:
                failing.setattr(wandb, "init", broken_init)
                first = evolve(EvolveConfig.from_flat(**TINY),
                               RunOptions(run_dir=str(run_dir), wandb="online", progress=False))
            first_warnings = list(warnings.messages)
            rows_before = read_metrics(run_dir)
            resumed = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}),
                             RunOptions(resume=str(run_dir), wandb="offline", progress=False))
    finally:
        logger.removeHandler(warnings)
    return dict(run_dir=run_dir, first=first, resumed=resumed, first_warnings=first_warnings,
                rows_before=rows_before)


@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_restored_state_has_the_compiled_programs_types(base_run):
    """The generation program is compiled once, ahead of time, for the initial state's types; a
    restored state must match them exactly (shape, dtype, weak type), or it could not be fed
    back (the resumed run above ran with it)."""
    import jax

    from popeval import checkpoint
    from popeval.strategies import build
    from popeval.strategies.run.programs import init_fn, init_state

    assert base_run["first"]["generations"] == 4 and base_run["resumed"]["generations"] == 6
    config = EvolveConfig.from_flat(**TINY)
    run = build(config)
    restored, meta = checkpoint.load(base_run["run_dir"], init_state(run, config))
    expected = jax.eval_shape(init_fn(run, config), np.int32(0))
    avals = lambda tree: jax.tree.map(lambda x: jax.typeof(x) if hasattr(jax, "typeof") else jax.core.get_aval(x), tree)  # noqa: E731
    assert avals(restored) == avals(expected)
    assert meta["generation"] == 6


def test_the_loop_starts_logs_and_closes_the_sinks_it_is_given(tmp_path):
    recorder = _Recorder()
    evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 3}), RunOptions(run_dir=str(tmp_path / "r")),
           sinks=[recorder])
    assert recorder.calls == [("start", 0, 3), ("log", 1, 1), ("log", 2, 2), ("log", 3, 3), ("close",)]
    assert not (tmp_path / "r" / "metrics.csv").exists()  # no sink, no CSV


def test_sinks_are_closed_when_the_run_fails(tmp_path):
    class Failing(_Recorder):
        def log(self, step, metrics):
            super().log(step, metrics)
            raise RuntimeError("disk full")

    failing = Failing()
    with pytest.raises(RuntimeError, match="disk full"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(tmp_path / "r")), sinks=[failing])
    assert failing.calls[-1] == ("close",)
    assert threading_helpers_alive() == []


def threading_helpers_alive() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("popeval-startup")]


@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_wandb_failure_warns_once_and_the_run_completes(base_run):
    msgs = base_run["first_warnings"]
    assert len(msgs) == 1 and "W&B" in msgs[0] and "no network" in msgs[0], msgs
    assert len(base_run["rows_before"]) == 4


@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_wandb_offline_run_holds_the_logged_metrics(base_run):
    runs = list((base_run["run_dir"] / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs
    data = runs[0].read_bytes()
    for row in read_metrics(base_run["run_dir"])[4:]:  # generations 5 and 6 were logged offline
        value = repr(float(row["fitness/mean"])).encode()
        assert re.search(re.escape(b"fitness/mean") + rb".{1,8}?" + re.escape(value), data, re.S), value


@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_metrics_csv_and_plot(base_run):
    run_dir = base_run["run_dir"]
    rows = read_metrics(run_dir)
    assert set(REQUIRED_COLUMNS) <= set(rows[0]), sorted(rows[0])
    assert [int(r["generation"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    # Resuming kept the rows before the checkpoint, but for the 4-generation run's final
    # evaluation in its last row: the run went on, and the final evaluation is in row 6.
    finals = ("eval/final_return", "eval/final_best_return")
    drop = lambda rs: [{k: v for k, v in r.items() if k not in finals} for r in rs]  # noqa: E731
    assert drop(rows[:4]) == drop(base_run["rows_before"])
    assert base_run["rows_before"][3][finals[0]] != "nan" and rows[3][finals[0]] == "nan" != rows[5][finals[0]]
    f = {k: np.array([float(r[k]) for r in rows]) for k in REQUIRED_COLUMNS}
    assert np.all(f["fitness/min"] <= f["fitness/mean"]) and np.all(f["fitness/mean"] <= f["fitness/max"])
    assert np.all((f["fitness/min"] >= 1) & (f["fitness/max"] <= 50))  # episodes capped at 50 steps
    assert np.all(np.diff(f["best/fitness"]) >= 0) and np.all(f["best/fitness"] >= f["fitness/max"])
    assert np.all(np.diff(f["steps/env_total"]) > 0) and np.all(f["nonfinite/count"] == 0)
    assert np.all(f["steps/per_second"] > 0)
    evaluated = ~np.isnan(f["eval/return"])
    assert evaluated.tolist() == [False, True] * 3  # eval_every=2
    best = np.array([float(r["eval/best_return"]) for r in rows])
    assert (~np.isnan(best)).tolist() == evaluated.tolist()
    assert np.all((best[evaluated] >= 1) & (best[evaluated] <= 50))
    assert run_dir.joinpath("fitness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(run_dir / "fitness.png") as image:
        image.verify()
        assert image.size[0] > 100 and image.size[1] > 100
    result = json.loads((run_dir / "result.json").read_text())
    assert result["generations"] == 6 and result["env_steps"] == int(f["steps/env_total"][-1])


def test_a_kill_between_the_two_checkpoint_files_resumes_consistently(tmp_path):
    """`checkpoint.msgpack` is the commit point: with a `checkpoint.json` one checkpoint behind
    (a kill between the two atomic writes), the state's own counters win."""
    state = {"w": np.arange(3, dtype=np.float32), "generation": np.int32(6)}
    checkpoint.save(tmp_path, {**state, "generation": np.int32(4)},
                    {"generation": 4, "env_steps": 400, "wandb_id": "abc", "solved_at": None})
    stale = (tmp_path / "checkpoint.json").read_bytes()
    checkpoint.save(tmp_path, state, {"generation": 6, "env_steps": 600, "wandb_id": "abc", "solved_at": None})
    (tmp_path / "checkpoint.json").write_bytes(stale)
    restored, meta = checkpoint.load(tmp_path, {"w": np.zeros(3, np.float32), "generation": np.int32(0)})
    assert meta == {"generation": 6, "env_steps": 600, "wandb_id": "abc", "solved_at": None}
    assert int(restored["generation"]) == 6 and checkpoint.load_meta(tmp_path) == meta


# ------------------------------------------------------------------ bad input
def test_invalid_configs_raise_and_write_nothing(tmp_path):
    run_dir = tmp_path / "run"
    for bad, match in [({"strategy": "cma_ess"}, "CMA_ES"), ({"env_name": "CartPol-v1"}, "CartPole-v1"),
                       ({"pop_size": 7}, "even"),
                       ({"strategy": "cma_es", "sharded_sampling": True}, "CMA_ES cannot sample its members")]:
        with pytest.raises(ValueError, match=match):
            evolve(EvolveConfig.from_flat(**{**TINY, **bad}), RunOptions(run_dir=str(run_dir), **QUIET))
        assert not run_dir.exists() or not any(run_dir.iterdir()), bad
    with pytest.raises(ValueError, match="pop_size must be >= 2"):
        EvolveConfig.from_flat(**{**TINY, "pop_size": 1})


def test_unknown_and_mistyped_config_keys_are_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**TINY, "pop_sise": 8}))
    with pytest.raises(ValueError, match="'pop_sise'.*'pop_size'"):
        load_config(path)
    path.write_text(yaml.safe_dump({**TINY, "pop_size": "many"}))
    with pytest.raises(TypeError, match="'pop_size'"):
        load_config(path)
    path.write_text(yaml.safe_dump(TINY))
    with pytest.raises(TypeError, match="'num_generations'"):
        load_config(path, ["num_generations=lots"])
    with pytest.raises(ValueError, match="'no_such_key'"):
        load_config(path, ["--no-such-key=1"])
    assert load_config(path, ["--pop-size=16"]).strategy.pop_size == 16


def test_resume_from_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("not a run")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="not a popeval run"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(resume=str(tmp_path), **QUIET))
    assert snapshot(tmp_path) == before


@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_resume_with_another_config_and_reuse_of_a_run_dir_modify_nothing(base_run):
    run_dir = base_run["run_dir"]
    before = snapshot(run_dir)
    with pytest.raises(ValueError, match="pop_size"):
        evolve(EvolveConfig.from_flat(**{**TINY, "pop_size": 16}), RunOptions(resume=str(run_dir), **QUIET))
    with pytest.raises(ValueError, match="not empty"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    assert snapshot(run_dir) == before


# ------------------------------------------------------------------ exact resume after SIGKILL
def popeval_cli(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = subprocess_env(JAX_NUM_CPU_DEVICES="2")
    return subprocess.Popen([sys.executable, "-m", "popeval", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


def finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_a_resumed_run_equals_the_uninterrupted_one(base_run, tmp_path):
    """In one process: 4 generations, then resumed to 6, give the metrics and the checkpoint of
    6 at once (a killed process: `test_killed_run_resumes_exactly`, slow)."""
    full = tmp_path / "full"
    evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(run_dir=str(full), wandb="disabled",
                                                                      progress=False))
    resumed = read_metrics(base_run["run_dir"], timing=False)
    assert [int(r["generation"]) for r in resumed] == list(range(1, 7))
    assert resumed == read_metrics(full, timing=False)
    assert_same_checkpoint(base_run["run_dir"], full)


@pytest.mark.slow
def test_killed_run_resumes_exactly(tmp_path):
    config = tmp_path / "tiny.yaml"
    # 200 generations with a checkpoint every 2 (each one fsynced) last long enough to be
    # killed mid-way after the 5th, whatever the machine's speed.
    generations = 200
    config.write_text(yaml.safe_dump({**TINY, "eval_every": 6, "checkpoint_every": 2,
                                      "num_generations": generations}))
    args = ["evolve", "--config", str(config), "--quiet", "--wandb=disabled"]
    reference = popeval_cli([*args, "--run_dir=full"], tmp_path)
    killed = popeval_cli([*args, "--run_dir=killed"], tmp_path)
    metrics = tmp_path / "killed" / "metrics.csv"
    deadline = time.monotonic() + 400
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 6):  # header + 5 rows
        assert killed.poll() is None, "the run ended before it was killed:\n" + killed.communicate()[0]
        assert time.monotonic() < deadline, "no 5 generations in time"
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    run_dir = tmp_path / "killed"
    assert not (run_dir / "result.json").exists()
    saved = json.loads((run_dir / "checkpoint.json").read_text())["generation"]
    assert 4 <= saved < generations and saved % 2 == 0
    finish(popeval_cli(["evolve", "--resume", str(run_dir), "--quiet", "--wandb=disabled"], tmp_path))
    finish(reference)

    resumed, full = read_metrics(run_dir, timing=False), read_metrics(tmp_path / "full", timing=False)
    assert [int(r["generation"]) for r in resumed] == list(range(1, generations + 1))
    assert resumed == full
    assert_same_checkpoint(run_dir, tmp_path / "full")
    a, b = (json.loads((d / "result.json").read_text()) for d in (run_dir, tmp_path / "full"))
    for k in ("generations", "env_steps", "best_fitness", "mean_policy_return", "best_policy_return"):
        assert a[k] == b[k], k


# ------------------------------------------------------------------ experiment vs run
@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_run_directory_saves_only_the_experiment_and_reads_older_configs(base_run, tmp_path):
    from popeval.strategies.run.run_dir import read_config

    saved = json.loads((base_run["run_dir"] / "config.json").read_text())
    assert set(saved) == set(EvolveConfig().to_dict())  # no run_dir, resume, wandb, quiet
    assert str(base_run["run_dir"]) not in json.dumps(saved)
    # popeval 0.1 saved run-control keys with the experiment: they are ignored on load.
    legacy = {**saved, "run_dir": "/elsewhere/run", "resume": None, "wandb": "disabled",
              "wandb_project": "popeval", "quiet": True, "budget": "about 1 minute"}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    assert read_config(tmp_path) == read_config(base_run["run_dir"])


def test_run_options_and_lstm_sizes_are_checked():
    with pytest.raises(ValueError, match="wandb must be"):
        RunOptions(wandb="sometimes")
    with pytest.raises(ValueError, match="either run_dir"):
        RunOptions(run_dir="a", resume="b")
    with pytest.raises(ValueError, match="distributed_timeout"):
        RunOptions(distributed_timeout=0)
    with pytest.raises(ValueError, match="together"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(num_processes=2, **QUIET))
    with pytest.raises(ValueError, match="one hidden size"):
        EvolveConfig.from_flat(policy="lstm", hidden_sizes=(8, 8))


@pytest.mark.xdist_group("evolve-base-run")  # one worker where --dist loadgroup groups
def test_resume_with_another_yaml_is_refused(base_run, tmp_path, monkeypatch, capsys):
    """`--resume RUN --config other.yaml` compares the YAML with the saved experiment (in-process:
    `main(argv)`)."""
    from popeval import cli

    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**TINY, "pop_size": 16}))
    before = snapshot(base_run["run_dir"])
    monkeypatch.chdir(tmp_path)
    code = cli.main(["evolve", "--resume", str(base_run["run_dir"]), "--config", str(other), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "differs in ['pop_size']" in err, err
    assert snapshot(base_run["run_dir"]) == before


# ------------------------------------------------------------------ the Python API validates like the CLI
@pytest.mark.parametrize("bad", [
    {"pop_size": 16.0}, {"pop_size": "16"}, {"num_generations": None}, {"seed": 2**32 + 1},
    {"hidden_sizes": [0]}, {"hidden_sizes": [-4]}, {"activation": "relux"}, {"stop_at_target": "yes"},
    {"num_env_steps": 0}, {"env_kwargs": []},
])
def test_evolve_config_refuses_bad_values_at_construction(bad):
    with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
        EvolveConfig.from_flat(**{**TINY, **bad})


@pytest.mark.parametrize("steps", [2.5, "10", True, 0])
def test_rollout_wrapper_refuses_a_non_integer_episode_length(steps):
    from popeval import RolloutWrapper

    with pytest.raises(ValueError, match="num_env_steps"):
        RolloutWrapper(None, env_name="CartPole-v1", num_env_steps=steps)


def test_a_config_may_give_its_sections_as_mappings(tmp_path):
    """`strategy: {name: snes, pop_size: 64}` is `strategy: snes` and `pop_size: 64`; a flat key
    on the command line overrides a section's field; each section checks its own fields."""
    from popeval.strategies.run.config import PolicyConfig, config_from_dict

    nested, flat = tmp_path / "nested.yaml", tmp_path / "flat.yaml"
    nested.write_text("environment: {name: Pendulum-v1}\nstrategy: {name: snes, pop_size: 64}\n"
                      "policy: {kind: mlp, hidden_sizes: [8]}\nrun: {num_generations: 3}\n")
    flat.write_text("env_name: Pendulum-v1\nstrategy: snes\npop_size: 64\npolicy: mlp\nhidden_sizes: [8]\n"
                    "num_generations: 3\n")
    config = load_config(nested)
    assert config == load_config(flat) and config.strategy.name == "snes" and config.policy.hidden_sizes == (8,)
    assert load_config(nested, ["--pop_size=16"]).strategy.pop_size == 16
    assert config_from_dict(config.to_dict()) == config and EvolveConfig.from_flat(**config.to_dict()) == config
    with pytest.raises(ValueError, match=r"'strategy.pop_sise'.*'pop_size'"):
        config_from_dict({"strategy": {"pop_sise": 4}})
    with pytest.raises(ValueError, match="'strategy.pop_size' given twice"):
        config_from_dict({"pop_size": 8, "strategy": {"pop_size": 4}})
    with pytest.raises(TypeError, match="'env_kwargs'"):
        config_from_dict({"env_kwargs": []})
    with pytest.raises(ValueError, match="conv_pool"):
        PolicyConfig(kind="mlp", conv_pool="max")
