"""The per-member form of the Gaussian strategies (`Strategy.members`): members sampled from
(key, index) alone, and a chunked tell from the fitness vector that equals `Strategy.tell`
(evosax's update) on the sampled population without ever holding that population.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval.strategies import make_strategy

#: A pytree solution with 10 parameters over two leaves of different rank.
SOLUTION = {"w": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros((4,), jnp.float32)}
TARGET = jnp.linspace(-1.0, 1.0, 10)

#: (name, pop_size, member_chunk, make_strategy keywords): every optimizer / schedule /
#: shaping path of the three algorithms, with P a multiple of the chunk and not (antithetic
#: pairs are regenerated whole: P = 10 in chunks of 4 is 5 pairs in chunks of 2).
CASES = {
    "open_es-adam-lr_decay-10/4": ("Open_ES", 10, 4, {"lr_decay": 0.9, "lr_min": 0.01}),
    "open_es-plain-sgd-std_decay-64/16": ("Open_ES", 64, 16, {
        "optimizer": "sgd", "std_decay": 0.8, "std_min": 0.05, "use_antithetic_sampling": False,
        "fitness_shaping": "z_score"}),
    "snes-adam-10/4": ("SNES", 10, 4, {"std_init": 0.3}),
    "pgpe-adam-10/4": ("PGPE", 10, 4, {"std_init": 0.2, "learning_rate": 0.05}),
}


@functools.cache
def compiled(case: str):
    """The case's strategy and its jitted members.sample, members.tell and tell (shared by tests)."""
    name, pop_size, chunk, kwargs = CASES[case]
    strategy = make_strategy(name, pop_size, SOLUTION, member_chunk=chunk, **kwargs)
    return strategy, jax.jit(strategy.members.sample), jax.jit(strategy.members.tell), jax.jit(strategy.tell)


def flat(tree) -> jax.Array:
    """Leaves flattened and concatenated per member (leading axis), in sorted-key order."""
    return jnp.concatenate([x.reshape(x.shape[0], -1) for x in jax.tree.leaves(tree)], axis=1)


def fitness_of(population) -> jax.Array:
    """`-||x - target||^2` per member."""
    return -jnp.sum((flat(population) - TARGET) ** 2, axis=1)


def host_leaves(tree) -> list[np.ndarray]:
    """Leaves as numpy arrays (typed PRNG keys as their key data)."""
    def one(x):
        x = jnp.asarray(x)
        return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
    return [one(x) for x in jax.tree.leaves(tree)]


def assert_trees_close(actual, expected):
    """Same structure, shapes and dtypes; floats equal to float32 rounding, the rest exactly."""
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(host_leaves(actual), host_leaves(expected)):
        assert a.dtype == e.dtype and a.shape == e.shape
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("case", list(CASES))
def test_chunked_tell_equals_tell_on_the_sampled_population(case):
    """Three generations, fed forward: members.tell(state, key, f) equals
    tell(state, sample(state, key, arange(P)), f) in every leaf of the state (mean, std,
    optimizer state, best-so-far, counter, key) and in the metrics, with non-finite fitness."""
    strategy, sample, chunked_tell, tell = compiled(case)
    pop_size, chunk = strategy.pop_size, CASES[case][2]
    assert strategy.members.chunk == chunk
    state = strategy.init(jax.random.key(0), SOLUTION)
    for generation in range(3):
        key = jax.random.key(100 + generation)
        population = sample(state, key, jnp.arange(pop_size))
        fitness = fitness_of(population)
        if generation == 1:  # diverged members, and the best member last (the last chunk)
            fitness = fitness.at[jnp.array([0, 3])].set(jnp.array([jnp.nan, -jnp.inf]))
            fitness = fitness.at[pop_size - 1].set(10.0)
        # evosax's ask leaves these algorithms' state as it is (tested below): tell takes `state`.
        expected, expected_metrics = tell(state, population, fitness)
        # The state keeps its types (no weak types): a jitted loop compiles once.
        assert jax.eval_shape(chunked_tell, state, key, fitness)[0] == jax.eval_shape(lambda s: s, state)
        state, metrics = chunked_tell(state, key, fitness)
        assert_trees_close(state, expected)
        assert_trees_close(metrics, expected_metrics)
        if generation == 1:
            assert int(metrics["nonfinite/count"]) == 2
            # The best member, regenerated inside tell, is the sampled one bit for bit.
            np.testing.assert_array_equal(state.evo_state.best_solution, flat(population)[pop_size - 1])
    assert int(state.evo_state.generation_counter) == 3
    assert all(np.isfinite(x).all() for x in host_leaves(state.evo_state))


@pytest.mark.parametrize("name", ["Open_ES", "SNES", "PGPE"])
def test_ask_leaves_the_state_unchanged(name):
    """What members.tell relies on: evosax's ask returns these algorithms' state as it was."""
    strategy = make_strategy(name, 8, SOLUTION)
    state = strategy.init(jax.random.key(0), SOLUTION)
    _, asked = strategy.ask(jax.random.key(1), state)
    for a, b in zip(host_leaves(asked), host_leaves(state)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["open_es-adam-lr_decay-10/4", "open_es-plain-sgd-std_decay-64/16",
                                  "snes-adam-10/4", "pgpe-adam-10/4"])
def test_a_subset_of_members_is_the_full_samples_rows_bit_for_bit(case):
    """Any members, any number of them (one included): the rows of the full sample, bit for
    bit, about a non-zero mean. Pairs (i, i + P/2) mirror each other where antithetic."""
    strategy, sample, _, _ = compiled(case)
    pop_size, half = strategy.pop_size, strategy.pop_size // 2
    state = strategy.init(jax.random.key(0), SOLUTION)
    mean = jnp.linspace(-3.0, 2.0, 10)
    state = state.replace(evo_state=state.evo_state.replace(mean=mean))
    key = jax.random.key(5)
    full = np.asarray(flat(sample(state, key, jnp.arange(pop_size))))
    for members in ([pop_size - 3], [pop_size - 1, 2, half]):
        rows = flat(sample(state, key, jnp.array(members, jnp.int32)))
        np.testing.assert_array_equal(np.asarray(rows), full[members])
    noise = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), (10,)))(jnp.arange(pop_size))
    std = np.asarray(state.evo_state.std)
    plus, minus = full[:half] - np.asarray(mean), full[half:] - np.asarray(mean)
    if strategy.name == "PGPE" or CASES[case][3].get("use_antithetic_sampling", strategy.name == "Open_ES"):
        np.testing.assert_allclose(plus, -minus, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(plus, std * np.asarray(noise[:half]), rtol=1e-5, atol=1e-6)
    else:  # independent members: member i is normal(fold_in(key, i))
        assert np.abs(plus + minus).min() > 1e-4
        np.testing.assert_allclose(full - np.asarray(mean), std * np.asarray(noise), rtol=1e-5, atol=1e-6)
    other = np.asarray(flat(sample(state, jax.random.key(6), jnp.arange(pop_size))))
    assert not np.any(other == full)  # another key, other members


def test_members_are_gaussian_around_the_mean():
    """Many members: per dimension the strategy's mean and std (loose), dimensions independent."""
    pop_size, std = 4096, 0.3
    solution = jnp.full((8,), 2.0)
    strategy = make_strategy("SNES", pop_size, solution, std_init=std)
    state = strategy.init(jax.random.key(0), solution)
    x = np.asarray(jax.jit(strategy.members.sample)(state, jax.random.key(1), jnp.arange(pop_size)))
    assert x.shape == (pop_size, 8)
    np.testing.assert_allclose(x.mean(axis=0), 2.0, atol=4 * std / np.sqrt(pop_size))
    np.testing.assert_allclose(x.std(axis=0), std, rtol=0.05)
    assert np.abs(np.corrcoef(x.T) - np.eye(8)).max() < 0.1


#: D for the memory tests, and the bytes of a population of 16384 such members.
MEMORY_DIMS = 2000
POPULATION_BYTES = 16384 * MEMORY_DIMS * 4


def temp_bytes(name: str, pop_size: int, chunked: bool) -> int:
    """XLA's temporary buffers for the compiled members.tell (chunked) or tell at D = 2000."""
    solution = jnp.zeros((MEMORY_DIMS,), jnp.float32)
    strategy = make_strategy(name, pop_size, solution)
    assert strategy.members.chunk == 2**20 // MEMORY_DIMS  # the default: 524 members
    state = strategy.init(jax.random.key(0), solution)
    fitness = jax.ShapeDtypeStruct((pop_size,), jnp.float32)
    if chunked:
        lowered = jax.jit(strategy.members.tell).lower(state, jax.random.key(1), fitness)
    else:
        population = jax.ShapeDtypeStruct((pop_size, MEMORY_DIMS), jnp.float32)
        lowered = jax.jit(strategy.tell).lower(state, population, fitness)
    return lowered.compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("name", ["Open_ES", "SNES"])  # antithetic pairs, and single members
def test_chunked_tell_memory_does_not_grow_with_the_population(name):
    """P grows 16x: the chunked tell's buffers stay flat (one chunk of noise plus O(P))."""
    small, large = temp_bytes(name, 1024, chunked=True), temp_bytes(name, 16384, chunked=True)
    assert large < 1.5 * small, (small, large)
    assert large < POPULATION_BYTES / 4, (large, POPULATION_BYTES)


def test_tell_on_the_full_population_needs_memory_that_grows_with_it():
    """The contrast: tell on the materialised population holds P x D temporaries."""
    small, large = temp_bytes("Open_ES", 1024, chunked=False), temp_bytes("Open_ES", 16384, chunked=False)
    assert large > 4 * small, (small, large)
    assert large >= POPULATION_BYTES, (large, POPULATION_BYTES)


@pytest.mark.parametrize("name", ["CMA_ES", "SimpleGA", "ARS"])
def test_other_algorithms_have_no_member_form(name):
    assert make_strategy(name, 8, SOLUTION).members is None


def test_member_chunk_default_and_bad_values():
    """By default max(1, min(P, 2**20 // D)): a function of P and D only (not of devices)."""
    assert make_strategy("Open_ES", 64, SOLUTION).members.chunk == 64
    assert make_strategy("SNES", 64, jnp.zeros(2**19)).members.chunk == 2
    assert make_strategy("PGPE", 64, jnp.zeros(2**21)).members.chunk == 1
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="member_chunk"):
            make_strategy("Open_ES", 8, SOLUTION, member_chunk=bad)
