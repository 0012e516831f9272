"""`popeval eval` in process: it says which episodes it plays (fresh ones by default, or with
`--episodes_from_run` the run's own final evaluation, which reproduces `result.json` to the
last bit), and its help lists the config keys it takes."""

import json
import logging

import pytest

from popeval.cli import main
from popeval.strategies import EvolveConfig, RunOptions, evolve


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """A tiny Pendulum run: float returns, so other episodes give another mean."""
    config = EvolveConfig.from_flat(env_name="Pendulum-v1", pop_size=8, num_rollouts=1, num_generations=2,
                          hidden_sizes=(4,), num_env_steps=20, eval_every=2, eval_episodes=4)
    path = tmp_path_factory.mktemp("eval") / "run"
    evolve(config, RunOptions(run_dir=str(path), wandb="disabled", progress=False))
    return path


def _eval(run_dir, capsys, caplog, *args) -> tuple[dict, str]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="popeval"):
        assert main(["eval", str(run_dir), *args]) == 0
    return json.loads(capsys.readouterr().out), caplog.text


@pytest.mark.parametrize("which", ["mean", "best"])
def test_eval_episodes_from_run_reproduces_result_json_exactly(run_dir, capsys, caplog, which):
    recorded = json.loads((run_dir / "result.json").read_text())
    out, said = _eval(run_dir, capsys, caplog, "--episodes_from_run", "--which", which)
    assert out["mean_return"] == recorded[f"{which}_policy_return"]  # to the last bit
    assert (out["episodes"], out["episodes_from"], out["policy"]) == (4, "run", which)
    assert "the run's final evaluation" in said and f"{which}_policy_return" in said


def test_eval_plays_fresh_episodes_by_default_and_says_so(run_dir, capsys, caplog):
    recorded = json.loads((run_dir / "result.json").read_text())
    out, said = _eval(run_dir, capsys, caplog, "--episodes=4")
    assert (out["episodes"], out["episodes_from"], out["policy"]) == (4, "fresh", "mean")
    assert out["mean_return"] != recorded["mean_policy_return"]
    assert "fresh episodes" in said and "--episodes_from_run" in said


def test_eval_episodes_from_run_refuses_episodes_and_seed(run_dir, capsys):
    assert main(["eval", str(run_dir), "--episodes-from-run", "--seed=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("popeval eval: error: --episodes_from_run plays the run's own episodes")


@pytest.mark.parametrize("command", ["eval", "render"])
def test_eval_and_render_help_list_the_config_keys_they_take(capsys, command):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--num_env_steps=N" in text and "--env_kwargs={...}" in text
    assert ("--episodes_from_run" in text) == (command == "eval")
