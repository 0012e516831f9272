"""One flag style: `popeval` and every `experiments/` command spell their options
`--snake_case` (`--pop_size=16`, `--pop_sizes 64 512`), and so do the documented commands;
kebab-case spellings stay as aliases of recorded commands, and the agents' command takes config
overrides as `--key=value`. As in any argparse tool, `--key value` works wherever `--key=value`
does, config keys included."""

import importlib
import re

import pytest

from popeval import cli, launch
from tests.helpers import REPO

KEBAB = re.compile(r"--[a-z0-9_]+-[a-z0-9_-]+")
#: Other tools' options in the docs (pytest's).
OTHERS = {"--cov-report"}
SCRIPTS = sorted(p for p in (REPO / "experiments").rglob("*.py") if "add_argument(" in p.read_text())
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "experiments").rglob("README.md")),
        *sorted((REPO / "experiments" / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO / "experiments")))
def test_experiments_scripts_spell_their_flags_in_snake_case(path):
    """Each option's first spelling (the one `--help` and the usage show) is snake_case; the
    script's own docstring and messages use it too (the aliases are the only kebab-case left)."""
    text = path.read_text()
    first = re.findall(r'add_argument\(\s*"(--[^"]+)"', text)
    aliases = set(re.findall(r'add_argument\(\s*"--[^"]+",\s*"(--[^"]+)"', text))
    assert first and not [f for f in first if KEBAB.fullmatch(f)], first
    assert set(KEBAB.findall(text)) <= aliases


@pytest.mark.parametrize("command", ["evolve", "eval", "bench", "render", "launch"])
def test_popeval_spells_its_flags_in_snake_case(capsys, command):
    entry, argv = (launch.main, []) if command == "launch" else (cli.main, [command])
    with pytest.raises(SystemExit) as done:
        entry([*argv, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    # Usage and the options' lines name each option by its first spelling.
    flags = re.findall(r"--[a-z0-9_-]+", text.split("\n\n")[0]) + re.findall(r"^ +(--[a-z0-9_-]+)", text, re.M)
    assert flags and not [f for f in flags if KEBAB.fullmatch(f)], flags


def test_documented_commands_spell_flags_in_snake_case():
    found = {str(p.relative_to(REPO)): set(KEBAB.findall(p.read_text())) - OTHERS for p in DOCS}
    assert not {k: v for k, v in found.items() if v}


def test_the_kebab_spellings_still_parse():
    from experiments.benchmarks.run import parse_args

    args = parse_args(["--pop-sizes", "8", "16", "--quiet-below", "2", "--no-memory-check", "--max-mem-mb", "5"])
    assert (args.pop_sizes, args.quiet_below, args.no_memory_check, args.max_mem_mb) == ([8, 16], 2.0, True, 5.0)
    assert parse_args(["--pop_sizes", "8", "--quiet_below=2"]).pop_sizes == [8]


@pytest.mark.parametrize("agent, config, key", [("dqn", "DQNConfig", "num_seeds"),
                                                ("anakin", "AnakinConfig", "num_calls")])
def test_agent_commands_take_config_overrides_as_flags(agent, config, key):
    """`--key=value` like `popeval evolve`; the old positional `key=value` still works."""
    from experiments.agents.__main__ import parse_args
    from experiments.agents.common import load_config

    args, overrides = parse_args([agent, "--quick", "--run-dir", "x", f"--{key}=3", "--wandb", "disabled", "seed=1"])
    assert (args.agent, args.quick, args.run_dir, args.wandb) == (agent, True, "x", "disabled")
    cls = getattr(importlib.import_module(f"experiments.agents.{agent}"), config)
    loaded = load_config(cls, None, overrides)
    assert (getattr(loaded, key), loaded.seed) == (3, 1)
    spaced = [agent, "--quick", f"--{key}", "3", "--wandb", "disabled", "seed=1"]
    assert load_config(cls, None, parse_args(spaced)[1]) == loaded


# ------------------------------------------------------------------ `--key value` as `--key=value`
CONFIG = str(REPO / "experiments" / "configs" / "cartpole.yaml")
SPACED = ["--config", CONFIG, "--pop_size", "8", "--target", "-5", "--stop_at_target", "true", "--quiet",
          "--strategy_kwargs", "{learning_rate: 0.1}", "--hidden_sizes", "[8, 8]", "--seed", "-3",
          "--run_dir", "runs/x", "--wandb", "disabled", "--wandb_project", "p", "--distributed_timeout", "5"]
JOINED = [f"--config={CONFIG}", "--pop_size=8", "--target=-5", "--stop_at_target=true", "--quiet",
          "--strategy_kwargs={learning_rate: 0.1}", "--hidden_sizes=[8, 8]", "--seed=-3", "--run_dir=runs/x",
          "--wandb=disabled", "--wandb_project=p", "--distributed_timeout=5"]


@pytest.fixture
def evolve_calls(monkeypatch):
    """`popeval evolve`'s calls of `evolve(config, options)`, which does nothing here."""
    import popeval.strategies

    calls = []
    monkeypatch.setenv("WANDB_SILENT", "true")  # the command sets it
    monkeypatch.setattr(popeval.strategies, "evolve", lambda config, options: calls.append((config, options)) or {})
    return calls


def test_evolve_takes_key_space_value_like_key_equals_value(evolve_calls, capsys):
    """A new user's issue: `--pop_size 8` was refused ("expected key=value"); argparse tools take
    both spellings, for config keys and the other options alike, negative numbers as values."""
    assert cli.main(["evolve", *SPACED]) == 0 and cli.main(["evolve", *JOINED]) == 0
    (spaced, spaced_options), (joined, joined_options) = evolve_calls
    assert spaced == joined and spaced_options == joined_options
    run = spaced.run
    assert (spaced.strategy.pop_size, run.target, run.stop_at_target, run.seed) == (8, -5.0, True, -3)
    assert (spaced.strategy.kwargs, spaced.policy.hidden_sizes, spaced.environment.name) == (
        {"learning_rate": 0.1}, (8, 8), "CartPole-v1")
    assert (spaced_options.run_dir, spaced_options.wandb, spaced_options.wandb_project,
            spaced_options.progress, spaced_options.distributed_timeout) == ("runs/x", "disabled", "p", False, 5.0)


@pytest.mark.parametrize("command", ["eval", "render"])
def test_a_spaced_config_key_before_the_run_directory_is_not_taken_for_it(monkeypatch, command):
    """`eval --num_env_steps 500 RUN`: argparse alone would take 500 for the run directory."""
    import popeval.strategies

    calls = []

    def load_policy(run_dir, which, overrides):
        calls.append((run_dir, which, overrides))
        raise ValueError("stop here")

    monkeypatch.setattr(popeval.strategies, "load_policy", load_policy)
    for argv in (["--num_env_steps", "500", "--env_kwargs", "{max_speed: 9.0}", "RUN", "--which", "best"],
                 ["RUN", "--num_env_steps=500", "--env_kwargs={max_speed: 9.0}", "--which=best"]):
        assert cli.main([command, *argv]) == 2
    assert calls == [("RUN", "best", ["--num_env_steps=500", "--env_kwargs={max_speed: 9.0}"])] * 2


@pytest.mark.parametrize("argv, message", [
    (["--pop_size"], "config key 'pop_size' needs a value: --pop_size=VALUE or --pop_size VALUE"),
    (["--pop_size", "--seed", "3"], "config key 'pop_size' needs a value"),
    (["--stop_at_target"], "config key 'stop_at_target' needs a value"),  # a config key always takes one
    (["--quiet", "true"], "unexpected argument 'true': config keys are set with --key=value or --key value"),
    (["--pop_size", "8", "9"], "unexpected argument '9'"),
])
def test_a_config_key_without_a_value_is_one_line_that_says_how(evolve_calls, capsys, argv, message):
    assert cli.main(["evolve", *argv]) == 2 and not evolve_calls
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"popeval evolve: error: {message}"), err


def test_overrides_from_python_take_both_spellings():
    from popeval.strategies import load_config

    spaced = load_config(None, ["--pop_size", "8", "--target", "-1e-3", "seed=2", "--env_name=Acrobot-v1"])
    assert spaced == load_config(None, ["--pop_size=8", "--target=-1e-3", "--seed=2", "--env_name=Acrobot-v1"])
    assert (spaced.strategy.pop_size, spaced.run.target, spaced.run.seed, spaced.environment.name) == (
        8, -1e-3, 2, "Acrobot-v1")
