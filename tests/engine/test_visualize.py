"""Drawing a policy's episode (`popeval.visualize`, `RolloutWrapper.episode_states`): the
episode drawn is exactly the one `single_rollout(jax.random.key(seed), ...)` evaluates
(random, feed-forward, recurrent and normalising policies), cut after the step that ends it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popeval import normalization, visualize
from popeval.environments import render
from popeval.rollout import RolloutWrapper

ZERO = np.float32(0.0)  # parameters of the policies that need none


def policy_manager(**kwargs):
    return RolloutWrapper(env_name="CartPole-v1", num_env_steps=80, **kwargs)


def lean_policy(params, obs, key):
    return (obs[2] + params * obs[3] > 0).astype(jnp.int32)


def counting_policy(params, obs, carry, key):
    return (carry % 3 == 0).astype(jnp.int32), carry + 1


def signed_policy(params, obs, key):  # acts on the normalised observation
    return (obs[0] + obs[2] > 0).astype(jnp.int32)


@pytest.mark.parametrize(
    "kind, kwargs, params, seed",
    [
        ("random", {}, ZERO, 3),
        ("random", {}, ZERO, 4),
        ("lean", {"model_forward": lean_policy}, np.float32(0.1), 0),
        ("recurrent", {"model_forward": counting_policy, "init_carry": np.int32(0)}, ZERO, 1),
        ("normalised", {"model_forward": signed_policy, "obs_normalization": True}, ZERO, 2),
    ],
)
def test_policy_episode_matches_single_rollout(kind, kwargs, params, seed):
    """The episode drawn is the one `single_rollout(jax.random.key(seed), ...)` evaluates."""
    manager = policy_manager(**kwargs)
    obs_stats = None
    if manager.obs_normalization:
        obs_stats = normalization.init((4,))
        seen = [[0.1, 1.0, -0.02, 0.5], [-0.1, 2.0, 0.03, -0.5], [0.0, 0.5, 0.01, 0.1]]
        for x in jnp.array(seen):
            obs_stats = normalization.update(obs_stats, x)
    *_, done, cum_return = manager.single_rollout(jax.random.key(seed), params, obs_stats=obs_stats)
    done = np.asarray(done)
    length = int(np.argmax(done)) + 1 if done.any() else manager.num_env_steps
    if kind == "lean":  # balances all 80 steps; draw only the first 30
        assert not done.any()
        states, rewards = visualize.policy_episode(manager, params, seed=seed, max_steps=30)
        assert len(states.time) == 31 and rewards.sum() == 30
        return
    env = manager.env
    states, rewards = visualize.policy_episode(manager, params, obs_stats=obs_stats, seed=seed)
    assert list(states.time) == list(range(length + 1))
    assert np.isclose(rewards.sum(), float(cum_return))
    if kind == "random" and seed == 3:  # render_policy draws exactly these states
        frames = visualize.render_policy(manager, params, manager.env_params, seed=seed, captions=False)
        assert len(frames) == length + 1 > 3
        assert all(np.array_equal(a, b) for a, b in zip(frames, render(env, None, states)))


def test_render_policy_needs_obs_stats_when_normalising():
    manager = policy_manager(model_forward=signed_policy, obs_normalization=True)
    with pytest.raises(ValueError, match="obs_stats"):
        visualize.render_policy(manager, jnp.zeros(()))


def test_max_steps_must_be_positive():
    with pytest.raises(ValueError, match="max_steps"):
        visualize.policy_episode(policy_manager(), ZERO, max_steps=0)


def test_render_policy_captions_each_frame_with_step_and_return():
    manager = policy_manager()
    plain = visualize.render_policy(manager, ZERO, seed=3, captions=False)
    captioned = visualize.render_policy(manager, ZERO, seed=3)
    assert len(plain) == len(captioned)
    assert captioned[0].shape == (plain[0].shape[0] + 16,) + plain[0].shape[1:]
    assert np.array_equal(captioned[-1][16:], plain[-1]) and not np.array_equal(captioned[0][:16], captioned[-1][:16])
