"""The controller zoo (`experiments/controllers/<config>/`): one per registered environment,
each loads with `popeval eval`'s loader and reproduces the returns its run recorded in
`result.json` (the run's final 64-episode evaluation, same episode keys); `popeval export`
writes one; `popeval eval` evaluates one without the training episode cap; the zoo's table
and figure script reads them.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import keys, registered_envs
from popeval.strategies import load_config, load_policy
from popeval.strategies.run.run_dir import read_config
from tests.helpers import REPO

CONTROLLERS = sorted(p for p in (REPO / "experiments" / "controllers").iterdir() if (p / "config.json").is_file())
#: The zoo's: one per popeval environment. A suite's controller (craftax/...) needs its extra.
ZOO = [p for p in CONTROLLERS if "/" not in read_config(p).environment.name]


def test_every_environment_ships_a_controller_from_its_config():
    for path in (REPO / "experiments" / "configs").glob("*.yaml"):
        if not path.name.startswith(("anakin_", "dqn_", "brax_")):  # those are other scripts' configs
            load_config(path)
    envs = {read_config(p).environment.name for p in CONTROLLERS}
    assert set(registered_envs) <= envs, sorted(set(registered_envs) - envs)
    for path in CONTROLLERS:
        assert (REPO / "experiments" / "configs" / f"{path.name}.yaml").is_file(), path.name
        assert load_config(REPO / "experiments" / "configs" / f"{path.name}.yaml") == read_config(path), path.name
        # metrics.csv (the learning curve) is missing only for runs that predate `popeval export`.
        assert {"config.json", "result.json", "checkpoint.msgpack"} <= {f.name for f in path.iterdir()}
        assert sum(f.stat().st_size for f in path.iterdir()) < 1_000_000, path


#: By default one controller of each kind of policy and action (an MLP with discrete and with
#: continuous actions, a CNN); the others under `-m slow`.
REPLAYED = ("CartPole-v1", "Pendulum-v1", "Catch-bsuite", "Breakout-MinAtar")
SWEEP = [pytest.param(p, id=p.name, marks=() if read_config(p).environment.name in REPLAYED else pytest.mark.slow)
         for p in CONTROLLERS]


@pytest.mark.parametrize("path", SWEEP)
def test_shipped_controller_reproduces_its_recorded_returns(path):
    if path not in ZOO:
        pytest.importorskip(read_config(path).environment.name.split("/")[0])
    recorded = json.loads((path / "result.json").read_text())
    (run, mean, obs_stats, _), best = load_policy(path, "mean"), load_policy(path, "best").params
    config = read_config(path)
    # The run's own final evaluation: the same episodes, mean and best as rows 0 and 1.
    episodes = jnp.broadcast_to(keys.evaluation_keys(config.run.seed, keys.FINAL_EVALUATION, config.run.eval_episodes),
                                (2, config.run.eval_episodes))
    both = jax.tree.map(lambda m, b: jnp.stack([m, b]), mean, best)
    returns = np.mean(run.manager.population_fitness(episodes, both, obs_stats=obs_stats).returns, axis=1)
    for got, key in zip(returns, ("mean_policy_return", "best_policy_return")):
        # The same program on the same kind of CPU gives the same episodes; allow for another
        # CPU's rounding (a diverging episode or two of the 64).
        assert abs(float(got) - recorded[key]) <= 0.05 * abs(recorded[key]) + 0.1, (key, float(got), recorded[key])


def test_export_keeps_the_policies_and_drops_the_strategy_state(tmp_path, capsys):
    """A run exported with `popeval export` evaluates like the run; a GA's population stays behind."""
    from popeval import cli
    from popeval.strategies import EvolveConfig, RunOptions, evolve

    config = EvolveConfig.from_flat(env_name="Catch-bsuite", strategy="simple_ga", pop_size=64, num_rollouts=2,
                          num_generations=3, hidden_sizes=(8,), eval_every=3, eval_episodes=8)
    run, out = tmp_path / "run", tmp_path / "controller"
    evolve(config, RunOptions(run_dir=str(run), wandb="disabled", progress=False))
    assert cli.main(["export", str(run), str(out)]) == 0
    assert (out / "checkpoint.msgpack").stat().st_size * 10 < (run / "checkpoint.msgpack").stat().st_size
    assert "run_dir" not in json.loads((out / "result.json").read_text())  # the machine's path stays behind
    for which in ("mean", "best"):
        a, b = load_policy(run, which), load_policy(out, which)
        jax.tree.map(np.testing.assert_array_equal, a.params, b.params)
    capsys.readouterr()
    # An existing export: one line that says what to do (a new issue: a bare FileExistsError).
    assert cli.main(["export", str(run), str(out)]) == 2
    assert capsys.readouterr().err == (f"popeval export: error: {out}: exists and is not empty; choose a new "
                                       "directory, or pass --force (force=True) to replace an earlier export there\n")
    (out / "stale.txt").write_text("from the earlier export")
    assert cli.main(["export", str(run), str(out), "--force"]) == 0 and not (out / "stale.txt").exists()
    jax.tree.map(np.testing.assert_array_equal, load_policy(run, "best").params, load_policy(out, "best").params)
    # --force replaces an export only: never the run itself, nor any other directory.
    for other in (run, tmp_path):
        before = sorted(other.iterdir())
        assert cli.main(["export", str(run), str(other), "--force"]) == 2 and sorted(other.iterdir()) == before
        assert "not an exported controller, so --force does not replace it" in capsys.readouterr().err
    assert cli.main(["export", str(run), str(tmp_path / "other")]) == 0
    assert cli.main(["export", str(out), str(tmp_path / "third")]) != 0
    assert "already an exported controller" in capsys.readouterr().err


def _zoo():
    from experiments.zoo import results

    return results


def test_zoo_table_and_figure(tmp_path):
    zoo = _zoo()
    rows = zoo.rows()
    assert len(rows) == len(ZOO) and all(r["verdict"] in ("beaten", "met", "missed", "-") for r in rows)
    cartpole = next(r for r in rows if r["env"] == "CartPole-v1")
    assert cartpole["target"] == 500.0 and "gymnax-blines" in cartpole["source"] and cartpole["verdict"] == "met"
    assert all(r["target"] is not None and r["source"] for r in rows), [r["env"] for r in rows if not r["source"]]
    assert all(r["judged"] is not None for r in rows), [r["env"] for r in rows if r["judged"] is None]
    breakout = next(r for r in rows if r["env"] == "Breakout-MinAtar")  # a median of seeds: the shipped one beside it
    shipped = json.loads((REPO / "experiments/controllers/breakout_minatar/fresh.json").read_text())
    assert breakout["shipped"] == shipped[f"{breakout['judged_policy']}_policy_return"] != breakout["judged"]
    assert f"(median of 3 seeds; the shipped controller {zoo._fmt(breakout['shipped'])})" in zoo.table(short=True)
    for table in (zoo.table(), zoo.table(short=True), zoo.setup_table()):
        assert table.count("\n") == len(ZOO) + 1 and "CartPole-v1" in table
        assert table.splitlines()[0].count(" | ") <= 5  # at most six columns: the site shows it whole
    assert zoo.verdict(-120.0, -130.0) == "beaten" and zoo.verdict(-131.0, -130.0) == "met"
    assert zoo.verdict(0.5, 1.0) == "missed" and zoo.verdict(1.0, None) == "-"
    assert zoo.verdict(1.05, 1.0, optimum=True) == "met" and zoo.verdict(1.05, 1.0) == "beaten"
    assert zoo.is_optimum("the optimum, derived above") and zoo.is_optimum("gymnax-blines ES; the maximum")
    assert not zoo.is_optimum("gymnax-blines ES; optimum 1.0")
    assert [zoo.family(e) for e in ("Acrobot-v1", "Catch-bsuite", "Pong-misc", "Breakout-MinAtar")] == [
        "classic control", "bsuite", "misc", "MinAtar"]
    written = zoo.figure(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"zoo_curves_{slug}.png" for slug in zoo.FAMILIES.values())
    assert all(p.stat().st_size > 10_000 for p in written)
    # The site shows the figures as they are in experiments/zoo/ (docs/hooks/figures.py copies them).
    shipped = (REPO / "experiments" / "zoo").glob("zoo_curves_*.png")
    assert sorted(p.name for p in written) == sorted(p.name for p in shipped)


def test_the_docs_show_the_zoo_s_tables():
    """README and docs/zoo.md carry `python -m experiments.zoo table --short`, `... table` and
    `... table --setups` as they are."""
    zoo = _zoo()
    assert zoo.table(short=True) in (REPO / "README.md").read_text()
    assert zoo.table() in (REPO / "docs" / "zoo.md").read_text()
    assert zoo.setup_table() in (REPO / "docs" / "zoo.md").read_text()


def test_the_verdict_judges_the_fresh_figure_of_the_policy_the_run_preferred(tmp_path, monkeypatch):
    zoo = _zoo()
    source = REPO / "experiments" / "controllers" / "catch"
    (tmp_path / "catch").mkdir()
    for name in ("config.json", "result.json"):
        (tmp_path / "catch" / name).write_text((source / name).read_text())
    result = json.loads((source / "result.json").read_text())
    result.update(mean_policy_return=0.9, best_policy_return=1.0)
    (tmp_path / "catch" / "result.json").write_text(json.dumps(result))
    fresh = {"episodes": 4096, "seed": 12345, "mean_policy_return": 1.0, "best_policy_return": 0.5}
    (tmp_path / "catch" / "fresh.json").write_text(json.dumps(fresh))
    monkeypatch.setattr(zoo, "CONTROLLERS", tmp_path)
    row, = zoo.rows()
    assert (row["judged_policy"], row["judged"], row["verdict"]) == ("best", 0.5, "missed")
    # Each seed's run prefers its own policy: the first two the best, the third the mean.
    seeds = [{"mean_policy_return": mean, "best_policy_return": best, "fresh_mean_policy_return": 1.0,
              "fresh_best_policy_return": fresh} for mean, best, fresh in ((0.5, 1.0, 0.2), (0.5, 1.0, 0.99),
                                                                             (1.0, 0.5, 0.1))]
    (tmp_path / "catch" / "seeds.json").write_text(json.dumps(seeds))
    row, = zoo.rows()
    assert (row["judged"], row["seeds"], row["verdict"]) == (0.99, [0.2, 0.99, 1.0], "met")
    assert "median of 3 seeds, 0.2 to 1" in zoo.table()


def test_zoo_fresh_refuses_an_unknown_controller():
    with pytest.raises(SystemExit, match="no controller nope"):
        _zoo().main(["fresh", "nope"])


#: Fresh figures re-played by default: two cheap controllers; all of them under slow.
FRESH = [pytest.param(p, id=p.name, marks=() if p.name in ("cartpole", "catch") else pytest.mark.slow)
         for p in ZOO]


@pytest.mark.parametrize("path", FRESH)
def test_fresh_figures_reproduce(path):
    """`fresh.json` is what `python -m experiments.zoo fresh` plays: its episodes, both policies."""
    recorded = json.loads((path / "fresh.json").read_text())
    got = _zoo().fresh_eval(path, recorded["episodes"])
    for key in ("mean_policy_return", "best_policy_return"):
        assert abs(got[key] - recorded[key]) <= 0.05 * abs(recorded[key]) + 0.1, (key, got[key], recorded[key])


def test_eval_cli_lifts_the_training_cap_and_refuses_other_overrides(tmp_path, monkeypatch, capsys):
    """In-process (`main(argv)`)."""
    from popeval import cli

    monkeypatch.chdir(tmp_path)
    base = ["eval", str(REPO / "experiments" / "controllers" / "breakout_minatar"), "--episodes", "8"]
    assert cli.main(base + ["--num_env_steps=20000", "--env_kwargs={}"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 8
    assert cli.main(base + ["--hidden_sizes=[64]"]) == 2
    err = capsys.readouterr().err
    assert "hidden_sizes" in err.strip().splitlines()[-1] and "Traceback" not in err, err
    assert not any(tmp_path.iterdir())


def test_shipped_results_name_no_path_of_the_machine_that_ran_them():
    for controller in CONTROLLERS:
        assert "run_dir" not in json.loads((controller / "result.json").read_text()), controller


@pytest.mark.slow
def test_craftax_eval_plays_popeval_eval_s_episodes(tmp_path, capsys):
    """`python -m experiments.zoo craftax_eval`: the controller's reward on the fresh episodes is `popeval
    eval --num_env_steps=10000`'s, and it counts achievements beside it (random play's too)."""
    pytest.importorskip("craftax")
    from experiments.zoo import craftax_eval
    from popeval import cli

    controller = REPO / "experiments" / "controllers" / "craftax_classic"
    assert craftax_eval.main([str(controller), "--episodes", "4", "--out", str(tmp_path / "out.json")]) == 0
    random, played = json.loads((tmp_path / "out.json").read_text())["results"]
    capsys.readouterr()
    assert cli.main(["eval", str(controller), "--episodes", "4", "--num_env_steps=10000"]) == 0
    assert abs(json.loads(capsys.readouterr().out)["mean_return"] - played["mean_reward"]) < 1e-4
    assert random["policy"] == "random" and random["mean_achievements"] > 0 and played["mean_achievements"] > 0
