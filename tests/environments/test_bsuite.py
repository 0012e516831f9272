"""Conformance of the bsuite environments with the `bsuite` package.

Every test steps bsuite's environment and ours side by side over many episodes, with random
and scripted action sequences. Our episodes come from one jitted `reset_env` + `step_env`
scan per environment configuration; bsuite's are driven from Python with its random number
generator replaced by `FedRNG`, which hands bsuite, call by call, the values our environment
drew from its keys (read from our reset state, or from the module's `transition_draws`), and
fails on any draw it was not given. Every observation (shape and value), reward, termination
(`timestep.last()` vs our `terminated`) and discount must agree. Integer-valued quantities are
compared exactly; bsuite computes `1 - t / length`, move costs and bonuses in float64, we in
float32, hence `ATOL` for those. Per-cell / per-arm mappings drawn from `mapping_seed` are
checked to equal bsuite's for the same seed, and the DeepSea test also injects a mapping
taken from a bsuite environment into our params.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bsuite.environments import bandit, catch, deep_sea, discounting_chain, memory_chain, mnist, umbrella_chain
from bsuite.utils import datasets

from popeval.environments import make
from popeval.environments.bsuite import deep_sea as our_deep_sea
from popeval.environments.bsuite import umbrella_chain as our_umbrella
from tests.helpers import REPO

ATOL = 1e-6  # float32 (ours) vs float64 (bsuite) arithmetic on values of magnitude <= 4


class FedRNG:
    """Stands in for a bsuite environment's `np.random.RandomState`.

    Returns the given values, per kind of call, in bsuite's call order; any other call fails.
    """

    def __init__(self, **draws):
        self.draws = {kind: list(values) for kind, values in draws.items()}

    def _next(self, kind):
        if not self.draws.get(kind):
            raise AssertionError(f"bsuite made a {kind} draw the test did not expect")
        return self.draws[kind].pop(0)

    def randint(self, *args, **kwargs):
        return self._next("randint")

    def rand(self):
        return self._next("rand")

    def randn(self):
        return self._next("randn")

    def binomial(self, n, p, size=None):
        return self._next("binomial" if size is None else "binomial_array")


def _episodes(env, draws, key_data, actions, params):
    """Our episodes, one per row of `actions` (E, T); `key_data` (E, T + 1, 2) uint32."""
    keys = jax.random.wrap_key_data(key_data)  # typed keys, to exercise them too

    def episode(keys, actions):
        obs0, state0 = env.reset_env(keys[0], params)

        def body(state, x):
            key, action = x
            obs, state, reward, _, info = env.step_env(key, state, action, params)
            drawn = draws(key) if draws is not None else None
            return state, ((obs, reward, info["terminated"], info["discount"]), drawn)

        steps, drawn = jax.lax.scan(body, state0, (keys[1:], actions))[1]
        return state0, obs0, steps, drawn

    # lax.map, not vmap: half the compile time, and these batches run in milliseconds anyway.
    return jax.lax.map(lambda x: episode(*x), (keys, actions))


@functools.cache
def _compiled(env, draws):
    return jax.jit(functools.partial(_episodes, env, draws))


@functools.cache
def _key_pool(seed, size=16384):
    """`size` keys split off `key(seed)`, as uint32 key data; one compile for every test."""
    split = jax.jit(lambda key: jax.random.key_data(jax.random.split(key, size)))
    return np.asarray(split(jax.random.key(seed)))


def ours(env, params, actions, seed, draws=None):
    """Our episodes, in one jitted call.

    Returns:
        (reset states, reset obs, (obs, reward, terminated, discount) per step,
        `draws(step_key)` per step or None), leaves with leading axes (E,) or (E, T).
    """
    num_episodes, num_steps = np.shape(actions)
    key_data = _key_pool(seed)[: num_episodes * (num_steps + 1)]
    assert len(key_data) == num_episodes * (num_steps + 1), "enlarge _key_pool"
    key_data = key_data.reshape(num_episodes, num_steps + 1, -1)
    run = _compiled(env, draws)
    return jax.device_get(run(key_data, jnp.asarray(actions, jnp.int32), params))


def side_by_side(env, params, bs_env, actions, reset_feed=lambda e, state0: {},
                 step_feed=lambda e, t, drawn: {}, draws=None, seed=0, atol=0.0):
    """Steps `bs_env` and `env` through the same episodes.

    Args:
        actions: (E, T) ints, T >= the natural episode length.
        reset_feed(e, state0) / step_feed(e, t, drawn): the `FedRNG` draws of bsuite's reset
            of episode e / of its step t, from our reset states / our `draws` of each step.
        draws: the environment module's `transition_draws` (a function of the step key).

    Returns:
        (number of transitions compared, bsuite's return and last reward of each episode).
    """
    state0, obs0, (obs, reward, terminated, discount), drawn = ours(env, params, actions, seed, draws)
    actions = np.asarray(actions)
    # bsuite's side, stored and compared at the end: (E,) and (E, T) arrays; steps after
    # bsuite's episode ended stay NaN and are not compared.
    bs_obs0 = np.full(obs0.shape, np.nan)
    bs_obs = np.full(obs.shape, np.nan)
    bs_reward, bs_last, bs_discount = (np.full(reward.shape, np.nan) for _ in range(3))
    for e in range(actions.shape[0]):
        bs_env._rng = FedRNG(**reset_feed(e, state0))
        ts = bs_env.reset()
        assert ts.observation.shape == obs0.shape[1:], (ts.observation.shape, obs0.shape)
        bs_obs0[e] = ts.observation
        for t in range(actions.shape[1]):
            bs_env._rng = FedRNG(**step_feed(e, t, drawn))
            ts = bs_env.step(int(actions[e, t]))
            assert ts.observation.shape == obs.shape[2:], (ts.observation.shape, obs.shape)
            bs_obs[e, t], bs_reward[e, t], bs_last[e, t], bs_discount[e, t] = (
                ts.observation, ts.reward, ts.last(), ts.discount)
            if ts.last():
                break
        else:
            raise AssertionError(f"episode {e}: bsuite's episode did not end within {actions.shape[1]} steps")
    compared = ~np.isnan(bs_reward)
    _check("reset obs", obs0, bs_obs0, np.ones(len(obs0), bool), atol, actions)
    _check("obs", obs, bs_obs, compared, atol, actions)
    _check("reward", reward, bs_reward, compared, atol, actions)
    _check("terminated vs bsuite's last()", terminated, bs_last, compared, 0, actions)
    _check("discount", discount, bs_discount, compared, 0, actions)
    episode_returns = np.where(compared, bs_reward, 0).sum(axis=1)
    last_rewards = bs_reward[np.arange(len(actions)), compared.sum(axis=1) - 1]
    return int(compared.sum()), episode_returns, last_rewards


def _check(what, mine, theirs, compared, atol, actions):
    """`mine` == `theirs` (to `atol`) wherever `compared` (the leading axes); names the first miss."""
    mine = np.asarray(mine, np.float64).reshape(compared.shape + (-1,))
    theirs = theirs.reshape(compared.shape + (-1,))
    bad = compared & ~(np.abs(mine - theirs) <= atol).all(axis=-1)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        where = f"episode {at[0]} reset" if len(at) == 1 else (
            f"episode {at[0]} step {at[1]} (actions {actions[at[0], :at[1] + 1].tolist()})")
        raise AssertionError(
            f"{what} differs at {bad.sum()} places, first at {where}: ours "
            f"{mine[at].tolist()} != bsuite {theirs[at].tolist()}"
        )


def reset_states(env, params, shape, seed, draws=None):
    """Our reset states of `side_by_side(..., actions of this shape, seed)`'s episodes."""
    return ours(env, params, np.zeros(shape, np.int32), seed, draws)[0]


def random_actions(num_actions, shape, seed=0):
    return np.random.default_rng(seed).integers(0, num_actions, shape).astype(np.int32)


def assert_frequency(x, p, tol, what):
    """Where bsuite draws, we draw from the same distribution: the side-by-side comparison
    feeds bsuite our values, so it cannot see the distribution. `tol` is >= 4 standard
    errors for the sample sizes used (the keys are fixed, so this never flakes)."""
    assert abs(np.mean(x) - p) < tol, f"{what}: frequency {np.mean(x):.3f}, expected {p}"


# --------------------------------------------------------------------------------- Catch
@pytest.mark.parametrize("rows, columns", [(10, 5), (3, 7), (2, 1)])
def test_catch(rows, columns):
    env, params = make("Catch-bsuite", rows=rows, columns=columns)
    shape = (1000, rows - 1)
    ball_x = reset_states(env, params, shape, seed=1).ball_x
    for column in range(columns):
        assert_frequency(ball_x == column, 1 / columns, 0.05, f"ball in column {column}")
    actions = random_actions(3, shape)
    for e in range(200):  # chase the ball (bsuite's paddle starts at columns // 2) ...
        offset = int(ball_x[e]) - columns // 2
        actions[e] = 1
        actions[e, : min(abs(offset), shape[1])] = 2 if offset > 0 else 0
    actions[200:250], actions[250:300] = 0, 2  # ... or push against a wall
    num, _, finals = side_by_side(env, params, catch.Catch(rows=rows, columns=columns), actions,
                                  reset_feed=lambda e, s: {"randint": [s.ball_x[e]]}, seed=1)
    assert num == shape[0] * shape[1]
    reachable = np.abs(ball_x[:200] - columns // 2) <= shape[1]
    assert (finals[:200][reachable] == 1).all() and reachable.any()
    if columns > 1:
        assert (finals == -1).any()


# ------------------------------------------------------------------------------- DeepSea
def test_deep_sea_default_mapping_is_bsuites():
    for size in (1, 5, 10, 20):
        for seed in (0, 7, 42):
            _, params = make("DeepSea-bsuite", size=size, mapping_seed=seed)
            expected = deep_sea.DeepSea(size, mapping_seed=seed)._action_mapping
            np.testing.assert_array_equal(params.action_mapping, expected, err_msg=f"size {size} seed {seed}")
    assert make("DeepSea-bsuite")[1].action_mapping.shape == (10, 10)
    with pytest.warns(UserWarning, match="debug mode"):
        expected = deep_sea.DeepSea(4, randomize_actions=False)._action_mapping
    _, params = make("DeepSea-bsuite", size=4, randomize_actions=False)
    np.testing.assert_array_equal(params.action_mapping, expected)


@pytest.mark.filterwarnings("ignore:Environment is in debug mode")
@pytest.mark.parametrize(
    "size, deterministic, cost, randomize",
    [(10, True, 0.01, True), (5, False, 0.05, True), (1, False, 0.01, True), (6, True, 0.0, False)],
)
def test_deep_sea(size, deterministic, cost, randomize):
    env, params = make("DeepSea-bsuite", size=size, randomize_actions=randomize,
                       deterministic=deterministic, unscaled_move_cost=cost)
    bs_env = deep_sea.DeepSea(size, deterministic=deterministic, unscaled_move_cost=cost,
                              randomize_actions=randomize, mapping_seed=1234)
    # Inject bsuite's mapping (drawn from another seed than our default's) into our params.
    mapping = np.asarray(bs_env._action_mapping, np.int32)
    if randomize and size > 1:
        assert not np.array_equal(mapping, params.action_mapping)
    params = params.replace(action_mapping=jnp.asarray(mapping))
    shape, seed, draws = (400, size), 2, our_deep_sea.transition_draws
    actions = random_actions(2, shape)
    actions[:100] = np.diag(mapping)  # the optimal path: "right" all the way down the diagonal
    actions[100:120], actions[120:140] = 0, 1
    num, returns, _ = side_by_side(
        env, params, bs_env, actions, seed=seed, atol=ATOL, draws=draws,
        step_feed=lambda e, t, d: {"randn": [float(d[0][e, t])], "rand": [float(d[1][e, t])]},
    )
    assert num == shape[0] * size
    treasure = 1 - cost  # the optimal path's return, without noise or slips
    if deterministic:
        np.testing.assert_allclose(returns[:100], treasure, atol=ATOL)
    else:  # some right moves slipped (u <= 1/size) and the end rewards were noisy
        noise, u = ours(env, params, actions, seed, draws)[3]
        assert (u[:100] <= 1 / size).any() and not np.allclose(returns[:100], treasure)
        assert_frequency(u <= 1 / size, 1 / size, 0.04, "slip (u <= 1/size)")
        assert_frequency(noise, 0.0, 0.1, "noise mean")
        assert_frequency(noise**2, 1.0, 0.15, "noise variance")


# --------------------------------------------------------------------------- MemoryChain
@pytest.mark.parametrize("memory_length, num_bits", [(1, 1), (5, 1), (3, 4)])
def test_memory_chain(memory_length, num_bits):
    env, params = make("MemoryChain-bsuite", memory_length=memory_length, num_bits=num_bits)
    bs_env = memory_chain.MemoryChain(memory_length=memory_length, num_bits=num_bits, seed=0)
    shape = (600, memory_length + 1)
    state0 = reset_states(env, params, shape, seed=3)
    for bit in range(num_bits):
        assert_frequency(state0.context[:, bit], 0.5, 0.08, f"context bit {bit}")
        assert_frequency(state0.query == bit, 1 / num_bits, 0.08, f"query {bit}")
    answer = state0.context[np.arange(shape[0]), state0.query]
    actions = random_actions(2, shape)
    actions[:200, -1], actions[200:400, -1] = answer[:200], 1 - answer[200:400]
    # The observations compared step by step pin bsuite's timing: the context is shown at
    # reset and again after the first step, the query after step memory_length - 1.
    num, _, finals = side_by_side(
        env, params, bs_env, actions, seed=3, atol=ATOL,
        reset_feed=lambda e, s: {"binomial_array": [s.context[e]], "randint": [s.query[e]]},
    )
    assert num == shape[0] * shape[1]
    assert (finals[:200] == 1).all() and (finals[200:400] == -1).all()


# ------------------------------------------------------------------------- UmbrellaChain
@pytest.mark.parametrize("chain_length, n_distractor", [(1, 0), (10, 0), (20, 20)])
def test_umbrella_chain(chain_length, n_distractor):
    env, params = make("UmbrellaChain-bsuite", chain_length=chain_length, n_distractor=n_distractor)
    bs_env = umbrella_chain.UmbrellaChain(chain_length=chain_length, n_distractor=n_distractor, seed=0)
    shape, seed = (400, chain_length), 4
    draws = functools.partial(our_umbrella.transition_draws, n_distractor=n_distractor)
    state0, _, _, (coin, distractors) = ours(env, params, np.zeros(shape), seed, draws)
    need, has = state0.need_umbrella, state0.has_umbrella
    assert_frequency(need, 0.5, 0.1, "need_umbrella")
    assert_frequency(has, 0.5, 0.1, "has_umbrella at reset")
    assert_frequency(need == has, 0.5, 0.1, "need_umbrella == has_umbrella")
    assert_frequency(coin, 0.5, 0.1, "reward coin")
    if n_distractor:
        assert_frequency(state0.distractors, 0.5, 0.02, "distractors at reset")
        assert_frequency(distractors, 0.5, 0.01, "distractors")
    actions = random_actions(2, shape)
    actions[:100, 0], actions[100:200, 0] = need[:100], 1 - need[100:200]
    num, returns, finals = side_by_side(
        env, params, bs_env, actions, seed=seed, atol=ATOL, draws=draws,
        reset_feed=lambda e, s: {
            "binomial": [s.need_umbrella[e], s.has_umbrella[e]],
            "binomial_array": [s.distractors[e]],
        },
        step_feed=lambda e, t, d: {"binomial": [d[0][e, t]], "binomial_array": [d[1][e, t]]},
    )
    assert num == shape[0] * shape[1]
    assert (finals[:100] == 1).all() and (finals[100:200] == -1).all()
    if chain_length > 2:  # the noisy +-1 rewards of the earlier steps came through
        assert len(np.unique(returns - finals)) > 2


# ---------------------------------------------------------------------- DiscountingChain
def test_discounting_chain():
    env, params = make("DiscountingChain-bsuite")
    assert params.max_steps_in_episode == 100
    actions = random_actions(5, (15, 100))
    actions[:, 0] = np.arange(15) % 5  # every arm, three times
    for mapping_seed in (0, 3, 7, 12):  # 7 and 12 exercise bsuite's `mapping_seed % 5`
        bs_env = discounting_chain.DiscountingChain(mapping_seed=mapping_seed)
        num, returns, _ = side_by_side(env, params.replace(mapping_seed=mapping_seed), bs_env,
                                       actions, seed=mapping_seed, atol=ATOL)
        assert num == 15 * 100
        bonus_arm = mapping_seed % 5
        np.testing.assert_allclose(returns, np.where(actions[:, 0] == bonus_arm, 1.1, 1.0))


# -------------------------------------------------------------------------- SimpleBandit
@pytest.mark.parametrize("num_actions", [11, 3, 1])
def test_simple_bandit(num_actions):
    env, _ = make("SimpleBandit-bsuite", num_actions=num_actions)
    actions = np.tile(np.arange(num_actions, dtype=np.int32), 3)[:, None]  # every arm
    orders = set()
    for mapping_seed in range(6):
        _, params = make("SimpleBandit-bsuite", num_actions=num_actions, mapping_seed=mapping_seed)
        bs_env = bandit.SimpleBandit(mapping_seed=mapping_seed, num_actions=num_actions)
        np.testing.assert_allclose(params.rewards, bs_env._rewards, rtol=0, atol=ATOL)
        num, returns, _ = side_by_side(env, params, bs_env, actions, seed=mapping_seed, atol=ATOL)
        assert num == len(actions)
        orders.add(tuple(np.argsort(returns[:num_actions])))
    if num_actions > 2:  # the seed really shuffles the payouts
        assert len(orders) > 1


# --------------------------------------------------------------------------- MNISTBandit
def test_mnist_bandit(monkeypatch):
    """bsuite's own environment, its dataset loader patched to return the same digits
    (scikit-learn's, as the 0..255 uint8 pixels bsuite expects of MNIST)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = np.round(digits.images * 255 / 16).astype(np.uint8), digits.target.astype(np.uint8)
    monkeypatch.setattr(datasets, "load_mnist", lambda *a, **k: ((images, labels), (images, labels)))
    bs_env = mnist.MNISTBandit(fraction=0.5, seed=0)
    env, params = make("MNISTBandit-bsuite", images=images, labels=labels, fraction=0.5)
    shape, num_data = (2000, 1), len(labels) // 2
    index = reset_states(env, params, shape, seed=5).index
    assert index.min() >= 0 and num_data > index.max() > 0.99 * num_data
    assert abs(index.mean() - (num_data - 1) / 2) < 25  # 4 standard errors
    actions = random_actions(10, shape)
    actions[:500, 0] = labels[index[:500]]
    num, _, finals = side_by_side(env, params, bs_env, actions, seed=5,
                                  reset_feed=lambda e, s: {"randint": [s.index[e]]})
    assert num == shape[0]
    assert (finals[:500] == 1).all() and (finals[500:] == -1).any()


def test_mnist_bandit_ships_sklearn_digits(monkeypatch):
    """The default data are scikit-learn's digits, shipped with popeval: no scikit-learn at run
    time, and the same images (and labels) as `sklearn.datasets.load_digits()`."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    expected_images = (digits.images / 16.0).astype(np.float32)
    for name in [m for m in sys.modules if m == "sklearn" or m.startswith("sklearn.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing scikit-learn now fails
    env, params = make("MNISTBandit-bsuite")
    assert params.images.dtype == jnp.float32 and params.labels.dtype == jnp.int32
    np.testing.assert_array_equal(params.images, expected_images)
    np.testing.assert_array_equal(params.labels, digits.target)
    assert env.observation_space(params).shape == (8, 8) and env.num_actions == 10
    assert make("MNISTBandit-bsuite", fraction=0.25)[1].labels.shape == (int(0.25 * len(digits.target)),)
    # The observation of a reset is the drawn image, as bsuite shows it.
    obs, state = env.reset(jax.random.PRNGKey(3), params)
    np.testing.assert_array_equal(obs, expected_images[int(state.index)])

    # Float images are taken as they are.
    env, params = make("MNISTBandit-bsuite", images=np.full((3, 2, 4), 0.5), labels=[0, 9, 3])
    assert params.images.shape == (3, 2, 4) and float(params.images.max()) == 0.5
    assert env.observation_space(params).shape == (2, 4)


def test_mnist_digits_are_package_data():
    """`data/digits.npz` (uint8 images 0..16 and labels) is declared as package data."""
    import importlib.resources

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    path = importlib.resources.files("popeval.environments.bsuite") / "data" / "digits.npz"
    with path.open("rb") as f, np.load(f) as data:
        assert data["images"].dtype == data["labels"].dtype == np.uint8
        assert data["images"].shape == (1797, 8, 8) and data["images"].max() == 16
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]["popeval.environments.bsuite"]
    assert "data/digits.npz" in package_data


# ---------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "env_id, kwargs, match",
    [
        ("Catch-bsuite", {"rows": 1}, "rows"),
        ("Catch-bsuite", {"columns": 0}, "columns"),
        ("Catch-bsuite", {"rows": 4.5}, "rows"),
        ("DeepSea-bsuite", {"size": 0}, "size"),
        ("DeepSea-bsuite", {"mapping_seed": -1}, "mapping_seed"),
        ("MemoryChain-bsuite", {"memory_length": 0}, "memory_length"),
        ("MemoryChain-bsuite", {"num_bits": 0}, "num_bits"),
        ("UmbrellaChain-bsuite", {"chain_length": 0}, "chain_length"),
        ("UmbrellaChain-bsuite", {"n_distractor": -1}, "n_distractor"),
        ("DiscountingChain-bsuite", {"episode_len": 0}, "episode_len"),
        ("SimpleBandit-bsuite", {"num_actions": 0}, "num_actions"),
        ("SimpleBandit-bsuite", {"mapping_seed": 2**32}, "mapping_seed"),
        ("MNISTBandit-bsuite", {"fraction": 0.0}, "fraction"),
        ("MNISTBandit-bsuite", {"fraction": 1.5}, "fraction"),
        ("MNISTBandit-bsuite", {"fraction": 1e-4}, "keeps no image"),
        ("MNISTBandit-bsuite", {"images": np.full((2, 3, 3), 1.5), "labels": [0, 1]}, r"\[0, 1\]"),
        ("MNISTBandit-bsuite", {"images": np.zeros((2, 3, 3)), "labels": [0, 10]}, "labels"),
        ("MNISTBandit-bsuite", {"images": np.zeros((2, 3, 3)), "labels": [0]}, "labels"),
        ("MNISTBandit-bsuite", {"images": np.zeros((2, 9)), "labels": [0, 1]}, "shape"),
        ("MNISTBandit-bsuite", {"images": np.zeros((2, 3, 3))}, "both"),
    ],
)
def test_out_of_range_settings_raise(env_id, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(env_id, **kwargs)
