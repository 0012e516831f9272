"""Low-rank populations (`popeval.low_rank`, EGGROLL): the fitness path equals the trajectory
path bit for bit; results do not depend on the population size, the pieces on threads or the
device count; factors drawn inside the evaluation are the explicit ones; a member evaluated as
the shared product plus its correction equals the same member as explicit parameters to
float32 rounding (every family under `-m slow`), and evaluated member by member (`product`
"member", and "auto" for small policies) equals it to the bit; no `(P, n_in, n_out)` array is
compiled; the EGGROLL example learns CartPole."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import CNNPolicy, LowRankPopulation, LSTMPolicy, MLPPolicy, RolloutWrapper, layouts, low_rank, make
from popeval.compiler import options
from popeval.low_rank import Factors, draw_factors
from tests.helpers import subprocess_env

#: Network outputs through the shared product vs the explicit member: float32 rounding of
#: `x W + s (x B) A^T` against `x (W + s B A^T)`, relative to the output's magnitude.
OUTPUT_RTOL = 1e-5
#: Returns of short continuous-control episodes (Pendulum, 50 steps): the rounding above,
#: carried through the dynamics.
RETURN_RTOL = 1e-4


@pytest.fixture(scope="module")
def pendulum():
    """`(mean, wrapper, keys, drawn population of 16)` on Pendulum (continuous actions: a return
    carries every bit of every action), B = 3 episodes. The wrapper runs 176 members in two
    pieces on threads, fewer in one."""
    env, env_params = make("Pendulum-v1")
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(16,))
    mean = policy.init_params(jax.random.key(0), env, env_params)
    wrapper = RolloutWrapper(policy.apply, env=env, env_params=env_params, num_env_steps=50, devices=1, threads=2)
    keys = jax.random.split(jax.random.key(1), 3)
    pop = LowRankPopulation.from_key(mean, jax.random.key(2), sigma=0.2, rank=2, pop_size=16, product="shared")
    return mean, wrapper, keys, pop


def test_fitness_equals_the_trajectory_path_bit_for_bit_and_the_explicit_members_to_rounding(pendulum):
    """Fitness == trajectories to the bit (16 members x 3 episodes: chunks of 32 members, too
    few rows for the half width); the explicit members (`materialize`) within `RETURN_RTOL`."""
    mean, wrapper, keys, pop = pendulum
    fitness = wrapper.population_fitness(keys, pop)
    trajectories = wrapper.population_rollout(keys, pop)
    np.testing.assert_array_equal(fitness.returns, trajectories[-1])
    assert fitness.returns.shape == (16, 3) and trajectories[0].shape == (16, 3, 50, 3)
    assert len(np.unique(np.asarray(fitness.returns[:, 0]))) == 16, "the members differ"
    explicit = wrapper.population_fitness(keys, pop.materialize()).returns
    np.testing.assert_allclose(explicit, fitness.returns, rtol=RETURN_RTOL)


def test_auto_evaluates_small_policies_member_by_member_and_wide_ones_through_the_shared_product(pendulum):
    """`product="auto"`: the 3-16-1 MLP's rank-2 corrections cost more than a twelfth of its
    products, so its members are evaluated as explicit parameters, bit for bit `materialize`'s
    (fitness and trajectories); the rule's verdicts on the benchmark's policies."""
    mean, wrapper, keys, pop = pendulum
    auto = pop.replace(product="auto")
    assert pop.shared_product and not auto.shared_product
    explicit = wrapper.population_fitness(keys, pop.materialize()).returns
    np.testing.assert_array_equal(wrapper.population_fitness(keys, auto).returns, explicit)
    np.testing.assert_array_equal(wrapper.population_rollout(keys, auto)[-1], explicit)
    shared = wrapper.population_fitness(keys, pop).returns
    assert not np.array_equal(shared, explicit), "the shared product rounds apart"

    def mlp(sizes):
        return {f"Dense_{i}": {"kernel": jnp.zeros((m, n)), "bias": jnp.zeros(n)}
                for i, (m, n) in enumerate(zip(sizes, sizes[1:]))}

    verdicts = {(sizes, r): low_rank.cheap_corrections(mlp(sizes), r)
                for sizes in [(4, 32, 32, 2), (3, 32, 32, 1), (6, 64, 64, 3), (400, 256, 256, 6), (3, 256, 256, 1)]
                for r in (1, 4)}
    assert [s for s, shared in verdicts.items() if shared] == [((6, 64, 64, 3), 1), ((400, 256, 256, 6), 1),
                                                               ((400, 256, 256, 6), 4), ((3, 256, 256, 1), 1),
                                                               ((3, 256, 256, 1), 4)]


def test_explicit_factors_of_any_members_equal_the_drawn_ones(pendulum):
    """Members 6..15 as their own population, from the explicit factors `draw_factors` gives for
    their global indices: the same returns, bit for bit."""
    mean, wrapper, keys, pop = pendulum
    whole = np.asarray(wrapper.population_fitness(keys, pop).returns)
    factors = draw_factors(mean, jax.random.key(2), jnp.arange(6, 16), rank=2)
    part = wrapper.population_fitness(keys, LowRankPopulation.from_factors(mean, factors, sigma=0.2, product="shared"))
    np.testing.assert_array_equal(part.returns, whole[6:])


def test_results_do_not_depend_on_population_size_or_pieces_on_threads(pendulum):
    """176 members in two pieces on threads equal the two halves evaluated alone (the second as
    `from_key(members=88..175)`), and the first 16 equal the population of 16 (chunks of 64
    members rather than 32: another row count of the shared product)."""
    mean, wrapper, keys, pop = pendulum
    drawn = partial(LowRankPopulation.from_key, mean, jax.random.key(2), 0.2, 2, product="shared")
    both = wrapper.population_fitness(keys, drawn(pop_size=176))
    first, second = drawn(pop_size=88), drawn(members=jnp.arange(88, 176))
    halves = [np.asarray(wrapper.population_fitness(keys, p).returns) for p in (first, second)]
    np.testing.assert_array_equal(both.returns, np.concatenate(halves))
    np.testing.assert_array_equal(halves[0][:16], wrapper.population_fitness(keys, pop).returns)


def test_a_shared_products_rows_round_alike_from_64_rows_up():
    """The measured XLA:CPU property `layouts.SHARED_EPISODES` rests on: a row of `x @ W` has the
    same bits at every row count from 64 up (policy-sized `W`), so the fitness path's narrower
    chunks and smaller populations round a member's episodes as wider ones do."""
    if jax.default_backend() != "cpu":
        pytest.skip("a property of XLA:CPU's products, which only the CPU chunk minimum relies on")
    rng = np.random.default_rng(0)
    for k, n in [(3, 16), (32, 32), (400, 256)]:
        x = jnp.asarray(rng.normal(size=(1024, k)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
        product = jax.jit(jnp.matmul, compiler_options=options())
        rows = [np.asarray(product(x[:m], w))[:64] for m in (layouts.SHARED_EPISODES, 96, 256, 1024)]
        assert all(np.array_equal(r, rows[0]) for r in rows), (k, n)


def test_draws_antithetic_pairs_and_generations():
    mean = {"w": jnp.zeros((5, 3)), "b": jnp.zeros(3), "conv": jnp.zeros((2, 2, 1, 4))}
    key = jax.random.key(7)
    factors = draw_factors(mean, key, jnp.arange(6), rank=2, generation=3)
    assert factors["w"].a.shape == (6, 3, 2) and factors["w"].b.shape == (6, 5, 2)
    assert factors["conv"].a.shape == (6, 4, 2) and factors["conv"].b.shape == (6, 4, 2)
    assert factors["b"].shape == (6, 3)
    for leaf in ("w", "conv"):  # member 2k + 1 = -A, the same B: the exact negative perturbation
        np.testing.assert_array_equal(factors[leaf].a[1::2], -factors[leaf].a[0::2])
        np.testing.assert_array_equal(factors[leaf].b[1::2], factors[leaf].b[0::2])
    np.testing.assert_array_equal(factors["b"][1::2], -factors["b"][0::2])
    assert not np.array_equal(factors["b"][0], factors["b"][2]), "pairs draw independently"
    # Member 4's draws whatever else is drawn, and the generation changes them.
    alone = draw_factors(mean, key, jnp.asarray([4]), rank=2, generation=3)
    np.testing.assert_array_equal(alone["w"].a[0], factors["w"].a[4])
    other = draw_factors(mean, key, jnp.asarray([4]), rank=2, generation=4)
    assert not np.array_equal(other["w"].a[0], factors["w"].a[4])
    plain = draw_factors(mean, key, jnp.arange(2), rank=2, generation=3, antithetic=False)
    assert not np.array_equal(plain["b"][1], -plain["b"][0])
    # The explicit members: mean + sigma / sqrt(r) B A^T, mean + sigma E.
    pop = LowRankPopulation.from_key(mean, key, sigma=0.1, rank=2, pop_size=6, generation=3)
    explicit = pop.materialize()
    np.testing.assert_allclose(explicit["w"][5], 0.1 / np.sqrt(2) * factors["w"].b[5] @ factors["w"].a[5].T, rtol=1e-6)
    np.testing.assert_allclose(explicit["b"], 0.1 * factors["b"], rtol=1e-6)
    assert pop.pop_size == 6 and pop.materialize()["conv"].shape == (6, 2, 2, 1, 4)


def _outputs(policy, variables, obs, carry):
    """Every layer's output (flax's captured intermediates), the shared-product path's too."""
    key = jax.random.key(5)  # a sampled head's
    args = (obs, carry, key) if isinstance(policy, LSTMPolicy) else (obs, key)
    _, state = policy.apply(variables, *args, capture_intermediates=True, mutable=["intermediates"])
    return state["intermediates"]


POLICIES = {  # (environment, policy, its settings, the layers compared)
    "mlp": ("Breakout-MinAtar", MLPPolicy, {"hidden_sizes": (24, 16)}, ("Dense_0", "Dense_1", "Dense_2")),
    "cnn": ("Breakout-MinAtar", CNNPolicy, {"conv_channels": (8,), "hidden_sizes": (16,)},
            ("Conv_0", "Dense_0", "Dense_1")),
    "lstm": ("CartPole-v1", LSTMPolicy, {"hidden_size": 8, "head": "sampled"},
             ("Dense_0", "OptimizedLSTMCell_0", "Dense_1")),
}


@pytest.mark.parametrize("name", [pytest.param("mlp", marks=pytest.mark.slow), "cnn", "lstm"])  # cnn: Dense too
def test_layers_compute_the_shared_product_plus_the_correction(name):
    """Each layer of P = 6 members x B = 5 observations equals the explicit members' to float32
    rounding, and the compiled program holds no per-member copy of a kernel: the mean's product
    is shared, the members' corrections are rank r."""
    env_id, cls, kwargs, layers = POLICIES[name]
    env, env_params = make(env_id)
    policy = cls.for_env(env, env_params, **kwargs)
    space = env.observation_space(env_params)
    obs = jax.random.uniform(jax.random.key(3), (5, *space.shape))  # B = 5 observations
    obs = obs > 0.7 if space.dtype == jnp.bool_ else obs  # MinAtar's are boolean
    carry = jax.tree.map(lambda c: c + 0.3, policy.initialize_carry()) if cls is LSTMPolicy else None
    key = jax.random.key(0)
    mean = jax.jit(lambda: policy.init(key, obs[0], *((carry,) if cls is LSTMPolicy else ()), key))()
    # Rank 5: no kernel here has 5 outputs, so a factor `(6, n_in, 5)` is not mistaken for a kernel.
    pop = LowRankPopulation.from_key(mean, jax.random.key(2), sigma=0.3, rank=5, pop_size=6, product="shared")

    def shared(per_member, rest, obs):
        forward = lambda m, o: low_rank.apply(lambda p, o: _outputs(policy, p, o, carry), m, o)  # noqa: E731
        return jax.vmap(lambda m: jax.vmap(lambda o: forward(m, o))(obs),
                        in_axes=(low_rank.Member(None, 0, None, None),))(
            low_rank.members(per_member, rest))

    program = jax.jit(shared).lower(*low_rank.split(pop), obs).compile()
    got = program(*low_rank.split(pop), obs)
    want = jax.jit(lambda pop: jax.vmap(lambda p: jax.vmap(lambda o: _outputs(policy, p, o, carry))(obs))(
        pop.materialize()))(pop)
    for layer in layers:
        for g, w in zip(jax.tree.leaves(got[layer]["__call__"]), jax.tree.leaves(want[layer]["__call__"])):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=0, atol=OUTPUT_RTOL * float(jnp.abs(w).max()), err_msg=layer)
    per_member = {f"f32[6,{','.join(map(str, k.shape))}]" for k in jax.tree.leaves(mean) if k.ndim >= 2}
    assert not per_member & set(re.findall(r"f32\[[0-9,]+\]", program.as_text()))  # no member's kernel was formed


FAMILIES = [("CartPole-v1", MLPPolicy, {"hidden_sizes": (16,)}, 200),
            ("Catch-bsuite", MLPPolicy, {"hidden_sizes": (16,)}, None),
            ("Breakout-MinAtar", MLPPolicy, {"hidden_sizes": (16,)}, 200),
            ("Breakout-MinAtar", CNNPolicy, {"conv_channels": (8,), "hidden_sizes": (16,)}, 200),
            ("CartPole-v1", LSTMPolicy, {"hidden_size": 8}, 200),
            ("Pendulum-v1", MLPPolicy, {"hidden_sizes": (16,)}, 50),
            ("Pendulum-v1", MLPPolicy, {"hidden_sizes": (16,), "head": "sampled"}, 50),
            ("Acrobot-v1", MLPPolicy, {"hidden_sizes": (16,)}, 100),
            ("FourRooms-misc", MLPPolicy, {"hidden_sizes": (16,)}, 100),
            ("PointRobot-misc", MLPPolicy, {"hidden_sizes": (16,)}, 50)]


@pytest.mark.slow
@pytest.mark.parametrize("env_id, cls, kwargs, num_steps", FAMILIES,
                         ids=[f"{f[0]}-{f[1].__name__}-{f[2].get('head', 'greedy')}" for f in FAMILIES])
def test_every_family_low_rank_equals_explicit_and_fitness_equals_trajectories(env_id, cls, kwargs, num_steps):
    """The shared product: discrete actions the same at every step, continuous returns within
    `RETURN_RTOL`. Member by member (`product="member"`): the explicit members' trajectories to
    the bit. The fitness path equals the trajectory path bit for bit, with compaction and with
    observation normalisation."""
    env, env_params = make(env_id)
    policy = cls.for_env(env, env_params, **kwargs)
    mean = policy.init_params(jax.random.key(0), env, env_params)
    extra = {"init_carry": policy.initialize_carry()} if cls is LSTMPolicy else {}
    wrapper = RolloutWrapper(policy.apply, env=env, env_params=env_params, num_env_steps=num_steps, devices=1,
                             obs_normalization=True, **extra)
    pop = LowRankPopulation.from_key(mean, jax.random.key(2), sigma=0.1, rank=2, pop_size=16, product="shared")
    keys = jax.random.split(jax.random.key(1), 3)
    low, explicit = wrapper.population_rollout(keys, pop), wrapper.population_rollout(keys, pop.materialize())
    by_member = wrapper.population_rollout(keys, pop.replace(product="member"))
    for got, want in zip(by_member, explicit):
        np.testing.assert_array_equal(got, want)
    fitness = wrapper.population_fitness(keys, pop)
    np.testing.assert_array_equal(fitness.returns, low[-1])
    if jnp.issubdtype(low[1].dtype, jnp.integer):
        np.testing.assert_array_equal(low[1], explicit[1])
    else:
        np.testing.assert_allclose(low[-1], explicit[-1], rtol=RETURN_RTOL)


DEVICES_SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from popeval import LowRankPopulation, MLPPolicy, RolloutWrapper, make
    env, params = make("Acrobot-v1", max_steps_in_episode=200)
    policy = MLPPolicy.for_env(env, params, hidden_sizes=(16,))
    mean = policy.init_params(jax.random.key(0), env, params)
    pop = LowRankPopulation.from_key(mean, jax.random.key(2), sigma=0.3, rank=2, pop_size=10, product="shared")
    keys = jax.random.split(jax.random.key(1), 3)
    out = {}
    for n in (1, 2, 3, 4):
        w = RolloutWrapper(policy.apply, env=env, env_params=params, devices=n, obs_normalization=True)
        fit = w.population_fitness(keys, pop)
        out[n] = [np.asarray(fit.returns).tolist(), np.asarray(w.population_rollout(keys, pop)[-1]).tolist(),
                  np.asarray(fit.obs_stats.m2).tolist()]
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_results_do_not_depend_on_the_device_count():
    """Acrobot (chaotic) with normalised observations on 1 to 4 CPU devices, the mean replicated
    and the member indices split: identical returns, trajectories and statistics."""
    proc = subprocess.run([sys.executable, "-c", DEVICES_SCRIPT], capture_output=True, text=True, timeout=600,
                          env=subprocess_env(JAX_NUM_CPU_DEVICES="4"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["1"][0] == out["1"][1], "fitness != trajectories"
    assert all(out[n] == out["1"] for n in out)


def test_bad_factors_and_arguments_are_refused_in_a_line(pendulum):
    mean, wrapper, keys, pop = pendulum
    with pytest.raises(ValueError, match=r"Dense_0\.kernel .* needs Factors\(a=\(P, 16, r\), b=\(P, 3, r\)\)"):
        LowRankPopulation.from_factors(mean, jax.tree.map(lambda x: jnp.zeros((3,) + x.shape), mean), 0.1)
    factors = draw_factors(mean, jax.random.key(0), jnp.arange(3), rank=2)
    bad = jax.tree.map(lambda f: f, factors)
    bad["params"]["Dense_1"]["kernel"] = Factors(a=jnp.zeros((3, 1, 1)), b=jnp.zeros((3, 16, 1)))  # rank 1, not 2
    with pytest.raises(ValueError, match="same rank r"):
        LowRankPopulation.from_factors(mean, bad, 0.1)
    with pytest.raises(ValueError, match="not a pytree like the mean"):
        LowRankPopulation.from_factors(mean, {"params": {}}, 0.1)
    for kwargs, message in [({"pop_size": 4, "rank": 0}, "rank must be an integer >= 1"),
                            ({"pop_size": 4, "sigma": float("nan")}, "sigma must be a finite number"),
                            ({}, "either pop_size or members"), ({"pop_size": 0}, "pop_size must be an integer"),
                            ({"pop_size": 4, "product": "explicit"}, "product must be one of auto, shared, member")]:
        with pytest.raises(ValueError, match=message):
            LowRankPopulation.from_key(mean, jax.random.key(0), **{"sigma": 0.1, **kwargs})
    other = {"params": {"Dense_0": {"kernel": jnp.zeros((5, 16)), "bias": jnp.zeros(16)}}}  # not Pendulum's
    with pytest.raises(ValueError, match="LowRankPopulation.mean do not fit this policy"):
        wrapper.population_fitness(keys, LowRankPopulation.from_key(other, jax.random.key(0), 0.1, pop_size=4))


@pytest.mark.slow  # the library's update is tested in test_eggroll.py; docs/rollouts.md runs the loop
def test_eggroll_example_learns_cartpole():
    """`python -m experiments.examples eggroll_es`: its generation (draws, `population_fitness` of a
    `LowRankPopulation` inside `jax.jit`, the update) reaches a return of 400 in 20 generations."""
    from experiments.examples import eggroll_es

    assert eggroll_es.main(["--generations", "20"]) >= 400


def test_other_layers_read_the_members_own_parameters():
    """A layer the interceptor does not know (`nn.Embed`'s table, a matrix) sees the member's
    parameter itself, `W + sigma / sqrt(r) B A^T`."""

    class Table(nn.Module):
        @nn.compact
        def __call__(self, index):
            return nn.Embed(4, 3)(index)

    table = Table()
    mean = table.init(jax.random.key(0), jnp.zeros((), jnp.int32))
    pop = LowRankPopulation.from_key(mean, jax.random.key(1), sigma=0.5, rank=1, pop_size=4, product="shared")
    members = low_rank.members(*low_rank.split(pop))
    got = jax.vmap(lambda m: low_rank.apply(table.apply, m, jnp.asarray(2)),
                   in_axes=(low_rank.Member(None, 0, None, None),))(members)
    np.testing.assert_array_equal(got, pop.materialize()["params"]["Embed_0"]["embedding"][:, 2])
