"""The benchmark (`python -m experiments.benchmarks`: `experiments.benchmarks.run` and
`.programs`): the quick run writes the JSON it documents, rows from another device count
included; the fused limit computes the episodes (XLA does not drop the environment); the trained CartPole
population keeps every episode alive for 500 steps. No speed asserts."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from experiments.benchmarks import checks, programs, run
from popeval import layouts
from popeval.rollout import RolloutWrapper

ROW_KEYS = {"workload", "env", "pop_size", "num_rollouts", "num_env_steps", "devices", "impl", "compile_s",
            "time_s", "times_s", "mem_bytes", "env_steps", "steps_per_s", "min_length", "live_over_limit",
            "speedup_vs_gymnax_best", "speedup_vs_gymnax_same_options", "load_before", "parts"}
FOOTPRINT_KEYS = {"env", "pop_size", "num_rollouts", "num_env_steps", "devices", "xla_temp_bytes",
                  "xla_output_bytes", "xla_argument_bytes", "xla_bytes", "bytes_per_episode", "rss_growth_bytes",
                  "min_length", "target_mb", "passed"}
OVER_T_KEYS = {"env", "pop_size", "num_rollouts", "num_env_steps", "xla_bytes", "passed"}


@pytest.mark.slow
def test_quick_benchmark_writes_json_with_device_rows(tmp_path, capsys):
    """`--quick --devices N M`: this process's rows (N devices), and the fitness and fused rows
    of M devices from a subprocess (CPU only: the subprocess sets JAX_NUM_CPU_DEVICES)."""
    cpu = jax.default_backend() == "cpu"
    local = jax.local_device_count()
    other = 2 if local == 1 else 1
    out = tmp_path / "nested" / "bench.json"
    devices = ["--devices", str(local), str(other)] if cpu else []
    # --quiet_below 1e9: every workload starts at once (and records the load it started at).
    assert run.main(["--quick", "--out", str(out), "--quiet_below", "1e9", *devices]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"config", "machine", "columns", "results", "memory_check", "eager_check"}
    assert report["config"]["quick"] is True and report["config"]["envs"] == ["CartPole-v1"]
    assert report["machine"]["load_average_start"] is not None and report["machine"]["load_average_end"] is not None

    rows = report["results"]
    impls = [r["impl"] for r in rows]  # gymnax and evosax are test deps
    # gymnax's best case with popeval's options: only where they are not XLA's defaults (CPUs).
    expected = [i for i in programs.IMPLS if cpu or i != "gymnax best, popeval opts"]
    assert impls == [i for i in expected for _ in range(2 if cpu and i in run.DEVICE_ROWS else 1)]
    # The fused limit runs on all devices of its process: this one's and the subprocess's.
    assert {r["devices"] for r in rows if r["impl"] == "fused limit"} == ({local, other} if cpu else {local})
    for r in rows:
        assert set(r) == ROW_KEYS, r["impl"]
        assert r["workload"] == r["env"] == "CartPole-v1" and r["pop_size"] == 8 and r["num_rollouts"] == 2
        assert r["num_env_steps"] == 50 and len(r["times_s"]) == 1
        assert r["parts"] == 1  # 16 episodes: one part (sharding.member_parts)
        assert r["time_s"] > 0 and r["compile_s"] > 0 and r["mem_bytes"] > 0
        assert 1 <= r["min_length"] <= 50
        assert r["load_before"] is not None and r["load_before"] >= 0
        assert abs(r["steps_per_s"] - r["env_steps"] / r["time_s"]) < 1e-6 * r["steps_per_s"]
        assert r["speedup_vs_gymnax_best"] > 0 and (r["speedup_vs_gymnax_same_options"] or 1) > 0
        assert (r["live_over_limit"] is not None) == r["impl"].startswith("popeval"), r["impl"]
        if r["impl"] == "fused limit":
            assert r["env_steps"] == 8 * 2 * 50  # every step counts
        else:
            assert 0 < r["env_steps"] <= 8 * 2 * 50, r
    by_impl = {r["impl"]: r for r in rows}
    assert by_impl["gymnax best case"]["speedup_vs_gymnax_best"] == 1.0
    if cpu:
        assert by_impl["gymnax best, popeval opts"]["speedup_vs_gymnax_same_options"] == 1.0
    # Both popeval paths play the same episodes, gymnax's two rows the same ones, and another
    # device count the same ones again.
    assert by_impl["popeval fitness"]["env_steps"] == by_impl["popeval trajectory"]["env_steps"]
    assert by_impl["gymnax best case"]["env_steps"] == by_impl["gymnax trajectories"]["env_steps"]
    for r in rows:
        assert r["env_steps"] == by_impl[r["impl"]]["env_steps"], r
        assert r["min_length"] == by_impl[r["impl"]]["min_length"], r

    mem = report["memory_check"]
    assert set(mem) == {"footprint", "over_t"}
    assert set(mem["footprint"]) == FOOTPRINT_KEYS and set(mem["over_t"]) == OVER_T_KEYS
    assert mem["footprint"]["passed"] is True and mem["footprint"]["xla_bytes"] > 0
    assert mem["footprint"]["bytes_per_episode"] == mem["footprint"]["xla_bytes"] / (64 * 2)
    assert mem["over_t"]["passed"] is True and mem["over_t"]["num_env_steps"] == [20, 100]

    eager = {(r["env"], r["impl"]): r for r in report["eager_check"]}
    assert set(eager) == {(e, i) for e in ("CartPole-v1", "Breakout-MinAtar")
                          for i in ("popeval step", "op by op (old eager)", "gymnax step")}
    assert all(r["ms_per_call"] > 0 and r["calls"] >= 1 for r in eager.values())

    printed = capsys.readouterr().out
    for text in ("x gymnax best", "live/limit", "memory over T", "eager env.step in a Python loop",
                 "load average at start", "load average at end", str(out)):
        assert text in printed, text


@pytest.mark.parametrize("env_id, pop_size", [("CartPole-v1", 300), ("Pendulum-v1", 6)])
def test_fused_limit_computes_popeval_episodes(env_id, pop_size):
    """In a deterministic environment the fused limit plays popeval's episodes (same reset
    keys): its returns and lengths are popeval's, so XLA kept the environment (CartPole's
    reward is a constant 1, so its returns are the episode lengths). 300 members of 4 episodes
    run in three of the limit's chunks of 128 members, the last padded (popeval's hold 64); 6
    in one of 8."""
    pop = programs.population(env_id, pop_size, 120)
    limit_chunk = layouts.chunk_members(4, pop_size, programs.LIMIT_CHUNK_EPISODES)
    assert limit_chunk == (128 if pop_size == 300 else 8)
    assert layouts.chunk_members(4, pop_size) == (64 if pop_size == 300 else 8)
    assert not pop.env.stochastic
    keys = jax.random.split(jax.random.key(3), 4)
    returns, lengths = jax.jit(programs.fused_limit(pop.env, pop.policy, 120))(
        keys, pop.pop_params, pop.env_params)
    w = RolloutWrapper(pop.policy.apply, env_name=env_id, num_env_steps=120)
    fit = w.population_fitness(keys, pop.pop_params)
    np.testing.assert_array_equal(np.asarray(lengths), np.asarray(fit.lengths))
    np.testing.assert_allclose(np.asarray(returns), np.asarray(fit.returns), rtol=1e-5)
    if env_id == "CartPole-v1":
        np.testing.assert_array_equal(np.asarray(returns), np.asarray(lengths, np.float32))
        assert 1 < np.asarray(lengths).min() < 120 and len(np.unique(np.asarray(lengths))) > 3
    else:
        assert np.all(np.asarray(lengths) == 120) and np.all(np.asarray(returns) < 0)


def test_trained_cartpole_population_keeps_every_episode_alive():
    pop = programs.population(programs.TRAINED, 4)
    assert pop.num_env_steps == 500
    kernels = np.asarray(pop.pop_params["params"]["Dense_0"]["kernel"])
    assert not np.array_equal(kernels[0], kernels[1]) and np.all(kernels != 0)  # members differ, dense
    keys = jax.random.split(jax.random.key(7), 2)
    fit = RolloutWrapper(pop.policy.apply, env_name="CartPole-v1").population_fitness(keys, pop.pop_params)
    assert np.all(np.asarray(fit.lengths) == 500) and np.all(np.asarray(fit.returns) == 500.0)
    _, lengths = jax.jit(programs.fused_limit(pop.env, pop.policy, 500))(keys, pop.pop_params,
                                                                                   pop.env_params)
    assert np.all(np.asarray(lengths) == 500)


def test_trained_cartpole_needs_a_cartpole_mlp():
    pop = programs.population("Pendulum-v1", 2)
    template = pop.policy.init_params(jax.random.key(0), pop.env, pop.env_params)
    with pytest.raises(ValueError, match="CartPole"):
        programs.trained_cartpole(pop.policy, template, 2)


def test_wait_for_quiet_waits_until_the_load_falls(monkeypatch):
    """`--quiet_below`: the benchmark polls the load average until it is below the limit, and
    gives up (saying so) after `QUIET_WAIT_S`."""
    loads = iter([3.0, 2.0, 1.2, 0.5])
    monkeypatch.setattr(checks.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    logged = []
    assert checks.wait_for_quiet(1.5, logged.append, poll_s=0) == 1.2 and logged == []
    monkeypatch.setattr(checks.os, "getloadavg", lambda: (4.0, 0.0, 0.0))
    assert checks.wait_for_quiet(None, logged.append, poll_s=0) == 4.0 and logged == []
    monkeypatch.setattr(checks, "QUIET_WAIT_S", 0.0)
    assert checks.wait_for_quiet(1.5, logged.append, poll_s=0) == 4.0
    assert logged == ["  the load average is still 4.00 after 0 s; timing anyway"]


def test_prepare_runs_a_program_in_parts_on_threads():
    """`prepare(..., parts=2)` compiles the program for half the members and times calls that
    run both halves side by side (as `RolloutWrapper`'s calls from Python do): the same returns
    as one part, and twice one program's buffers."""
    pop = programs.population("CartPole-v1", 64, 50)
    keys = jax.random.split(jax.random.key(1), 8)
    prog = programs.programs(pop, keys, ("popeval fitness",))["popeval fitness"]
    args = (keys, pop.pop_params, pop.env_params)
    one, fn1, out1 = run.prepare(prog.fn, args, float("inf"), prog.devices, prog.options, 1)
    two, fn2, out2 = run.prepare(prog.fn, args, float("inf"), prog.devices, prog.options, 2)
    assert fn1 is not None and fn2 is not None and out2.returns.shape == (64, 8)
    assert (np.asarray(out1.returns) == np.asarray(out2.returns)).all()
    assert (np.asarray(fn2(*args).lengths) == np.asarray(out1.lengths)).all()
    assert 0 < two["mem_bytes"] < 2 * one["mem_bytes"] + 1


def test_bad_counts_are_rejected_before_any_work(tmp_path):
    for flag in ("--threads", "--repeats", "--devices"):
        with pytest.raises(SystemExit, match=flag):
            run.main(["--quick", flag, "0", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_quick_low_rank_benchmark_shows_which_product_ran(tmp_path):
    """`python -m experiments.benchmarks low_rank --quick`: every row, `product="auto"` member by
    member on CartPole's 2x32 MLP (and the shared product forced beside it), the shared product on
    Pendulum's 256x256."""
    from experiments.benchmarks import low_rank

    out = tmp_path / "low_rank.json"
    assert low_rank.main(["--quick", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    got = {(r["env"], r["impl"]): r.get("product") for r in rows}
    assert got[("CartPole-v1", "low rank r=1")] == "member" and ("CartPole-v1", "shared r=1") in got
    assert got[("Pendulum-v1", "low rank r=1")] == "shared" and ("Pendulum-v1", "shared r=1") not in got
    assert {impl for _, impl in got} >= {"full rank", "inference limit"}
    assert all(r["time_s"] > 0 and r["vs_full"] > 0 and r["gflops"] > 0 for r in rows)
    assert json.loads(out.read_text())["machine"]["gemm_gflops"] > 0


@pytest.mark.slow
def test_the_memory_probe_reads_a_fresh_processs_peak():
    """`python -m experiments.benchmarks low_rank --memory`'s probe: a child evaluating 256 members
    of Breakout's 400-256-256-6 MLP, its peak resident memory from `os.wait4`."""
    from experiments.benchmarks import low_rank

    row = low_rank.peak_memory(256)
    assert 0.1 < row["peak_rss_gib"] < 4 and np.isfinite(row["mean_return"])


@pytest.mark.slow
def test_quick_cnn_benchmark_times_both_convolutions(tmp_path):
    """`python -m experiments.benchmarks cnn --quick`: the one-product CNN, lax's convolution (same
    returns, else the run stops) and the MLP, each timed, with `vs lax` the lax row's time over the
    row's."""
    from experiments.benchmarks import cnn

    out = tmp_path / "cnn.json"
    assert cnn.main(["--quick", "--out", str(out)]) == 0
    rows = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"one product", "lax conv", "mlp 32"} and rows["lax conv"]["vs_lax"] == 1.0
    assert all(r["time_s"] > 0 and r["env_steps"] > 0 for r in rows.values())
    assert rows["one product"]["vs_lax"] == rows["lax conv"]["time_s"] / rows["one product"]["time_s"]


class _Countdown:
    """A suite-like environment with its own auto-reset: an episode lasts its reset's counter
    (1-5 steps), reward 1 a step; `apply` is the policy (the action is ignored)."""

    @staticmethod
    def reset(key):
        count = jax.random.randint(key, (), 1, 6)
        return count.astype(np.float32)[None], count

    def step(self, key, count, action):
        count = count - 1
        done = count == 0
        fresh_obs, fresh = self.reset(key)
        count = jax.numpy.where(done, fresh, count)
        return jax.numpy.where(done, fresh_obs, count.astype(np.float32)[None]), count, jax.numpy.float32(1.0), done

    @staticmethod
    def apply(params, obs, key):
        return obs[0] * params


def test_peer_scan_counts_the_first_episode_only():
    """The suites benchmark's peer program: an auto-resetting suite's rewards summed until the
    first `done`, however many episodes the scan runs after it; every member and episode apart."""
    from experiments.benchmarks import suites

    env = _Countdown()
    fn = jax.jit(suites.peer_scan(env.reset, env.step, env, num_steps=12))
    keys = jax.random.split(jax.random.key(3), 4)
    returns, lengths = fn(keys, np.ones(3, np.float32), None)
    first = np.array([int(env.reset(jax.random.split(k)[0])[1]) for k in keys])
    assert returns.shape == lengths.shape == (3, 4)
    np.testing.assert_array_equal(lengths, np.broadcast_to(first, (3, 4)))
    np.testing.assert_array_equal(returns, lengths)


@pytest.mark.slow
def test_quick_suites_benchmark_runs_every_row(tmp_path):
    """`python -m experiments.benchmarks suites --quick` on navix and jumanji: popeval's fitness,
    the fused limit and the suite's own scan each run; popeval and the fused limit play the same episodes (the
    suites draw no randomness after the reset), so their live steps agree."""
    pytest.importorskip("navix")
    pytest.importorskip("jumanji")
    from experiments.benchmarks import suites

    out = tmp_path / "suites.json"
    assert suites.main(["--quick", "--workloads", "Navix Empty-8x8 random", "Jumanji Snake random",
                        "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    for workload in ("Navix Empty-8x8 random", "Jumanji Snake random"):
        got = {r["impl"]: r for r in rows if r["workload"] == workload}
        assert set(got) == {"popeval fitness", "fused limit", "suite scan"}
        assert got["popeval fitness"]["live_steps"] == got["fused limit"]["live_steps"] > 0
        assert got["suite scan"]["speedup_vs_peer"] == 1.0
        assert all(r["time_s"] > 0 and r["max_length"] <= suites.QUICK["num_env_steps"] for r in got.values())
