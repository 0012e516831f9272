"""The shipped controllers (`experiments/controllers/<game>/`): each loads with `popeval eval`'s
loader and reproduces the returns its run recorded in `result.json` (the run's final
64-episode evaluation, same episode keys), and `popeval eval` evaluates one without the
training episode cap.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from popeval import keys
from popeval.strategies import load_policy
from popeval.strategies.run_dir import read_config

REPO = Path(__file__).resolve().parents[1]
CONTROLLERS = sorted(p for p in (REPO / "experiments" / "controllers").iterdir() if p.is_dir())


def test_every_minatar_game_ships_a_controller():
    names = {p.name for p in CONTROLLERS}
    assert {"breakout_minatar", "asterix_minatar", "freeway_minatar", "space_invaders_minatar",
            "seaquest_minatar"} <= names
    for path in CONTROLLERS:
        assert sum(f.stat().st_size for f in path.iterdir()) < 1_000_000, path


@pytest.mark.parametrize("path", CONTROLLERS, ids=[p.name for p in CONTROLLERS])
def test_shipped_controller_reproduces_its_recorded_returns(path):
    recorded = json.loads((path / "result.json").read_text())
    for which, key in (("mean", "mean_policy_return"), ("best", "best_policy_return")):
        run, params, obs_stats, _ = load_policy(path, which)
        config = read_config(path)
        # The episodes of the run's own final evaluation.
        episodes = keys.evaluation_keys(config.seed, keys.FINAL_EVALUATION, config.eval_episodes)[None]
        returns = run.manager.population_fitness(episodes, jax.tree.map(lambda x: x[None], params),
                                                 obs_stats=obs_stats).returns
        # The same program on the same kind of CPU gives the same episodes; allow for another
        # CPU's rounding (a diverging episode or two of the 64).
        assert abs(float(np.mean(returns)) - recorded[key]) <= 0.05 * abs(recorded[key]) + 0.1, (which, key)


def test_eval_cli_lifts_the_training_cap_and_refuses_other_overrides(tmp_path):
    path = REPO / "experiments" / "controllers" / "breakout_minatar"
    base = [sys.executable, "-m", "popeval", "eval", str(path), "--episodes", "8"]
    env = {"POPEVAL_CACHE_DIR": "", "JAX_PLATFORMS": "cpu", "PATH": ""}
    ok = subprocess.run(base + ["--num_env_steps=20000", "--env_kwargs={}"], capture_output=True,
                        text=True, cwd=tmp_path, env=env, timeout=600)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["episodes"] == 8
    bad = subprocess.run(base + ["--hidden_sizes=[64]"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=600)
    assert bad.returncode == 2 and "hidden_sizes" in bad.stderr, bad.stderr
