"""Anakin (`experiments/agents/anakin.py`, `python -m experiments.agents anakin`): TD(lambda), configs,
learning, device counts, the command and its anchor (seed 003's own code)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.agents.anakin import AnakinConfig, train
from experiments.agents.common import load_config
from experiments.agents.td import td_lambda
from popeval import sharding
from tests.helpers import REPO, read_metrics, subprocess_env

CONFIGS = REPO / "experiments" / "configs"


def td_lambda_loops(v_tm1, r_t, discount_t, v_t, lambda_):
    """The lambda-return written as its recursion, one step at a time, in float64."""
    T = len(r_t)
    lambda_ = np.broadcast_to(lambda_, (T,))
    returns = np.zeros(T)
    g = v_t[-1]
    for t in reversed(range(T)):
        g = r_t[t] + discount_t[t] * ((1 - lambda_[t]) * v_t[t] + lambda_[t] * g)
        returns[t] = g
    return returns - v_tm1


@pytest.mark.parametrize("lambda_", [0.0, 0.5, 0.9, 1.0, "per-step"])
def test_td_lambda_matches_the_recursion(lambda_):
    rng = np.random.default_rng(0)
    T = 13
    v_tm1, r_t, v_t = (rng.normal(size=T) for _ in range(3))
    discount_t = rng.uniform(0.5, 1.0, size=T)
    discount_t[[4, 9]] = 0.0  # episodes end in the middle: nothing flows back across them
    lam = rng.uniform(size=T) if lambda_ == "per-step" else lambda_
    expected = td_lambda_loops(v_tm1, r_t, discount_t, v_t, lam)
    v_tm1_, r_t_, discount_t_, v_t_ = (jnp.asarray(x, jnp.float32) for x in (v_tm1, r_t, discount_t, v_t))
    got = td_lambda(v_tm1_, r_t_, discount_t_, v_t_, jnp.asarray(lam, jnp.float32) if lambda_ == "per-step" else lam)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    if lambda_ == 0.0:  # one-step TD errors
        np.testing.assert_allclose(got, r_t + discount_t * v_t - v_tm1, rtol=1e-5, atol=1e-5)
    # The return at step 4 does not see past the episode's end.
    np.testing.assert_allclose(got[4] + v_tm1[4], r_t[4], rtol=1e-6)


def test_td_lambda_targets_carry_no_gradient():
    args = [jnp.arange(5.0), jnp.ones(5), jnp.full(5, 0.9), jnp.arange(5.0) + 1]

    def loss(v_tm1, v_t):
        return jnp.sum(td_lambda(v_tm1, args[1], args[2], v_t, 0.8) ** 2)

    g_pred, g_target = jax.grad(loss, argnums=(0, 1))(args[0], args[3])
    np.testing.assert_allclose(g_pred, -2 * td_lambda(*args[:3], args[3], 0.8))
    np.testing.assert_array_equal(g_target, np.zeros(5))


@pytest.mark.slow  # rlax: the bench extra
def test_td_lambda_agrees_with_rlax():
    rlax = pytest.importorskip("rlax", reason="rlax is the bench extra: pip install -e '.[bench]'")

    rng = np.random.default_rng(1)
    v_tm1, r_t, v_t = (jnp.asarray(rng.normal(size=9), jnp.float32) for _ in range(3))
    discount_t = jnp.asarray([0.9, 0.9, 0.0, 0.9, 1.0, 0.9, 0.0, 0.9, 0.9], jnp.float32)
    np.testing.assert_allclose(td_lambda(v_tm1, r_t, discount_t, v_t, 0.7),
                               rlax.td_lambda(v_tm1, r_t, discount_t, v_t, 0.7), rtol=1e-6, atol=1e-6)


def test_configs_load_and_refuse_bad_keys(tmp_path):
    catch = load_config(AnakinConfig, CONFIGS / "anakin_catch.yaml")
    assert catch.env_name == "Catch-bsuite" and catch.target_return == 0.9 and catch.epsilon > 0
    invaders = load_config(AnakinConfig, CONFIGS / "anakin_space_invaders.yaml", ["num_calls=2"])
    assert invaders.env_name == "SpaceInvaders-MinAtar" and invaders.num_calls == 2
    assert isinstance(load_config(AnakinConfig, None, ["step_size=1"]).step_size, float)
    with pytest.raises(ValueError, match="unknown config key 'lambda'.*lambda_"):
        load_config(AnakinConfig, None, ["lambda=0.9"])
    with pytest.raises(TypeError, match="'batch_size': expected int"):
        load_config(AnakinConfig, None, ["batch_size=12.5"])
    with pytest.raises(ValueError, match="'rollout_len' must be positive"):
        load_config(AnakinConfig, None, ["rollout_len=0"])
    with pytest.raises(ValueError, match="epsilon"):
        load_config(AnakinConfig, None, ["epsilon=1.5"])
    with pytest.raises(ValueError, match="cannot be split evenly over 2"):
        sharding.split_leading({"obs": np.zeros((3, 4))}, 2)
    assert sharding.split_leading({"obs": np.zeros((6, 4))}, 2)["obs"].shape == (2, 3, 4)

def test_learns_catch_in_seconds():
    """The Catch config's settings, 4 calls (204,800 frames, about a second of execution):
    the behaviour policy's average return rises from chance to >= 0.8 and the greedy policy
    catches >= 90% of the balls (RolloutWrapper)."""
    config = load_config(AnakinConfig, CONFIGS / "anakin_catch.yaml", ["num_calls=4", "eval_episodes=50"])
    result = train(config, quiet=True)
    returns = [row["return/mean"] for row in result["history"]]
    assert returns[0] < 0.5 and returns[-1] >= 0.8, returns
    assert result["eval/return"] >= 0.8, result["eval/return"]
    assert result["history"][-1]["frames"] == 4 * 50 * 16 * 64


DEVICE_SCRIPT = textwrap.dedent("""
    import json, jax, numpy as np
    from experiments.agents.anakin import AnakinConfig, train
    config = AnakinConfig(env_name="SpaceInvaders-MinAtar", batch_size=8, rollout_len=8, iterations=4,
                          num_calls=2, epsilon=0.2, step_size=1e-3, hidden_size=32, eval_episodes=0)
    r = train(config, quiet=True)
    print(json.dumps({"devices": jax.local_device_count(),
                      "history": [[h["return/mean"], h["episodes"], h["loss"]] for h in r["history"]],
                      "params": [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(r["params"])]}))
""")


@pytest.mark.slow
def test_one_two_and_four_devices_agree():
    """The same 8 SpaceInvaders environments (sticky actions and epsilon-greedy draw keys) on
    1, 2 and 4 devices (8, 4, 2 per device) take the same actions: identical episodes and
    returns. The gradient's mean over the batch, then the devices, sums in another order, so
    the losses and parameters agree to float32 rounding (1 ulp seen), not to the bit."""
    procs = {n: subprocess.Popen([sys.executable, "-c", DEVICE_SCRIPT],
                                 env=subprocess_env(JAX_NUM_CPU_DEVICES=str(n)), cwd=REPO,
                                 text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in (1, 2, 4)}
    runs = {}
    for n, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        runs[n] = json.loads(stdout.strip().splitlines()[-1])
        assert runs[n]["devices"] == n
    reference = runs[1]
    assert sum(h[1] for h in reference["history"]) > 0  # episodes finished: returns were compared
    for n in (2, 4):
        other = runs[n]
        assert [h[:2] for h in other["history"]] == [h[:2] for h in reference["history"]], n
        np.testing.assert_allclose([h[2] for h in other["history"]], [h[2] for h in reference["history"]], rtol=1e-6)
        for a, b in zip(other["params"], reference["params"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{n} devices")


@pytest.mark.slow  # the anchor's haiku and rlax: the bench extra
def test_script_quick_writes_the_run_and_times_the_anchor(tmp_path):
    """`--quick --anchor` on Catch: popeval's learner and the seed's haiku + rlax code (bench extra)."""
    for package in ("rlax", "haiku"):  # the anchor's
        pytest.importorskip(package, reason="the bench extra: pip install -e '.[bench]'")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "experiments.agents", "anakin", "--config", str(CONFIGS / "anakin_catch.yaml"),
           "--quick", "--run_dir", str(run_dir), "--wandb", "disabled", "--anchor"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(JAX_NUM_CPU_DEVICES="2"),
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "COMPILATION: Elapsed time=" in proc.stdout and "EXECUTION: Elapsed time=" in proc.stdout
    rows = read_metrics(run_dir)
    assert len(rows) == 2 and {"frames", "return/mean", "loss", "fps", "episodes"} <= set(rows[0])
    assert (run_dir / "curve.png").stat().st_size > 1000
    result = json.loads((run_dir / "result.json").read_text())
    assert result["devices"] == 2 and result["frames"] == int(rows[-1]["frames"])
    assert proc.stdout.count("EXECUTION: Elapsed time=") == 2 and "ratio popeval/anchor" in proc.stdout
    assert result["anchor"]["frames"] == result["frames"] // 2  # one call against popeval's two
    assert result["fps_ratio"] == pytest.approx(result["fps"] / result["anchor"]["fps"])
