"""Sharding invariance: 1, 2, 3 and 4 devices give bit-identical runs.

Each device count runs in a fresh interpreter with `JAX_NUM_CPU_DEVICES` set before JAX is
imported. Tiny configs with pop_size=10, which the devices split as 10, 5+5, 4+3+3 and
3+3+2+2: OpenAI-ES on Pendulum with common random numbers (continuous returns, so any rounding
difference shows in the fitness), CMA-ES on CartPole with per-member episode keys and
observation normalisation (statistics merged across devices), and OpenAI-ES on Pendulum with
both of the latter, the default tier's one config; and the shipped CartPole config for six
generations (256 members x 8 episodes of up to 500 steps: a balancing pole amplifies a
last-bit difference, which a generation compiled as one program over the devices showed from
generation 2 on; `slow`). The per-generation metrics, the whole final checkpoint (strategy
state, key, best parameters, observation statistics) and the final evaluations must be
identical. `RolloutWrapper` is checked with `devices=n` in one interpreter with four CPU
devices. The default tier runs the evolve config on 1 and 3 devices (uneven pieces) and the
wrapper on 1 and 2; `-m slow` every count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from popeval import checkpoint
from tests.helpers import REPO, SCRIPT, computed_once, flatten, read_metrics, subprocess_env

DEVICE_COUNTS = (1, 2, 3, 4)
TINY = dict(
    env_kwargs={"max_steps_in_episode": 50}, pop_size=10, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
)
SHIPPED = yaml.safe_load((REPO / "experiments/configs/cartpole.yaml").read_text())
CONFIGS = {
    "openai_es": {**TINY, "env_name": "Pendulum-v1", "strategy": "openai_es"},
    "cma_es_obs_norm": {**TINY, "env_name": "CartPole-v1", "strategy": "cma_es", "obs_normalization": True,
                        "common_random_numbers": False, "seed": 3},
    # Continuous returns, per-member episode keys and merged observation statistics in one run.
    "openai_es_obs_norm": {**TINY, "env_name": "Pendulum-v1", "strategy": "openai_es", "obs_normalization": True,
                           "common_random_numbers": False},
    "cartpole_shipped": {**SHIPPED, "num_generations": 6, "eval_every": 3, "checkpoint_every": 3},
}
RESULT_KEYS = ("generations", "env_steps", "best_fitness", "mean_policy_return", "best_policy_return")

#: The configs, in groups that share their processes; the shipped config's group is `slow`.
TINY_NAMES = ("openai_es", "cma_es_obs_norm", "openai_es_obs_norm")
#: (configs, device counts): by default the one config with every mechanism on 1 and 3 devices
#: (uneven pieces); under `-m slow` every tiny config on every count, and the shipped config too.
GROUPS = [pytest.param((("openai_es_obs_norm",), (1, 3)), id="tiny"),
          pytest.param((TINY_NAMES, DEVICE_COUNTS), id="tiny-all", marks=pytest.mark.slow),
          pytest.param((("cartpole_shipped",), DEVICE_COUNTS), id="cartpole_shipped", marks=pytest.mark.slow)]


@pytest.fixture(scope="session", params=GROUPS)
def runs(request, tmp_path_factory):
    """`(names, {devices: directory})`: a group's configs run once per device count (processes in
    parallel)."""
    names, counts = request.param

    def compute(directory):
        env = subprocess_env()
        dirs, procs = {}, {}
        for n in counts:
            dirs[n] = directory / f"devices{n}"
            dirs[n].mkdir()
            procs[n] = subprocess.Popen(
                [sys.executable, "-c", SCRIPT, json.dumps({name: CONFIGS[name] for name in names})], cwd=dirs[n],
                env={**env, "JAX_NUM_CPU_DEVICES": str(n)}, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
        for n, proc in procs.items():
            out, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"{n} device(s):\n{out}"
        return {str(n): str(d) for n, d in dirs.items()}

    dirs = computed_once(tmp_path_factory, f"sharding-{request.param_index}", compute)
    return names, {int(n): Path(d) for n, d in dirs.items()}


@pytest.mark.xdist_group("sharding-runs")  # one worker where --dist loadgroup groups
def test_devices_used_as_asked(runs):
    names, dirs = runs
    for name in names:
        for n, root in dirs.items():
            assert json.loads((root / name / "result.json").read_text())["devices"] == n


@pytest.mark.xdist_group("sharding-runs")  # one worker where --dist loadgroup groups
def test_metrics_identical_across_device_counts(runs):
    names, dirs = runs
    for name in names:
        reference = read_metrics(dirs[1] / name, timing=False)
        assert len(reference) == CONFIGS[name]["num_generations"]
        assert len({r["fitness/mean"] for r in reference}) > 1  # the runs do something
        others = [n for n in dirs if n != 1]
        for n in others:
            assert read_metrics(dirs[n] / name, timing=False) == reference, f"{name}: {n} devices"
        results = {n: json.loads((dirs[n] / name / "result.json").read_text()) for n in dirs}
        for n in others:
            assert {k: results[n][k] for k in RESULT_KEYS} == {k: results[1][k] for k in RESULT_KEYS}


@pytest.mark.xdist_group("sharding-runs")  # one worker where --dist loadgroup groups
def test_checkpoint_identical_across_device_counts(runs):
    names, dirs = runs
    for name in names:
        reference = flatten(checkpoint.load_state_dict(dirs[1] / name))
        if CONFIGS[name].get("obs_normalization"):
            counts = [v for k, v in reference.items() if k.startswith("/obs_stats") and k.endswith("count")]
            assert counts and float(counts[0]) > 0, sorted(reference)  # statistics were gathered
        for n in (n for n in dirs if n != 1):
            other = flatten(checkpoint.load_state_dict(dirs[n] / name))
            assert other.keys() == reference.keys()
            for k in reference:
                np.testing.assert_array_equal(other[k], reference[k], err_msg=f"{name} {k}, {n} devices")


def test_replicated_state_round_trips_through_the_devices():
    """`replicate` -> a call -> `first` keeps every leaf (typed PRNG keys included) exactly."""
    import jax

    from popeval import sharding

    step = sharding.Replicated(lambda tree, seed: (tree, {"seed": seed}), jax.local_device_count())
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int32(7), "key": jax.random.key(5)}
    out, metrics = step(step.replicate(tree), step.replicate(np.int32(3)))
    back = step.first(out)
    np.testing.assert_array_equal(back["w"], tree["w"])
    assert back["n"] == 7 and back["n"].dtype == np.int32
    np.testing.assert_array_equal(jax.random.key_data(back["key"]), jax.random.key_data(tree["key"]))
    assert np.asarray(metrics["seed"]).tolist() == [3] * jax.local_device_count()


def test_compiler_options_on_cpu_and_an_xla_flags_override(monkeypatch):
    """In-process: `options()` reads `XLA_FLAGS` at each call."""
    import jax

    from popeval import compiler

    if jax.default_backend() != "cpu":
        pytest.skip("the CPU options; other backends keep XLA's defaults")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert compiler.options() == {"xla_backend_optimization_level": 1}
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=3")
    assert compiler.options() == {}


# ----------------------------------------------------------------------------- RolloutWrapper
#: A CPU call from Python runs P=10 as one-device pieces: 5+5 on 2 devices, 3+3+4 on 3, 2+3+2+3
#: on 4 (`sharding.split_members`); the evolve tests above cover 2 and 4 devices.
WRAPPER_DEVICE_COUNTS = (1, 2, 3, 4)
WRAPPER_CASES = {  # name -> (env id, RolloutWrapper kwargs)
    "Pendulum-v1": ("Pendulum-v1", {}),
    "Acrobot-v1": ("Acrobot-v1", {"env_kwargs": {"max_steps_in_episode": 200}, "obs_normalization": True}),
    "Catch-bsuite": ("Catch-bsuite", {}),
    "CartPole-v1": ("CartPole-v1", {"common_random_numbers": False}),
}
#: Acrobot (chaotic, normalised observations) on 1 and 2 devices by default (uneven pieces: the
#: evolve runs above and the `split_members` test); every case on every count under `-m slow`.
WRAPPER_PARAMS = [pytest.param((name, WRAPPER_DEVICE_COUNTS), id=name, marks=pytest.mark.slow)
                  for name in WRAPPER_CASES] + [pytest.param(("Acrobot-v1", (1, 2)), id="Acrobot-v1-1-2")]
WRAPPER_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from popeval import MLPPolicy, RolloutWrapper
    from popeval.environments import make
    out = {}
    for n in json.loads(sys.argv[2]):
        out[n] = {}
        for name, (env_id, kwargs) in json.loads(sys.argv[1]).items():
            env, params = make(env_id, **kwargs.get("env_kwargs", {}))
            policy = MLPPolicy.for_env(env, params, hidden_sizes=(16,))
            pop = jax.vmap(lambda k: policy.init_params(k, env, params))(jax.random.split(jax.random.key(0), 10))
            w = RolloutWrapper(policy.apply, env_name=env_id, devices=n, **kwargs)
            assert len(w.devices) == n
            keys = jax.random.split(jax.random.key(1), 3)
            fit = w.population_fitness(keys, pop)
            traj = w.population_rollout(keys, pop)
            assert fit.returns.shape == (10, 3) and traj[0].shape[:3] == (10, 3, w.num_env_steps)
            out[n][name] = {
                "returns": np.asarray(fit.returns).tolist(), "lengths": np.asarray(fit.lengths).tolist(),
                "cum_return": np.asarray(traj[-1]).tolist(), "obs": float(np.asarray(traj[0]).sum()),
                "stats": None if fit.obs_stats is None else np.asarray(fit.obs_stats.m2).tolist()}
    print(json.dumps(out))
""")


@pytest.fixture(scope="session", params=WRAPPER_PARAMS)
def wrapper_runs(request, tmp_path_factory):
    """`(name, {devices: results})`: population_fitness / population_rollout of P=10 members (5+5
    on 2 devices, 3+3+4 on 3) with `devices=` each count, in one interpreter with four CPU devices."""
    name, counts = request.param[0], json.dumps(request.param[1])

    def compute(directory):
        env = {**subprocess_env(), "JAX_NUM_CPU_DEVICES": str(max(WRAPPER_DEVICE_COUNTS))}
        case = json.dumps({name: WRAPPER_CASES[name]})
        out = subprocess.run([sys.executable, "-c", WRAPPER_SCRIPT, case, counts], env=env,
                             text=True, capture_output=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    results = computed_once(tmp_path_factory, f"wrapper-{request.param_index}", compute)
    return name, {int(n): by_name[name] for n, by_name in results.items()}


def test_wrapper_results_identical_across_device_counts(wrapper_runs):
    """Bit-identical fitness, trajectories and observation statistics on 1, 2, 3 and 4
    devices, chaotic tasks (CartPole's 500 steps, Acrobot) included: every device runs the same
    one-device program on its piece. (A program over several devices, `shard_map`, rounded a
    CartPole population differently: docs/exactness.md.)"""
    name, results = wrapper_runs
    one = results[1]
    assert one["returns"] == one["cum_return"], "fitness != trajectory on one device"
    assert len(results) > 1
    for n in results:
        assert results[n] == one, f"{name}: {n} devices differ from 1"


def test_wrapper_devices_argument_is_checked():
    from popeval.rollout import RolloutWrapper

    with pytest.raises(ValueError, match="JAX_NUM_CPU_DEVICES"):
        RolloutWrapper(None, env_name="CartPole-v1", devices=10_000)
    assert len(RolloutWrapper(None, env_name="CartPole-v1", devices=1).devices) == 1


SPLIT_SCRIPT = textwrap.dedent("""
    import threading
    import jax, jax.numpy as jnp, numpy as np
    from popeval import sharding
    devices = sharding.resolve_devices(None)
    assert len(devices) == 2
    keys = jax.random.split(jax.random.key(0), 12).reshape(6, 2)
    params = {"w": jnp.arange(6 * 5, dtype=jnp.float32).reshape(6, 5), "b": np.ones((6, 3), np.int32)}
    pieces = sharding.split_members((keys, params), devices)  # one piece a device, on that device
    assert [jax.tree.leaves(p)[0].devices() for p in pieces] == [{devices[0]}, {devices[1]}]
    for piece in pieces:
        assert sharding.on_one_device(piece) and jax.random.key_impl(piece[0]) == jax.random.key_impl(keys)
        assert [x.shape[0] for x in jax.tree.leaves(piece)] == [3, 3, 3]
    assert (np.concatenate([jax.random.key_data(p[0]) for p in pieces]) == jax.random.key_data(keys)).all()
    assert (np.concatenate([p[1]["w"] for p in pieces]) == np.asarray(params["w"])).all()
    assert (np.concatenate([p[1]["b"] for p in pieces]) == 1).all()
    odd = {"w": jnp.arange(10.0).reshape(5, 2)}  # 5 members on 2 devices: 2 + 3
    assert [p["w"].shape[0] for p in sharding.split_members(odd, devices)] == [2, 3]
    assert sharding.split_members(params, devices[:1])[0] is params
    assert not sharding.on_one_device(params) and sharding.on_one_device({"w": jnp.zeros(2)})
    seen = []
    jax.jit(lambda p: seen.append(sharding.split_members(p, devices, 2)[0] is p))(params)
    assert seen == [True], "placed inside a trace"

    # Two parts on each of both devices, and two parts on one device: views of the input's memory.
    big = {"w": jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16), "k": jax.random.split(jax.random.key(1), 8)}
    both = sharding.split_members(big, devices, 2)
    assert [(p["w"].shape[0], p["w"].devices()) for p in both] == [(2, {d}) for d in devices for _ in (0, 1)]
    one = sharding.split_members(big, devices[:1], 2)
    for parts in (both, one):
        assert (np.concatenate([np.asarray(p["w"]) for p in parts]) == np.asarray(big["w"])).all()
        assert (np.concatenate([jax.random.key_data(p["k"]) for p in parts]) == jax.random.key_data(big["k"])).all()
    base = big["w"].unsafe_buffer_pointer()
    assert [p["w"].unsafe_buffer_pointer() for p in one] == [base, base + 4 * 16 * 4], "copied"
    out = sharding.run_parts(lambda p: p["w"] * 2, both)  # gathered on the first piece's device
    assert out.devices() == {devices[0]} and (np.asarray(out) == 2 * np.asarray(big["w"])).all()

    # How many parts, and the parts run side by side on threads, outputs in member order.
    assert sharding.member_parts(devices[:1], 512, 4096, threads=2) == 2
    assert sharding.member_parts(devices[:1], 16, 128, threads=2) == 1  # a part under PART_EPISODES
    assert sharding.member_parts(devices[:1], 7, 7 * 512, threads=2) == 1  # 7 members do not halve
    assert sharding.member_parts(devices, 8, 8 * 1024, threads=2) == 2  # 2 parts x 2 devices
    assert sharding.member_parts(devices, 6, 6 * 1024, threads=2) == 1  # 2 x 2 do not divide 6
    assert sharding.member_parts(devices, 9, 9 * 1024, threads=0) == 1  # more devices than cores
    per_core = min(sharding._cores(), 4096 // sharding.PART_EPISODES)
    while 512 % per_core:
        per_core -= 1
    assert sharding.member_parts(devices[:1], 512, 4096) == per_core  # one per core by default
    class Gpu:
        platform = "gpu"
    assert sharding.member_parts((Gpu(),), 512, 4096, threads=4) == 1
    names = []
    out = sharding.run_parts(lambda p: names.append(threading.current_thread().name) or p["w"] + 1, one)
    assert (np.asarray(out) == np.asarray(big["w"]) + 1).all() and len(set(names)) == 2, names
    assert sharding.run_parts(lambda p: p, [big]) is big
    names.clear()
    with jax.default_matmul_precision("highest"):  # per thread: every part on this thread
        out = sharding.run_parts(lambda p: names.append(threading.current_thread().name) or p["w"] + 1, one)
    assert (np.asarray(out) == np.asarray(big["w"]) + 1).all() and set(names) == {"MainThread"}, names
    print("ok")
""")


def test_split_members_places_parts_as_views_and_run_parts_runs_them_on_threads():
    """On two CPU devices `split_members` cuts every leaf (typed keys included) into pieces on
    one device each, with the same values (5 members: 2 + 3); one device and traced arguments
    are left as given (one part). Pieces on one device are views of the input's memory;
    `member_parts` counts them; `run_parts` runs them on distinct threads and concatenates their
    outputs in order on the first piece's device, all on the calling thread inside a JAX
    configuration context (the others would not see it)."""
    env = {**subprocess_env(), "JAX_NUM_CPU_DEVICES": "2"}
    out = subprocess.run([sys.executable, "-c", SPLIT_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


@pytest.mark.parametrize("env_id,kwargs", [
    pytest.param("CartPole-v1", {"num_env_steps": 100}, marks=pytest.mark.slow),
    ("Acrobot-v1", {"env_kwargs": {"max_steps_in_episode": 60}, "obs_normalization": True}),
])
def test_wrapper_parts_on_threads_return_what_one_part_does(env_id, kwargs):
    """`threads=2` runs P=64 x 8 episodes as two parts of 32 members on two threads: the same
    returns, lengths and observation statistics, bit for bit, as one part. (The trajectory
    path runs its parts through the same `_run_parts` / `sharding.run_parts`: the pieces of
    `test_wrapper_results_identical_across_device_counts`, on threads too.)"""
    import jax

    from popeval import MLPPolicy, RolloutWrapper, sharding
    from popeval.environments import make

    env, params = make(env_id, **kwargs.get("env_kwargs", {}))
    policy = MLPPolicy.for_env(env, params, hidden_sizes=(16,))
    pop = jax.vmap(lambda k: policy.init_params(k, env, params))(jax.random.split(jax.random.key(0), 64))
    keys = jax.random.split(jax.random.key(1), 8)
    runs = {}
    for threads in (1, 2):
        w = RolloutWrapper(policy.apply, env_name=env_id, devices=1, threads=threads, **kwargs)
        assert sharding.member_parts(w.devices, 64, 64 * 8, threads) == threads
        runs[threads] = jax.tree.map(np.asarray, w.population_fitness(keys, pop))
    assert (runs[1].obs_stats is None) == ("obs_normalization" not in kwargs)
    for one, two in zip(jax.tree.leaves(runs[1]), jax.tree.leaves(runs[2])):
        assert one.shape == two.shape and (one == two).all()
    with pytest.raises(ValueError, match="threads"):
        RolloutWrapper(None, env_name=env_id, threads=0)


def test_pieces_evaluate_every_member_once_and_gather_in_order():
    """`Pieces`: the members split into pieces (on threads where the cores allow) come back in
    member order, each evaluated once; ask's output reaches every piece and the update."""
    import jax
    import jax.numpy as jnp

    from popeval import sharding

    def ask(state, seed):
        return state["w"] * 2 + seed

    def evaluate(state, seed, asked, members):
        return members.astype(jnp.float32) + asked[0], jnp.ones_like(members)

    def update(state, seed, asked, evaluated):
        return {"w": state["w"] + 1}, {"fitness": evaluated[0], "count": evaluated[1].sum(), "asked": asked}

    pieces = sharding.Pieces(ask, evaluate, update, 10, jax.device_count(), episodes_per_member=1024)
    state, seed = pieces.replicate({"w": jnp.ones(3)}), pieces.replicate(np.int32(1))
    pieces.compile(pieces.lower({"w": jnp.ones(3)}, np.int32(1)))
    new, metrics = pieces(state, seed)
    out = pieces.first(metrics)
    np.testing.assert_array_equal(out["fitness"], np.arange(10) + 3.0)
    assert out["count"] == 10 and out["asked"].tolist() == [3.0] * 3
    np.testing.assert_array_equal(pieces.first(new)["w"], [2.0] * 3)
    devices = tuple(jax.local_devices())
    assert len(pieces._ids) == sharding.member_parts(devices, 10, 10 * 1024) * len(devices)  # a piece a core


def test_the_one_program_generation_agrees_with_the_pieces():
    """The generation as one program over the devices (`generation_fn` under `Replicated`, what
    accelerators run) and as one-device programs (`Pieces`, CPUs) compute the same generation:
    the same fitness curve on Pendulum to float32 rounding (two compilations of the same
    functions may contract multiply-adds differently; on this CPU they agreed to the bit)."""
    import jax

    from popeval import keys, sharding
    from popeval.strategies import EvolveConfig
    from popeval.strategies.run.programs import build, generation_fn, generation_parts, init_fn

    config = EvolveConfig.from_flat(**CONFIGS["openai_es"])
    run, seed = build(config), np.int32(config.run.seed)
    state = jax.jit(init_fn(run, config))(seed)
    curves, finals = [], []
    for step in (sharding.Replicated(generation_fn(run, config, 1), 1),
                 sharding.Pieces(*generation_parts(run, config), config.strategy.pop_size, 1, config.run.num_rollouts)):
        s, s_seed = step.replicate(state), step.replicate(seed)
        curve = []
        for _ in range(config.run.num_generations):
            s, metrics = step(s, s_seed)
            curve.append(float(np.asarray(step.first(metrics)["fitness/mean"]).reshape(-1)[0]))
        curves.append(curve)
        finals.append(jax.tree.map(lambda x: np.asarray(keys.to_raw(x)), step.first(s)))
    assert len(set(curves[0])) > 1
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6), *finals)
