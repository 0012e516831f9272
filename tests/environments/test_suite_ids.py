"""Other suites' environments as ids (`brax/<name>`, `craftax/...`, `jumanji/<id>`, `navix/<id>`, ...).

The registry's `SUITES` table imports a suite only when one of its ids is made or listed, an id
of a suite that is not installed names the extra that brings it, `make`'s keyword arguments reach
the adapter, and an unknown name gets the suite's close ones; `popeval list-envs --all` lists the
installed suites' ids; the `popeval` command evolves, evaluates, resumes and exports on them.
Jumanji (in the test extra) runs by default, Craftax (the suites extra) in the slow tier.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from popeval.environments import make, registered_envs
from popeval.environments.registry import SUITES
from tests.helpers import read_metrics, subprocess_env

EXTRA = 'pip install "popeval[suites]"'


def uninstalled(monkeypatch, *packages: str) -> None:
    """Makes `packages` look uninstalled to the registry's check (`importlib.util.find_spec`)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name in packages else find_spec(name, *args))


def test_the_table_names_each_adapter_and_its_functions():
    """Read from the adapters' source: nothing of a suite is imported."""
    assert list(SUITES) == ["brax", "craftax", "jumanji", "navix", "xminigrid"]
    for namespace, suite in SUITES.items():
        assert suite.package == namespace
        source = Path(importlib.util.find_spec(suite.module).origin).read_text()
        functions = {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
        assert {suite.factory, "env_names"} <= functions, namespace


def test_a_suite_is_imported_only_when_one_of_its_ids_is_made():
    code = ("import sys\n"
            "import popeval, popeval.cli, popeval.environments.suites, popeval.strategies\n"
            "from popeval.environments import make\n"
            "loaded = lambda: sorted(s for s in ('brax', 'craftax', 'jumanji', 'navix', 'xminigrid') "
            "if s in sys.modules)\n"
            "make('CartPole-v1')\n"
            "assert loaded() == [], loaded()\n"
            "make('jumanji/Snake-v1')\n"
            "assert loaded() == ['jumanji'], loaded()\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env(), timeout=300)


@pytest.mark.parametrize("env_id", ["brax/ant", "craftax/Craftax-Classic-Symbolic-v1", "craftax/Craftax-Symbolic-v1",
                                    "jumanji/Snake-v1", "navix/Navix-Empty-5x5-v0", "xminigrid/MiniGrid-Empty-5x5"])
def test_an_id_of_a_missing_suite_names_the_extra(monkeypatch, env_id):
    package = env_id.split("/")[0]
    uninstalled(monkeypatch, package)
    with pytest.raises(ModuleNotFoundError) as missing:
        make(env_id)
    assert str(missing.value) == f"{env_id}: needs the {package} package: {EXTRA}"
    assert missing.value.name == package


def test_the_command_line_names_the_extra_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from popeval import cli

    uninstalled(monkeypatch, "craftax")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["evolve", "--env_name=craftax/Craftax-Classic-Symbolic-v1", "--quiet", "--wandb=disabled"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("popeval evolve: error: ")
    assert err.strip().splitlines()[-1] == ("popeval evolve: error: craftax/Craftax-Classic-Symbolic-v1: needs the "
                                            f"craftax package: {EXTRA}")
    assert list(tmp_path.iterdir()) == []


def test_unknown_names_get_the_close_ones():
    pytest.importorskip("jumanji")
    with pytest.raises(ValueError, match="jumanji has no 'Snak-v1'. Did you mean 'jumanji/Snake-v1'"):
        make("jumanji/Snak-v1")
    with pytest.raises(ValueError, match="'gymnax' is not a suite; the suites' ids are brax/<name>, craftax/<name>"):
        make("gymnax/CartPole-v1")


def test_jumanji_ids_take_the_adapters_arguments():
    pytest.importorskip("jumanji")
    env, params = make("jumanji/Snake-v1")
    assert params.max_steps_in_episode == 4000  # Snake's time limit
    env, params = make("jumanji/Snake-v1", time_limit=12, max_steps_in_episode=8, flatten=False)
    assert params.max_steps_in_episode == 8 and env._time_limit == 12
    assert "grid" in env.observation_space(params).spaces  # the fields, not flattened


def test_list_envs_all_adds_the_installed_suites(monkeypatch, capsys):
    """The heavy suites look uninstalled, so the test is the same with or without them."""
    jumanji = pytest.importorskip("jumanji")
    from popeval import cli

    assert cli.main(["list-envs"]) == 0
    assert capsys.readouterr().out.splitlines() == list(registered_envs)
    uninstalled(monkeypatch, "brax", "craftax", "navix", "xminigrid")
    assert cli.main(["list-envs", "--all"]) == 0
    out, err = capsys.readouterr()
    jumanji_ids = [f"jumanji/{name}" for name in sorted(jumanji.registered_environments())]
    assert "jumanji/Snake-v1" in jumanji_ids
    assert out.splitlines() == list(registered_envs) + jumanji_ids
    assert err.splitlines() == [f"popeval list-envs: {ns}/...: needs the {ns} package: {EXTRA}"
                                for ns in ("brax", "craftax", "navix", "xminigrid")]


def evolve_eval_export(tmp_path: Path, capsys, env_id: str, settings: list[str], resume: bool) -> dict:
    """`popeval evolve` (1 generation, then `--resume` to 2, when `resume`; else 2 at once), `eval`, and
    `export` then `eval` of the export, on `env_id`, in-process from `tmp_path`; returns `eval`'s output."""
    from popeval import cli

    def main(*argv) -> str:
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    common = ["--quiet", "--wandb=disabled"]
    main("evolve", f"--env_name={env_id}", f"--num_generations={1 if resume else 2}", "--pop_size=4",
         "--num_rollouts=1", "--hidden_sizes=[4]", "--eval_episodes=2", *common, *settings)
    [run_dir] = (tmp_path / "runs").iterdir()  # the default run directory, under runs/
    assert run_dir.name.startswith(env_id.replace("/", "-") + "-")
    if resume:
        main("evolve", "--resume", run_dir, "--num_generations=2", *common)
    assert [int(r["generation"]) for r in read_metrics(run_dir)] == [1, 2]
    assert json.loads((run_dir / "result.json").read_text())["generations"] == 2
    assert json.loads((run_dir / "config.json").read_text())["env_name"] == env_id
    played = json.loads(main("eval", run_dir, "--episodes", "2", "--which", "mean"))
    main("export", run_dir, tmp_path / "exported")
    exported = json.loads(main("eval", tmp_path / "exported", "--episodes", "2", "--which", "mean"))
    assert played["episodes"] == 2 and played["mean_return"] == exported["mean_return"]
    return played


@pytest.mark.slow  # by default: make + RolloutWrapper on a jumanji id (docs), the CLI's errors, env_module's chain
def test_evolve_eval_export_on_a_jumanji_id(tmp_path, monkeypatch, capsys):
    pytest.importorskip("jumanji")
    monkeypatch.chdir(tmp_path)
    played = evolve_eval_export(tmp_path, capsys, "jumanji/Game2048-v1", ["--env_kwargs={max_steps_in_episode: 20}"],
                                resume=False)
    assert played["mean_return"] > 0  # 2048's merges pay


@pytest.mark.slow  # Craftax's step takes ~10 s of CPU to compile, per program
def test_evolve_resume_eval_export_on_craftax_classic(tmp_path, monkeypatch, capsys):
    pytest.importorskip("craftax")
    monkeypatch.chdir(tmp_path)
    evolve_eval_export(tmp_path, capsys, "craftax/Craftax-Classic-Symbolic-v1",
                       ["--env_kwargs={max_steps_in_episode: 20}"], resume=True)
