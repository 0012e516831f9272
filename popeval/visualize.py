"""Draw one episode of a policy: the engine plays it, `popeval.environments.rendering` draws it.

    frames = render_policy(manager, params, seed=0)      # list of (H, W, 3) uint8 frames
    save_gif(frames, "policy.gif")

The episode is exactly `manager.single_rollout(jax.random.key(seed), params, ...)`'s (same
keys, normalisation and recurrent carry: `RolloutWrapper.episode_states`), cut after the
step that ends it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from popeval.checkpoint import atomic_write
from popeval.environments.rendering import encode_gif, image_format, render
from popeval.environments.rendering.kit import caption

__all__ = ["policy_episode", "render_policy", "save_gif"]


def policy_episode(manager, params: Any, env_params: Any = None, obs_stats: Any = None, seed: int = 0,
                   max_steps: int | None = None) -> tuple[Any, np.ndarray]:
    """`(states, rewards)` of one episode of `params` (see `RolloutWrapper.episode_states`)."""
    return manager.episode_states(jax.random.key(seed), params, env_params, obs_stats, max_steps)


def render_policy(manager, params: Any, env_params: Any = None, obs_stats: Any = None, seed: int = 0,
                  max_steps: int | None = None, captions: bool = True) -> list[np.ndarray]:
    """One frame per state of `policy_episode(...)`: the reset state, then one per step.

    Args:
        manager: the `RolloutWrapper` whose environment and policy semantics to follow.
        params: one member's policy parameters.
        env_params: the environment's params (`None`: `manager.env_params`).
        obs_stats: observation statistics, required when the manager normalises.
        seed: the episode is `manager.single_rollout(jax.random.key(seed), params, ...)`'s.
        max_steps: the most steps to draw (default `manager.num_env_steps`).
        captions: a strip above each frame with the environment, the step and the return so
            far, as `Visualizer` draws them.
    """
    states, rewards = policy_episode(manager, params, env_params, obs_stats, seed, max_steps)
    env_params = manager.env_params if env_params is None else env_params
    frames = render(manager.env, env_params, states)
    if not captions:
        return frames
    returns = np.concatenate([[0.0], np.cumsum(rewards)])
    return [caption(f, f"{manager.env_name}  t={t}  R={returns[t]:.2f}") for t, f in enumerate(frames)]


def save_gif(frames, path, fps: float = 30) -> Path:
    """`popeval.environments.rendering.save_gif`, written atomically and never through a
    symbolic link (`checkpoint.atomic_write`): what `popeval render` writes into a run directory."""
    path = Path(path)
    data = encode_gif(frames, fps, image_format(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)
    return path
