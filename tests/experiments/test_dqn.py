"""DQN (`experiments/agents/dqn.py`, `python -m experiments.agents dqn`): the ring buffer, the Bellman
target, configs, learning in a short run, and the command with its anchor (seed 002's Python loop)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.agents.common import load_config
from experiments.agents.dqn import (
    DQNConfig,
    Transition,
    bellman_target,
    buffer_add,
    buffer_init,
    buffer_sample,
    train,
)
from tests.helpers import REPO, read_metrics, subprocess_env

CONFIG = REPO / "experiments" / "configs" / "dqn_cartpole.yaml"


def transitions(values, obs_dim=2) -> Transition:
    """Transitions tagged by `values`: obs = value, reward = value."""
    v = jnp.asarray(values, jnp.float32)
    return Transition(jnp.repeat(v[:, None], obs_dim, 1), v.astype(jnp.int32), v,
                      jnp.repeat(v[:, None], obs_dim, 1) + 0.5, jnp.zeros_like(v))


def test_ring_buffer_wraps_around_and_counts_its_size():
    buffer = buffer_init(5, jax.tree.map(lambda x: x[0], transitions([0.0])))
    assert buffer.data.obs.shape == (5, 2) and buffer.data.action.dtype == jnp.int32
    buffer = buffer_add(buffer, transitions([1, 2, 3]))
    assert (int(buffer.position), int(buffer.size)) == (3, 3)
    np.testing.assert_array_equal(buffer.data.reward, [1, 2, 3, 0, 0])
    buffer = buffer_add(buffer, transitions([4, 5, 6, 7]))  # wraps: 6, 7 overwrite 1, 2
    assert (int(buffer.position), int(buffer.size)) == (2, 5)
    np.testing.assert_array_equal(buffer.data.reward, [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(buffer.data.next_obs[:, 0], [6.5, 7.5, 3.5, 4.5, 5.5])
    buffer = jax.jit(buffer_add)(buffer, transitions([8]))
    assert (int(buffer.position), int(buffer.size)) == (3, 5)
    np.testing.assert_array_equal(buffer.data.action, [6, 7, 8, 4, 5])


def test_buffer_samples_only_filled_slots():
    buffer = buffer_init(100, jax.tree.map(lambda x: x[0], transitions([0.0])))
    buffer = buffer_add(buffer, transitions([1, 2, 3]))
    batch = jax.jit(buffer_sample, static_argnums=2)(buffer, jax.random.key(0), 600)
    assert batch.obs.shape == (600, 2)
    assert set(np.asarray(batch.reward).tolist()) == {1.0, 2.0, 3.0}  # never an empty slot (0)
    np.testing.assert_array_equal(batch.obs[:, 0], batch.reward)  # rows stay whole


def test_bellman_target_terminal_vs_truncated():
    reward = jnp.array([1.0, 1.0, 0.5])
    terminated = jnp.array([1.0, 0.0, 0.0])  # a termination; a truncation; a plain step
    next_q = jnp.array([[2.0, 5.0], [2.0, 5.0], [3.0, -1.0]])
    y = bellman_target(reward, terminated, next_q, 0.9)
    # A termination has no future (y = r, not the seed's y = 0); a truncation bootstraps.
    np.testing.assert_allclose(y, [1.0, 1.0 + 0.9 * 5.0, 0.5 + 0.9 * 3.0], rtol=1e-6)


def test_config_file_and_errors(tmp_path):
    config = load_config(DQNConfig, CONFIG, ["num_seeds=3", "learning_rate=1e-4"])
    assert config.num_seeds == 3 and config.learning_rate == 1e-4 and config.hidden_sizes == (300, 100)
    assert dataclasses.replace(config, num_seeds=5, learning_rate=1e-3) == DQNConfig()  # the file = the defaults
    with pytest.raises(ValueError, match="batch_sise"):
        load_config(DQNConfig, None, ["batch_sise=32"])
    with pytest.raises(TypeError, match="num_envs"):
        load_config(DQNConfig, None, ["num_envs=2.5"])
    with pytest.raises(TypeError, match="lr_decay"):
        load_config(DQNConfig, None, ["lr_decay=maybe"])
    with pytest.raises(ValueError, match="loss"):
        DQNConfig(loss="l1")
    with pytest.raises(ValueError, match="batch_size"):
        DQNConfig(batch_size=0)
    with pytest.raises(ValueError, match="learning_starts"):
        DQNConfig(learning_starts=10, batch_size=32)
    assert DQNConfig(gamma=1).gamma == 1.0 and isinstance(DQNConfig(gamma=1).gamma, float)


def test_a_run_stores_true_transitions_and_stops_early():
    """At a termination the buffer holds the failing observation (env.step would give the
    reset one) and the flag; otherwise each environment's next row starts where this one
    ended. With stop_return=0 every seed stops at its first curve point and keeps those
    parameters while its copy goes on learning (and feeds the target network)."""
    config = DQNConfig(num_seeds=2, learning_starts=400, buffer_size=2_000, total_steps=1_200, eval_every=400,
                       target_update_every=50, curve_episodes=2, eval_episodes=2, stop_return=0.0, seed=3)
    rows = []
    result = train(config, log=lambda step, row: rows.append((step, row)))
    assert [s for s, _ in rows] == [800, 1_200] and result["env_steps"] == 1_200
    assert result["stopped_at"] == [800, 800] and result["returns"].shape == (2,)
    state = result["state"]
    assert state.steps.tolist() == [1_200] * 2 and state.updates.tolist() == [200] * 2
    # 100 updates per chunk, a target copy every 50: a learning seed ends a chunk with
    # params == target_params; a stopped one has kept its parameters of 800 steps.
    for seed in range(2):
        leaves = zip(jax.tree.leaves(state.params), jax.tree.leaves(state.target_params))
        assert not all(np.allclose(p[seed], t[seed]) for p, t in leaves)

    data = jax.tree.map(lambda x: np.asarray(x[0, :1_200]), state.buffer.data)  # seed 0; rows step-major, 4 envs
    ends = data.terminated == 1.0
    assert 20 < ends.sum() < 150  # short episodes, none reaching the 500-step limit in 300 steps per env
    x, theta = data.next_obs[ends, 0], data.next_obs[ends, 2]
    assert np.all((np.abs(x) > 2.4) | (np.abs(theta) > 12 * 2 * np.pi / 360))
    cont = ~ends[:-4]
    np.testing.assert_array_equal(data.next_obs[:-4][cont], data.obs[4:][cont])
    assert not np.any(np.all(data.obs[4:][~cont] == data.next_obs[:-4][~cont], axis=1))  # a reset follows an end
    np.testing.assert_array_equal(data.reward, 1.0)
    assert set(np.unique(data.action)) == {0, 1}


@pytest.mark.slow
def test_script_quick_learns_and_times_the_anchor(tmp_path):
    """`--quick`: two seeds, 6,000 steps; both greedy policies well above a random policy's
    ~22. The anchor runs seed 002's loop with the same update ratio."""
    pytest.importorskip("gymnasium")
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "experiments.agents", "dqn", "--config", str(CONFIG), "--quick", "--anchor",
         "--anchor_steps", "1400", "--run_dir", str(run_dir), "--wandb", "disabled", "--seed=1"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "solved (>= 475.0):" in out.stdout and "compiled/anchor" in out.stdout
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [3_500, 6_000]  # warm-up 1,000, chunks of 2,500
    assert float(rows[-1]["train/epsilon"]) == pytest.approx(0.05)  # decayed over the first 1,200
    assert {"return/mean", "return/min", "return/max", "train/loss", "train/episode_return"} <= set(rows[0])
    assert (run_dir / "curve.png").stat().st_size > 0
    result = json.loads((run_dir / "result.json").read_text())
    assert len(result["returns"]) == 2 and result["env_steps"] == 6_000 and result["run_s"] > 0
    assert min(result["returns"]) > 60, result["returns"]  # learning happened
    assert float(rows[-1]["return/min"]) == pytest.approx(min(result["returns"]), abs=0.05)
    anchor = result["anchor"]
    assert anchor["env_steps"] == 1_400 and anchor["updates"] == (1_400 - 1_000) // 4  # same update ratio
    assert result["ratio_all_seeds"] > 0 and result["ratio_per_seed"] > 0
    assert result["compiled_one_seed_steps_per_s"] > 0
    assert json.loads((run_dir / "config.json").read_text())["seed"] == 1
