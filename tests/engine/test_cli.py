"""The `popeval` command line, run as real processes: the shipped CartPole config solves its
task, `eval` / `list-envs` print what they promise, and the command leaves JAX's CPU device
count alone (one device, whose pieces run on every core, unless the user chose a count).
Errors exit with code 2 and a clear message, and `--help` lists the options: those run
in-process (`main(argv)`, what `python -m popeval` calls; a real process's exit code 2:
tests/strategies/test_distributed.py).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from popeval.environments import registered_envs
from tests.helpers import REPO, computed_once, subprocess_env

CARTPOLE = REPO / "experiments" / "configs" / "cartpole.yaml"
CONSOLE_SCRIPT = Path(sys.executable).with_name("popeval")


def run(args: list, cwd: Path, timeout: float = 300, **env_vars) -> subprocess.CompletedProcess:
    """`args` in a fresh process with no device count chosen (unless given in `env_vars`)."""
    env = subprocess_env(**env_vars)
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def popeval(*args, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "popeval", *args], cwd, **kwargs)


TIMING = {"time/elapsed", "steps/per_second", "wall_seconds", "first_generation_seconds", "seconds", "run_dir"}


def _cartpole(cwd: Path, name: str, cache: Path) -> tuple[Path, dict, str]:
    result = popeval("evolve", "--config", CARTPOLE, f"--run_dir={name}", "--quiet", "--wandb=disabled",
                     cwd=cwd, timeout=900, POPEVAL_CACHE_DIR=str(cache), JAX_COMPILATION_CACHE_DIR="")
    assert result.returncode == 0, result.stdout + result.stderr
    return cwd / name, json.loads(result.stdout), result.stderr


@pytest.fixture(scope="session")
def solved(tmp_path_factory):
    """`popeval evolve` on the shipped CartPole config, twice: with an empty compilation cache
    and again with the cache the first run filled. `(run_dir, summary, warm_run_dir, warm_summary,
    logs, cache)` ."""
    def compute(directory):
        cwd, cache = directory / "cli", directory / "xla-cache"
        cwd.mkdir()
        cold_dir, cold, cold_log = _cartpole(cwd, "cartpole", cache)
        warm_dir, warm, warm_log = _cartpole(cwd, "cartpole-warm", cache)
        return str(cold_dir), cold, str(warm_dir), warm, cold_log + warm_log, str(cache)

    cold_dir, cold, warm_dir, warm, logs, cache = computed_once(tmp_path_factory, "cli-solved", compute)
    return Path(cold_dir), cold, Path(warm_dir), warm, logs, Path(cache)


@pytest.mark.xdist_group("cli-solved")  # one worker where --dist loadgroup groups
def test_shipped_cartpole_config_reaches_its_target(solved):
    run_dir, summary, *_ = solved
    with open(run_dir / "metrics.csv", newline="") as f:
        means = [float(r["fitness/mean"]) for r in csv.DictReader(f)]
    assert means[-1] == 500.0 and max(means[:-1], default=0.0) < 500.0  # stop_at_target
    assert len(means) <= 50
    assert summary["solved_at"]["generation"] == len(means) == summary["generations"]
    assert json.loads((run_dir / "result.json").read_text()) == summary
    # The loop computes one generation ahead; the checkpoint holds the solved generation's state.
    assert json.loads((run_dir / "checkpoint.json").read_text())["generation"] == summary["generations"]


def without_timing(tree):
    if isinstance(tree, dict):
        return {k: without_timing(v) for k, v in tree.items() if k not in TIMING}
    return tree


@pytest.mark.xdist_group("cli-solved")  # one worker where --dist loadgroup groups
def test_a_warm_compilation_cache_changes_nothing_but_time(solved):
    cold_dir, cold, warm_dir, warm, logs, cache = solved
    assert any(cache.iterdir()), "the first run left nothing in the compilation cache"
    assert logs.count(f"compilation cache: {cache}") == 2
    assert without_timing(warm) == without_timing(cold)
    for name in ("metrics.csv",):
        with open(cold_dir / name, newline="") as a, open(warm_dir / name, newline="") as b:
            assert [without_timing(r) for r in csv.DictReader(a)] == [without_timing(r) for r in csv.DictReader(b)]
    assert (cold_dir / "checkpoint.msgpack").read_bytes() == (warm_dir / "checkpoint.msgpack").read_bytes()


@pytest.mark.xdist_group("cli-solved")  # one worker where --dist loadgroup groups
def test_cli_runs_on_one_cpu_device_unless_asked(solved):
    _, summary, *_ = solved
    assert summary["devices"] == 1  # its generation's pieces run on threads over every core


@pytest.mark.slow  # the same imports and device count: tests/project/test_imports.py
def test_importing_popeval_leaves_jax_backends_uninitialised(tmp_path):
    """Otherwise the CLI cannot choose the CPU device count (it imports popeval first).
    (`popeval.strategies` is left out: evosax's algorithms create arrays at import.)"""
    code = ("import jax, popeval, popeval.cli, popeval.rollout, popeval.environments\n"
            "jax.config.update('jax_num_cpu_devices', 3)\n"
            "print(jax.local_device_count())")
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0 and result.stdout.split() == ["3"], result.stdout + result.stderr


#: No count chosen: one device, as `test_cli_runs_on_one_cpu_device_unless_asked` sees in a real run.
@pytest.mark.parametrize("chosen", [pytest.param(None, marks=pytest.mark.slow), "2"])
def test_cli_keeps_the_device_count_the_user_chose(tmp_path, chosen):
    code = ("from popeval.cli import main\n"
            "main(['list-envs'])\n"
            "import jax\n"
            "print('devices', jax.local_device_count())")
    env_vars = {"JAX_NUM_CPU_DEVICES": chosen} if chosen else {}
    result = run([sys.executable, "-c", code], tmp_path, **env_vars)
    assert result.returncode == 0, result.stderr
    expected = f"devices {int(chosen or 1)}"
    assert result.stdout.splitlines()[-1] == expected, result.stdout + result.stderr


@pytest.mark.xdist_group("cli-solved")  # one worker where --dist loadgroup groups
def test_eval_prints_the_returns_of_a_saved_controller(solved, monkeypatch, capsys):
    """In-process (`main(argv)`); the console script runs in `test_list_envs`."""
    from popeval import cli

    run_dir, *_ = solved
    monkeypatch.chdir(run_dir.parent)
    code = cli.main(["eval", str(run_dir), "--episodes", "8", "--which", "mean"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    out = json.loads(stdout)
    assert out["episodes"] == 8 and out["policy"] == "mean"
    assert 0 < out["min_return"] <= out["mean_return"] <= out["max_return"] <= 500
    assert out["mean_return"] > 100  # the evolved controller, not a fresh one (~20)


def test_list_envs(tmp_path):
    """Through the installed `popeval` console script."""
    assert CONSOLE_SCRIPT.is_file(), "the `popeval` console script is not installed"
    result = run([CONSOLE_SCRIPT, "list-envs"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == list(registered_envs)


@pytest.mark.parametrize(
    "args, message",
    [
        (["evolve"], "evolve needs --config"),
        (["evolve", "--config", CARTPOLE, "--pop_sise=8"],
         "unknown config key 'pop_sise' (did you mean 'pop_size'?)"),
        (["evolve", "--config", CARTPOLE, "--pop_size=7"], "pop_size must be even"),
        (["evolve", "--resume", "."], "not a popeval run directory"),
        (["eval", "."], "config.json"),
        (["list-envs", "--verbose"], "unrecognised arguments: --verbose"),
        (["evolve", "--config", "bad.yaml"], "bad.yaml: not a readable YAML config"),
        (["evolve", "--config", "binary.yaml"], "binary.yaml: not a readable YAML config"),
        (["evolve", "--config", "."], "Is a directory: ."),
        (["evolve", "--config", CARTPOLE, "--run_dir=notes.txt"], "notes.txt is a file"),
        (["evolve", "--config", CARTPOLE, "--hidden_sizes=[0]"], "hidden_sizes must be positive"),
        (["evolve", "--config", CARTPOLE, "--hidden_sizes=[-4]"], "hidden_sizes must be positive"),
        (["evolve", "--config", CARTPOLE, "--activation=relux"], "did you mean 'relu'"),
        (["evolve", "--config", CARTPOLE, "--seed=4294967297"], "seed must fit in int32"),
        (["evolve", "--config", CARTPOLE, "--pop_size=7", "--strategy_kwargs={use_antithetic_sampling: false}"],
         "Open_ES with pop_size=7: Population size must be even"),
        (["evolve", "--config", CARTPOLE, "--strategy_kwargs={learning_rate: -1.0}"], "learning_rate must be"),
        (["eval", REPO / "experiments" / "controllers" / "breakout_minatar", "--episodes", "0"],
         "--episodes must be >= 1"),
    ],
    ids=["no-config", "unknown-key", "odd-pop", "resume-not-a-run", "eval-not-a-run", "stray-argument",
         "malformed-yaml", "binary-yaml", "config-dir", "run-dir-file", "hidden-0", "hidden-negative",
         "activation", "seed-range", "odd-pop-no-antithetic", "negative-lr", "eval-episodes"],
)
def test_errors_exit_2_with_a_message(tmp_path, monkeypatch, capsys, args, message):
    from popeval import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a run")
    (tmp_path / "bad.yaml").write_text("pop_size: [1, 2\n")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    before = sorted(p.name for p in tmp_path.iterdir())
    code = cli.main([str(a) for a in args])  # an exception it let through would fail the test here
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, out + err
    assert message in lines[-1] and "Traceback" not in err, err
    assert lines[-1].startswith(f"popeval {args[0]}: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize("argv", [["--debug", "eval", "."], ["eval", ".", "--debug"]], ids=["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_command(tmp_path, monkeypatch, capsys, argv):
    from popeval import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a popeval run directory"):  # the traceback, not one line
        cli.main(argv)
    assert cli.main(["eval", "."]) == 2 and "Traceback" not in capsys.readouterr().err


def test_evolve_without_a_config_uses_the_defaults_and_the_overrides(tmp_path, monkeypatch, capsys):
    from popeval import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")  # as in a test's subprocess (`subprocess_env`)
    code = cli.main(["evolve", "--env_name=Catch-bsuite", "--pop_size=8", "--num_rollouts=1", "--num_generations=2",
                     "--hidden_sizes=[4]", "--eval_episodes=2", "--run_dir=r", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["generations"] == 2
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["env_name"] == "Catch-bsuite" and config["pop_size"] == 8 and config["hidden_sizes"] == [4]
    assert config["eval_every"] == 10  # a default


def test_evolve_help_lists_every_config_key(capsys):
    from popeval import cli
    from popeval.strategies import EvolveConfig

    with pytest.raises(SystemExit) as done:
        cli.main(["evolve", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for key in EvolveConfig().to_dict():
        assert f"  {key} (" in out, key


def test_bench_help_lists_its_options(capsys):
    """`popeval bench` times popeval alone (`popeval.bench`; tests/engine/test_bench.py runs it); the
    benchmark against the peers is `python -m experiments.benchmarks`, not part of the package."""
    from popeval import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--env", "--pop_size", "--num_rollouts", "--num_env_steps", "--hidden", "--repeats", "--json"):
        assert flag in out, flag
    assert "--max-mem-mb" not in out and "gymnax" not in out
