"""`strategy: eggroll` (`popeval.strategies.algorithms.eggroll`): the update against the paper's formula
computed in numpy, bad hyperparameters refused in one line, exact resumption and learning on a
tiny CartPole, no program holding a member's matrix, and (`slow`) 1 and 3 CPU devices giving
identical runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from popeval import checkpoint, cli
from popeval.low_rank import LowRankPopulation, draw_factors
from popeval.strategies import EvolveConfig, RunOptions, eggroll, evolve, make_strategy
from popeval.strategies.algorithms.eggroll import gradient
from tests.helpers import SCRIPT, flatten, read_metrics, subprocess_env

MEAN = {"params": {"Dense_0": {"kernel": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "bias": jnp.zeros(4)},
                   "Dense_1": {"kernel": jnp.ones((4, 2)), "bias": jnp.full(2, 0.5)}}}
TINY = dict(
    env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 50}, pop_size=8, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
    strategy="eggroll", strategy_kwargs={"rank": 2, "sigma": 0.1, "learning_rate": 0.1},
)
QUIET = dict(wandb="disabled", progress=False)


def assert_same_checkpoint(a, b):
    """Every array of the two runs' checkpoints (strategy state, best member, ...) is equal."""
    arrays_a, arrays_b = flatten(checkpoint.load_state_dict(a)), flatten(checkpoint.load_state_dict(b))
    assert arrays_a.keys() == arrays_b.keys()
    for k in arrays_a:
        np.testing.assert_array_equal(arrays_a[k], arrays_b[k], err_msg=k)


def papers_update(mean, key, fitness, shaping, rank, sigma, learning_rate, generation=0):
    """The mean after one SGD step on `1 / (N sigma) sum_i s_i E_i`, in numpy (float64) from the
    population's draws: `E_i = B_i A_i^T / sqrt(r)` (popeval's `(n_in, n_out)` kernels), `e_i`."""
    num = fitness.shape[0]
    factors = draw_factors(mean, key, jnp.arange(num), rank, generation)
    if shaping == "centered_rank":
        shaped = (scipy.stats.rankdata(fitness) - 1) / (num - 1) - 0.5
    else:
        shaped = (fitness - fitness.mean()) / (fitness.std() + 1e-8)

    def leaf(m, f):
        if hasattr(f, "a"):
            a, b = np.asarray(f.a, np.float64), np.asarray(f.b, np.float64)
            e = np.stack([b[i] @ a[i].T for i in range(num)]) / np.sqrt(rank)
        else:
            e = np.asarray(f, np.float64)
        return np.asarray(m, np.float64) + learning_rate * np.tensordot(shaped, e, axes=1) / (num * sigma)

    return jax.tree.map(leaf, mean, factors)


@pytest.mark.parametrize("shaping", ["centered_rank", "z_score"])
def test_the_update_is_the_papers_formula(shaping):
    """One tell with SGD moves the mean by `lr / (N sigma) sum_i s_i E_i` (float32 against
    float64), the factors redrawn in chunks (6 members, 4 at a time: the last chunk padded)."""
    rank, sigma, lr, num = 2, 0.3, 0.1, 6
    strategy = eggroll(num, MEAN, rank=rank, sigma=sigma, learning_rate=lr, optimizer="sgd",
                       fitness_shaping=shaping, member_chunk=4)
    key = jax.random.key(7)
    state = strategy.init(jax.random.key(0), MEAN)
    population, state = strategy.ask(key, state)
    assert isinstance(population, LowRankPopulation) and population.pop_size == num and population.rank == rank
    fitness = np.array([3.0, -1.0, 3.0, 0.5, 7.0, 2.0], np.float32)  # a tie
    new, metrics = jax.jit(strategy.tell)(state, population, fitness)
    expected = papers_update(MEAN, key, fitness.astype(np.float64), shaping, rank, sigma, lr)
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6),
                 strategy.mean(new), expected)
    assert int(new.generation) == 1 and int(metrics["nonfinite/count"]) == 0
    # The next generation draws from generation 1; explicit factors give the same gradient.
    assert int(strategy.ask(key, new)[0].generation) == 1
    weights = jnp.asarray(fitness)
    explicit = LowRankPopulation.from_factors(MEAN, population.all_factors(), sigma)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 gradient(explicit, weights), gradient(population, weights, chunk=4))


def test_adam_ascends_and_nonfinite_fitness_ranks_worst():
    """With Adam the first step moves every entry by about `lr` along the ascent direction
    (optax minimises: the sign flip), and a NaN fitness counts as the worst member."""
    strategy = make_strategy("eggroll", 4, MEAN, learning_rate=0.01, rank=1, sigma=0.5)
    state = strategy.init(jax.random.key(0), MEAN)
    population, state = strategy.ask(jax.random.key(3), state)
    fitness = jnp.array([1.0, jnp.nan, 2.0, 0.0])
    new, metrics = jax.jit(strategy.tell)(state, population, fitness)
    ascent = jax.jit(gradient)(population, jnp.array([1 / 6, -0.5, 0.5, -1 / 6]))  # the NaN ranked last
    step = jax.tree.map(jnp.subtract, strategy.mean(new), MEAN)
    jax.tree.map(lambda s, g: np.testing.assert_allclose(s, 0.01 * np.sign(g), rtol=1e-3, atol=1e-6), step, ascent)
    assert int(metrics["nonfinite/count"]) == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"rank": 0}, "EGGROLL: rank must be an integer >= 1, got 0"),
    ({"rank": 1.5}, "EGGROLL: rank must be an integer >= 1, got 1.5"),
    ({"sigma": -0.1}, "EGGROLL: sigma must be a finite number > 0, got -0.1"),
    ({"sigma": float("nan")}, "EGGROLL: sigma must be a finite number > 0, got nan"),
    ({"learning_rate": 0.0}, "EGGROLL: learning_rate must be a finite number > 0, got 0.0"),
    ({"optimizer": "adamm"}, "EGGROLL: optimizer must be an optax optimizer name, got 'adamm' (did you mean"),
    ({"member_chunk": 0}, "EGGROLL: member_chunk must be an integer >= 1, got 0"),
    ({"std_init": 0.1}, "EGGROLL: unknown hyperparameter(s) ['std_init']; it takes rank, sigma, learning_rate"),
    ({"use_antithetic_sampling": False}, "EGGROLL: unknown hyperparameter(s) ['use_antithetic_sampling']"),
])
def test_bad_hyperparameters_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError) as e:
        make_strategy("eggroll", 8, MEAN, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_population_size_and_shaping_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="EGGROLL samples antithetic pairs: pop_size must be an even integer >= 2, "
                                         "got 7"):
        make_strategy("eggroll", 7, MEAN)
    with pytest.raises(ValueError, match="Unknown fitness_shaping 'rank'; choose from"):
        make_strategy("EGGROLL", 8, MEAN, "rank")
    capsys.readouterr()
    argv = ["evolve", "--strategy=eggroll", "--strategy_kwargs={rank: 0}", "--pop_size=8", "--num_generations=1",
            "--run_dir", str(tmp_path / "r"), "--wandb=disabled", "--quiet"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "popeval evolve: error: EGGROLL: rank must be an integer >= 1, got 0", err


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """`(resumed, uninterrupted)` run directories: 4 generations resumed to 6, and 6 at once."""
    root = tmp_path_factory.mktemp("eggroll")
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(root / "resumed"), **QUIET))
    evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(resume=str(root / "resumed"), **QUIET))
    evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 6}), RunOptions(run_dir=str(root / "full"), **QUIET))
    return root / "resumed", root / "full"


@pytest.mark.xdist_group("eggroll-resumed-run")  # one worker where --dist loadgroup groups
def test_a_resumed_run_equals_the_uninterrupted_one(resumed_run):
    resumed, full = resumed_run
    rows = read_metrics(resumed, timing=False)
    assert [int(r["generation"]) for r in rows] == list(range(1, 7))
    assert rows == read_metrics(full, timing=False)
    # It learns: the population's mean fitness more than doubles, and the mean policy balances
    # the pole to the 50-step cap in every evaluation episode.
    fitness = [float(r["fitness/mean"]) for r in rows]
    assert max(fitness[-3:]) > 2 * fitness[0], fitness
    assert float(rows[-1]["eval/final_return"]) == 50.0
    assert_same_checkpoint(resumed, full)
    state = checkpoint.load_state_dict(full)["strategy"]
    assert set(state) == {"mean", "opt_state", "generation"} and int(state["generation"]) == 6


@pytest.mark.xdist_group("eggroll-resumed-run")  # one worker where --dist loadgroup groups
def test_the_best_member_is_kept_as_explicit_parameters(resumed_run):
    """The best member's parameters are that member of its generation's population, materialised."""
    from popeval.strategies import load_policy

    _, full = resumed_run
    best, mean = load_policy(full, "best").params, load_policy(full, "mean").params
    assert jax.tree.structure(best) == jax.tree.structure(mean)
    assert any(not np.array_equal(b, m) for b, m in zip(jax.tree.leaves(best), jax.tree.leaves(mean)))


@pytest.mark.slow  # a compilation of its own
def test_no_program_holds_a_members_matrix():
    """Memory: neither the evaluation nor the update (nor the best member's parameters, one
    member) holds a `(members, 64, 64)` array: the 64x64 kernel exists as the mean and as
    factors only (the optimised programs' buffers, 16 members on one device; rank 1, where
    `product="auto"` takes the shared product for this MLP)."""
    from popeval.strategies.run.programs import build, generation_step, init_state

    kwargs = {**TINY["strategy_kwargs"], "rank": 1}
    config = EvolveConfig.from_flat(**{**TINY, "pop_size": 16, "hidden_sizes": [64, 64], "compaction": False,
                             "strategy_kwargs": kwargs})
    run = build(config)
    step = generation_step(run, config, 1)
    texts = [lowered.compile().as_text() for _, lowered in step.lower(init_state(run, config), np.int32(0))]
    assert len(texts) >= 3  # ask, the evaluation pieces, update
    shapes = {m for text in texts for m in re.findall(r"\[(\d+),64,64\]", text)}
    assert shapes <= {"1"}, shapes


@pytest.mark.slow
def test_one_and_three_devices_give_identical_runs(tmp_path):
    """`tests/engine/test_sharding.py`'s check for EGGROLL: per-generation metrics, checkpoint and final
    evaluations of 10 members on 1 and 3 CPU devices (pieces of 4, 3, 3) are identical."""
    config = {**TINY, "env_name": "Pendulum-v1", "pop_size": 10, "common_random_numbers": False}
    env = subprocess_env()
    procs = {}
    for n in (1, 3):
        (tmp_path / str(n)).mkdir()
        procs[n] = subprocess.Popen([sys.executable, "-c", SCRIPT, json.dumps({"eggroll": config})],
                                    cwd=tmp_path / str(n), env={**env, "JAX_NUM_CPU_DEVICES": str(n)}, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for n, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{n} device(s):\n{out}"
    one, three = tmp_path / "1" / "eggroll", tmp_path / "3" / "eggroll"
    assert json.loads((three / "result.json").read_text())["devices"] == 3
    assert read_metrics(one, timing=False) == read_metrics(three, timing=False)
    assert_same_checkpoint(one, three)
    results = [json.loads((d / "result.json").read_text()) for d in (one, three)]
    for k in ("mean_policy_return", "best_policy_return", "best_fitness"):
        assert results[0][k] == results[1][k], k


def _learning():
    from experiments.learning import comparisons

    return comparisons


def test_the_learning_table_gives_median_range_and_solved_generations():
    learning = _learning()
    rows = [{"comparison": "acrobot", "setup": "Acrobot-v1 (...)", "strategy": s, "seed": seed, "return": r,
             "solved_at": at, "env_steps": 1e6, "wall_s": 2.0}
            for s, seed, r, at in (("openai_es", 0, -90.0, 5), ("openai_es", 1, -80.0, None),
                                   ("openai_es", 2, -85.0, 7), ("eggroll", 0, -70.0, 3))]
    lines = learning.table(rows).splitlines()
    assert lines[2] == "| Acrobot-v1 (...) | openai_es | -85.0 (-90.0 to -80.0) | 5, -, 7 | 1.0M | 2 s |"
    assert lines[3].startswith("| Acrobot-v1 (...) | eggroll | -70.0 (-70.0 to -70.0) | 3 |")
    rows[-1]["solved_s"] = 41.6
    assert learning.table(rows).splitlines()[3].startswith("| Acrobot-v1 (...) | eggroll | -70.0 (-70.0 to -70.0) "
                                                           "| 3 (42 s) |")
    with pytest.raises(SystemExit):
        learning.main(["nope"])


@pytest.mark.slow
def test_the_learning_comparison_runs_every_strategy_from_one_config(monkeypatch):
    learning = _learning()
    tiny = {k: v for k, v in TINY.items() if not k.startswith("strategy")}
    monkeypatch.setitem(learning.COMPARISONS, "tiny", ("cartpole.yaml", tiny))
    rows = learning.main(["tiny", "--seeds", "0"])
    assert [r["strategy"] for r in rows] == ["openai_es", "eggroll", "eggroll r=4"]
    assert all(r["generations"] <= 4 and r["setup"].startswith("CartPole-v1 (MLP 8, 8 x 2") for r in rows)
