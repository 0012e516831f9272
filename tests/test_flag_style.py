"""One flag style: `popeval` and every `experiments/` script spell their options
`--snake_case` (`--pop_size=16`, `--pop_sizes 64 512`), and so do the documented commands;
kebab-case spellings stay as aliases of recorded commands, and the agents' scripts take config
overrides as `--key=value`."""

import importlib
import re
from pathlib import Path

import pytest

from popeval import cli, launch

REPO = Path(__file__).resolve().parents[1]
KEBAB = re.compile(r"--[a-z0-9_]+-[a-z0-9_-]+")
#: Other tools' options in the docs (pytest's).
OTHERS = {"--cov-report"}
SCRIPTS = sorted(p for p in (REPO / "experiments").rglob("*.py") if "add_argument(" in p.read_text())
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "experiments" / "README.md",
        *sorted((REPO / "experiments" / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
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
    from benchmarks.run import parse_args

    args = parse_args(["--pop-sizes", "8", "16", "--quiet-below", "2", "--no-memory-check", "--max-mem-mb", "5"])
    assert (args.pop_sizes, args.quiet_below, args.no_memory_check, args.max_mem_mb) == ([8, 16], 2.0, True, 5.0)
    assert parse_args(["--pop_sizes", "8", "--quiet_below=2"]).pop_sizes == [8]


@pytest.mark.parametrize("module, config, key", [("dqn", "DQNConfig", "num_seeds"),
                                                 ("anakin", "AnakinConfig", "num_calls")])
def test_agent_scripts_take_config_overrides_as_flags(module, config, key):
    """`--key=value` like `popeval evolve`; the old positional `key=value` still works."""
    from agents.common import load_config

    args, overrides = importlib.import_module(module).parse_args(
        ["--quick", "--run-dir", "x", f"--{key}=3", "--wandb", "disabled", "seed=1"])
    assert (args.quick, args.run_dir, args.wandb) == (True, "x", "disabled")
    cls = getattr(importlib.import_module(f"agents.{module}"), config)
    loaded = load_config(cls, None, overrides)
    assert (getattr(loaded, key), loaded.seed) == (3, 1)
