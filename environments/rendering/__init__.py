"""Pictures of environment states: RGB frames and animated GIFs.

    frames = render(env, env_params, states)       # list of (H, W, 3) uint8 arrays
    save_gif(frames, "episode.gif", fps=30)
    Visualizer(env, env_params, state_seq, cum_rewards).animate("anim.gif")   # gymnax's usage

Frames are drawn on the host with numpy and Pillow (no pygame, no ffmpeg) by one painter per
environment class. Each family module (`classic_control`, `minatar`, `bsuite`, `misc`) holds
its painters and a `PAINTERS` table keyed by environment class; `render` walks the
environment's class hierarchy through those tables. `kit` holds the drawing primitives.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from . import bsuite, classic_control, minatar, misc
from .kit import caption

__all__ = ["Visualizer", "encode_gif", "image_format", "render", "save_gif"]

_FAMILIES = (classic_control, minatar, bsuite, misc)


def _merge(tables) -> dict[type, Callable]:
    merged: dict[type, Callable] = {}
    for table in tables:
        twice = [cls.__name__ for cls in table if cls in merged]
        if twice:
            raise ValueError(f"rendering: more than one painter for {', '.join(twice)}")
        merged.update(table)
    return merged


#: Environment class -> painter(env, params, state, obs) -> (H, W, 3) uint8; `state` and `params`
#: have numpy leaves, `obs` is `env.get_obs(state, params)` for the `_OBS_PAINTERS` (else None).
_PAINTERS = _merge(family.PAINTERS for family in _FAMILIES)

#: The painters that draw the observation (`render` computes it only for them).
_OBS_PAINTERS = frozenset().union(*(family.OBS_PAINTERS for family in _FAMILIES))


def _painter_for(env) -> Callable:
    """The painter of the nearest class of `env` that has one; `TypeError` when none has."""
    for cls in type(env).__mro__:
        if cls in _PAINTERS:
            return _PAINTERS[cls]
    names = ", ".join(cls.__name__ for cls in _PAINTERS)
    raise TypeError(f"render: no painter for {type(env).__name__}; rendering supports {names}")


def _stack(states) -> Any:
    """States as one EnvState with numpy leaves and a leading time axis."""
    if isinstance(states, (list, tuple)):
        if not states:
            raise ValueError("render: got an empty list of states")
        return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *states)
    stacked = jax.tree.map(np.asarray, states)
    if np.ndim(stacked.time) == 0:  # a single state
        return jax.tree.map(lambda x: x[None], stacked)
    if np.ndim(stacked.time) != 1:
        raise ValueError(
            f"render: draws one sequence of states; got states whose `time` has shape "
            f"{np.shape(stacked.time)} (a batch? render one episode at a time)"
        )
    return stacked


def render(env, params, states) -> list[np.ndarray]:
    """Draws states of `env`, one frame each.

    Args:
        env: a popeval environment (any registered one).
        params: its `EnvParams` (`None`: the default params).
        states: a list of `EnvState`s, or one `EnvState` whose leaves carry a leading time axis.

    Returns:
        A list of `(H, W, 3)` uint8 RGB arrays, one per state, all of the same shape.
    """
    env = getattr(env, "unwrapped", env)  # views (compat presets) draw their base environment
    paint = _painter_for(env)
    params = env.default_params if params is None else params
    stacked = _stack(states)
    num = len(stacked.time)
    obs = [None] * num
    if paint in _OBS_PAINTERS:  # one compiled call for the whole sequence
        obs = jax.jit(jax.vmap(env.get_obs, in_axes=(0, None)))(stacked, params)
        obs = np.asarray(obs)
    params = jax.tree.map(np.asarray, params)
    pick = lambda t: jax.tree.map(lambda x: x[t], stacked)  # noqa: E731
    return [paint(env, params, pick(t), obs[t]) for t in range(num)]


def encode_gif(frames: Sequence[np.ndarray], fps: float = 30, image_format: str = "GIF") -> bytes:
    """Frames as the bytes of an animated GIF that loops forever (Pillow, no ffmpeg).

    Each frame shows for `round(1000 / fps)` ms (GIF stores hundredths of a second, so
    `fps` of 100, 50, 25, 20, 10 ... are exact). Pillow stores a run of identical consecutive
    frames as one frame shown for their summed duration, so the file may hold fewer frames
    than `frames` while playing for the same time.
    """
    from PIL import Image

    frames = [np.asarray(f) for f in frames]
    if not frames:
        raise ValueError("save_gif: no frames")
    shapes = {f.shape for f in frames}
    if len(shapes) != 1 or len(frames[0].shape) != 3 or frames[0].shape[2] != 3:
        raise ValueError(
            f"save_gif: frames must all be (H, W, 3) arrays, got shapes {sorted(shapes)}"
        )
    if not fps > 0:
        raise ValueError(f"save_gif: fps must be positive, got {fps}")
    images = [Image.fromarray(f.astype(np.uint8), "RGB") for f in frames]
    encoded = io.BytesIO()
    images[0].save(encoded, image_format, save_all=True, append_images=images[1:], duration=round(1000 / fps),
                   loop=0)
    return encoded.getvalue()


def image_format(path: str | Path) -> str:
    """Pillow's format for `path`'s extension (`"GIF"` for `.gif`); `ValueError` if it has none."""
    from PIL import Image

    path = Path(path)
    found = Image.registered_extensions().get(path.suffix.lower())
    if found is None:
        raise ValueError(f"save_gif: {path}: unknown file extension {path.suffix!r} (use .gif)")
    return found


def save_gif(frames: Sequence[np.ndarray], path, fps: float = 30) -> Path:
    """Writes frames as an animated GIF that loops forever (`encode_gif`).

    Returns:
        The path written (parent folders are created).
    """
    path = Path(path)
    data = encode_gif(frames, fps, image_format(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


class Visualizer:
    """gymnax's `Visualizer` usage, drawn by `render` and written by `save_gif`.

    ```python
    vis = Visualizer(env, env_params, state_seq, cum_rewards)
    vis.animate("anim.gif")
    ```

    Args:
        env: a popeval environment.
        env_params: its params (`None`: the defaults).
        state_seq: a list of states (or one stacked state) to draw.
        reward_seq: optional values shown in each frame's caption as `R=` (gymnax's example
            passes the cumulative reward), one per state.
    """

    def __init__(self, env, env_params, state_seq, reward_seq=None):
        self.env, self.env_params, self.state_seq = env, env_params, state_seq
        self.reward_seq = None if reward_seq is None else np.asarray(reward_seq, np.float64).ravel()
        num_states = len(_stack(state_seq).time)
        if self.reward_seq is not None and len(self.reward_seq) != num_states:
            raise ValueError(
                f"Visualizer: reward_seq has {len(self.reward_seq)} entries for {num_states} states"
            )

    def frames(self) -> list[np.ndarray]:
        """The captioned frames: environment name, step and, if given, the reward value."""
        frames = render(self.env, self.env_params, self.state_seq)
        out = []
        for t, frame in enumerate(frames):
            text = f"{self.env.name}  t={t}"
            if self.reward_seq is not None:
                text += f"  R={self.reward_seq[t]:.2f}"
            out.append(caption(frame, text))
        return out

    def animate(self, save_fname="anim.gif", fps: float = 30) -> Path:
        """Writes the animation to `save_fname` (a GIF) and returns its path."""
        return save_gif(self.frames(), save_fname, fps=fps)
