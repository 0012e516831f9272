"""Strategies: evosax's algorithms behind popeval's init / ask / tell (higher fitness is better).

Covers the pytree interface for every named algorithm, compile-once round trips of the
state, progress on a toy quadratic, fitness shaping, non-finite fitness, and bad arguments.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.strategies import (
    FITNESS_SHAPING,
    centered_rank,
    cma_es,
    make_strategy,
    openai_es,
    sanitize_fitness,
    z_score,
)

#: A pytree solution with 10 parameters over two leaves of different rank.
SOLUTION = {"w": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros((4,), jnp.float32)}
TARGET = jnp.linspace(-1.0, 1.0, 10)
NAMES = ["openai_es", "cma_es", "SNES", "PGPE", "ARS", "Sep_CMA_ES", "SimpleGA"]


def flat(tree) -> jax.Array:
    """Leaves flattened and concatenated in a fixed (sorted-key) order."""
    return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])


def quadratic_fitness(population) -> jax.Array:
    """`-||x - target||^2` per member: maximal (0) at the target."""
    return jax.vmap(lambda p: -jnp.sum((flat(p) - TARGET) ** 2))(population)


def host_leaves(tree) -> list[np.ndarray]:
    """Leaves as numpy arrays (typed PRNG keys as their key data)."""
    def one(x):
        x = jnp.asarray(x)
        return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
    return [one(x) for x in jax.tree.leaves(tree)]


def leaves_equal(a, b) -> bool:
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(host_leaves(a), host_leaves(b)))


def float_leaves(tree) -> list[np.ndarray]:
    return [x for x in host_leaves(tree) if np.issubdtype(x.dtype, np.floating)]


def avals(tree):
    """Shape, dtype and weak type of every leaf: what a jitted function is specialised on."""
    return jax.eval_shape(lambda t: t, tree)


@pytest.mark.parametrize("name", NAMES)
def test_ask_tell_on_a_pytree_keep_the_state_type(name):
    """Population: the solution's pytree with a leading pop_size axis. tell returns a state of
    exactly the input's types (no weak types), so a jitted ask/tell loop never retraces."""
    pop_size = 8
    strategy = make_strategy(name, pop_size, SOLUTION)
    assert strategy.pop_size == pop_size and strategy.num_dims == 10
    state = strategy.init(jax.random.key(0), SOLUTION)
    population, asked = jax.eval_shape(strategy.ask, jax.random.key(1), state)
    assert jax.tree.structure(population) == jax.tree.structure(SOLUTION)
    for leaf, ref in zip(jax.tree.leaves(population), jax.tree.leaves(SOLUTION)):
        assert leaf.shape == (pop_size,) + ref.shape and leaf.dtype == ref.dtype
    fitness = jax.ShapeDtypeStruct((pop_size,), jnp.float32)
    told, metrics = jax.eval_shape(strategy.tell, asked, population, fitness)
    assert avals(state) == asked == told
    assert metrics["nonfinite/count"].shape == ()
    mean = jax.eval_shape(strategy.mean, told)
    assert avals(SOLUTION) == mean


@pytest.mark.parametrize("factory", [openai_es, cma_es], ids=["openai_es", "cma_es"])
def test_mean_moves_toward_the_maximum_of_a_quadratic(factory):
    strategy = factory(16, SOLUTION)

    @jax.jit
    def run(key):
        def generation(state, key):
            population, state = strategy.ask(key, state)
            state, _ = strategy.tell(state, population, quadratic_fitness(population))
            return state, None

        state = strategy.init(key, SOLUTION)
        state, _ = jax.lax.scan(generation, state, jax.random.split(key, 40))
        return strategy.mean(state)

    start = float(jnp.linalg.norm(flat(SOLUTION) - TARGET))
    end = float(jnp.linalg.norm(flat(run(jax.random.key(0))) - TARGET))
    assert end < 0.25 * start, (start, end)


def test_fitness_shaping_functions():
    fitness = jnp.array([3.0, -1.0, 7.0, 7.0, 0.5, 100.0])
    ranks = np.asarray(centered_rank(fitness))
    assert ranks.min() == -0.5 and ranks.max() == 0.5
    np.testing.assert_allclose(ranks, [-0.1, -0.5, 0.2, 0.2, -0.3, 0.5], atol=1e-6)  # ties share
    z = np.asarray(z_score(fitness))
    assert abs(z.mean()) < 1e-5 and abs(z.std() - 1.0) < 1e-4
    assert np.array_equal(np.asarray(FITNESS_SHAPING["none"](fitness)), np.asarray(fitness))
    with pytest.raises(ValueError, match="fitness_shaping"):
        make_strategy("openai_es", 8, SOLUTION, fitness_shaping="rank")


@pytest.mark.parametrize("shaping", ["centered_rank", "z_score", "none"])
def test_population_based_mean_is_the_best_member_seen_on_raw_fitness(shaping):
    """SimpleGA's `mean` is evosax's best-so-far solution: it must follow the returns, not
    the shaped values (with centred ranks every generation's best scores the same 0.5)."""
    strategy = make_strategy("simple_ga", 16, SOLUTION, shaping, std_init=0.5)
    ask, tell = jax.jit(strategy.ask), jax.jit(strategy.tell)
    state = strategy.init(jax.random.key(0), SOLUTION)
    best = -np.inf
    for g in range(30):
        population, state = ask(jax.random.key(g), state)
        fitness = quadratic_fitness(population)
        state, _ = tell(state, population, fitness)
        best = max(best, float(fitness.max()))
    mean_fitness = float(quadratic_fitness(jax.tree.map(lambda x: x[None], strategy.mean(state)))[0])
    assert mean_fitness == best


@pytest.mark.parametrize("n", [2, 5, 256, 4096, 4097])
def test_centered_rank_equals_rankdata_with_ties(n):
    """Small populations rank by pairwise counts, large ones by sorting: both equal scipy's
    average-rank convention, bit for bit."""
    rng = np.random.default_rng(n)
    for fitness in (rng.normal(size=n), rng.integers(0, 4, size=n), np.zeros(n)):
        fitness = jnp.asarray(fitness, jnp.float32)
        expected = jax.jit(lambda f: (jax.scipy.stats.rankdata(f) - 1.0) / (n - 1) - 0.5)(fitness)
        assert np.array_equal(np.asarray(jax.jit(centered_rank)(fitness)), np.asarray(expected))


def test_shaping_is_applied_once_before_the_strategy():
    """z_score shaping == no shaping on z-scored fitness; with SGD the step is linear in it."""
    kw = dict(learning_rate=0.1, optimizer="sgd")
    strategies = {s: openai_es(8, SOLUTION, fitness_shaping=s, **kw) for s in ("z_score", "none")}
    tells = {s: jax.jit(strategy.tell) for s, strategy in strategies.items()}
    state = strategies["none"].init(jax.random.key(0), SOLUTION)
    population, state = strategies["none"].ask(jax.random.key(1), state)
    fitness = quadratic_fitness(population)
    step = lambda s, f: flat(strategies[s].mean(tells[s](state, population, f)[0]))  # noqa: E731
    np.testing.assert_allclose(step("z_score", fitness), step("none", z_score(fitness)), atol=1e-6)
    start = flat(strategies["none"].mean(state))
    delta1, delta2 = step("none", fitness) - start, step("none", 2.0 * fitness) - start
    assert float(jnp.abs(delta1).max()) > 0
    np.testing.assert_allclose(delta2, 2.0 * delta1, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "factory, shaping",
    [(openai_es, "centered_rank"), (openai_es, "z_score"), (cma_es, "none")],
    ids=["openai_es-centered_rank", "openai_es-z_score", "cma_es-none"],
)
def test_non_finite_fitness_is_counted_and_ranked_worst(factory, shaping):
    strategy = factory(8, SOLUTION, fitness_shaping=shaping)
    tell = jax.jit(strategy.tell)
    state = strategy.init(jax.random.key(0), SOLUTION)
    population, state = strategy.ask(jax.random.key(1), state)
    fitness = jnp.array([1.0, jnp.nan, 3.0, jnp.inf, 2.0, -jnp.inf, 5.0, 0.0])
    new, metrics = tell(state, population, fitness)
    assert int(metrics["nonfinite/count"]) == 3
    assert all(np.isfinite(x).all() for x in float_leaves(new))
    # Ranked worst: the same update as when those members had the (tied) lowest finite fitness
    # (rank-based updates: any value below the finite ones ranks the same; +inf must not rank
    # best). z-scores depend on the values, so there only finiteness is checked.
    if shaping != "z_score":
        worst = jnp.where(jnp.isfinite(fitness), fitness, -100.0)
        assert leaves_equal(new, tell(state, population, worst)[0])
        best = jnp.where(jnp.isfinite(fitness), fitness, 100.0)
        assert not leaves_equal(new, tell(state, population, best)[0])
    # All members diverged: still a finite state.
    new, metrics = tell(state, population, jnp.full(8, jnp.nan))
    assert int(metrics["nonfinite/count"]) == 8
    assert all(np.isfinite(x).all() for x in float_leaves(new))


def test_sanitize_fitness_puts_non_finite_below_every_finite_value():
    fitness = jnp.array([jnp.inf, -2.0, jnp.nan, 4.0, -jnp.inf])
    clean, count = sanitize_fitness(fitness)
    clean = np.asarray(clean)
    assert int(count) == 3 and np.isfinite(clean).all()
    np.testing.assert_array_equal(clean[[1, 3]], [-2.0, 4.0])
    assert clean[[0, 2, 4]].max() < -2.0


def test_unknown_strategy_names_close_matches():
    with pytest.raises(ValueError, match="Unknown strategy 'CMA_ESS'") as info:
        make_strategy("CMA_ESS", 8, SOLUTION)
    suggestion = str(info.value).split("Known")[0]
    assert re.search(r"did you mean .*'CMA_ES'", suggestion), str(info.value)
    # Aliases and spellings resolve to evosax's classes.
    assert make_strategy("sep-cma-es", 8, SOLUTION).name == "Sep_CMA_ES"
    assert openai_es(8, SOLUTION).name == "Open_ES" and cma_es(8, SOLUTION).name == "CMA_ES"


def test_bad_population_sizes_and_hyperparameters_raise():
    with pytest.raises(ValueError, match="even"):
        openai_es(7, SOLUTION)
    for name in ("openai_es", "cma_es", "SimpleGA"):
        with pytest.raises(ValueError, match="pop_size must be >= 2"):
            make_strategy(name, 1, SOLUTION)
    cma_es(7, SOLUTION)  # odd is fine without antithetic sampling
    with pytest.raises(ValueError, match="no_such_field"):
        make_strategy("cma_es", 8, SOLUTION, no_such_field=1.0)


def test_constructor_table_matches_the_installed_evosax():
    """popeval says in one table what each evosax constructor takes (evosax's public API does
    not); the table must agree with evosax's signatures and default shaping."""
    import inspect

    from evosax import algorithms
    from evosax.core import fitness_shaping

    from popeval.strategies.algorithms import evosax_adapter as strategy

    base = {"self", "population_size", "solution", "fitness_shaping_fn", "metrics_fn"}
    single_mean = {n: c for n, c in algorithms.algorithms.items() if not n.startswith("SV_")}
    assert set(strategy._CONSTRUCTOR) == set(single_mean)
    for name, cls in single_mean.items():
        sig = inspect.signature(cls.__init__).parameters
        assert strategy._CONSTRUCTOR[name] == tuple(k for k in sig if k not in base), name
        weighted = sig["fitness_shaping_fn"].default is fitness_shaping.weights_fitness_shaping_fn
        assert (name in strategy._WEIGHTED) == weighted, name


def test_multi_population_strategies_are_refused_clearly():
    with pytest.raises(ValueError, match="not supported"):
        make_strategy("SV_Open_ES", 8, SOLUTION)
