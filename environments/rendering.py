"""Pictures of environment states: RGB frames, animated GIFs and one episode of a policy.

    frames = render(env, env_params, states)       # list of (H, W, 3) uint8 arrays
    save_gif(frames, "episode.gif", fps=30)
    frames = render_policy(env, env_params, manager, policy_params)   # one episode of a policy
    Visualizer(env, env_params, state_seq, cum_rewards).animate("anim.gif")   # gymnax's usage

Frames are drawn on the host with numpy and Pillow (no pygame, no ffmpeg), one painter per
environment class, chosen from the `_PAINTERS` table:
- classic control repeats the geometry and colours of gymnasium 1.x's renderers (screen
  sizes, scales, cart and pole, pendulum rod and torque arrow, two-link acrobot with its
  goal line, mountain curve with car and goal flag), drawn in y-up coordinates on a
  supersampled `_Canvas`;
- grid worlds (MinAtar, Catch, DeepSea, FourRooms, MetaMaze, FrozenLake, Pong, MNIST) paint
  one coloured square per cell with `_grid`; MinAtar from the observation channels (one colour
  per channel, the later channel on top, as minatar's own display);
- bsuite's chains are drawn as their observation vector (one cell per entry, shaded between
  the observation space's bounds), bandits as bars of the arm values (the last arm pulled
  highlighted);
- PointRobot, Reacher and Swimmer are drawn from their state geometry on a `_Canvas`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, ImageDraw

from .bsuite import (
    Catch,
    DeepSea,
    DiscountingChain,
    MemoryChain,
    MNISTBandit,
    SimpleBandit,
    UmbrellaChain,
)
from .classic_control import Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum
from .minatar.common import MinAtarEnv
from .misc import FourRooms, FrozenLake, MetaMaze, PointRobot, Pong, Reacher, Swimmer
from .misc.common import MetaBandit
from .misc.four_rooms import WALLS as FOUR_ROOMS_WALLS
from .misc.meta_maze import maze_walls
from .misc.swimmer import link_angles, link_centres

__all__ = ["Visualizer", "policy_episode", "render", "render_policy", "save_gif"]

Colour = tuple[int, int, int]
WHITE: Colour = (255, 255, 255)
BLACK: Colour = (0, 0, 0)
LIGHT: Colour = (245, 245, 245)  # grid-world floor
WALL: Colour = (70, 70, 70)
AGENT: Colour = (31, 119, 180)
GOAL: Colour = (44, 160, 44)
BALL: Colour = (214, 39, 40)
OPPONENT: Colour = (255, 127, 14)
#: One colour per MinAtar channel, in channel order (up to 10 channels, Seaquest's count).
CHANNEL_COLOURS: tuple[Colour, ...] = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (188, 189, 34), (23, 190, 207), (220, 220, 220),
)  # fmt: skip
FROZEN_LAKE_TILES: dict[str, Colour] = {
    "S": (230, 242, 255), "F": (200, 225, 250), "H": (25, 40, 70), "G": GOAL,
}  # fmt: skip

_SUPERSAMPLE = 2  # canvases are drawn at 2x and box-filtered down: smooth edges
_GRID_PIXELS = 240  # grid worlds: the longer side of the picture, in pixels (before gaps)


# --------------------------------------------------------------------------- drawing helpers
class _Canvas:
    """A Pillow picture addressed in world coordinates, y up.

    A world point `(x, y)` lands on pixel `(origin_x + scale * x, height - (origin_y + scale * y))`.
    Everything is drawn `_SUPERSAMPLE` times larger and box-filtered down by `frame()`.
    """

    def __init__(self, width, height, scale=1.0, origin=(0.0, 0.0), background=WHITE):
        self.width, self.height = int(width), int(height)
        self.scale, self.origin = float(scale), (float(origin[0]), float(origin[1]))
        k = _SUPERSAMPLE
        self._image = Image.new("RGB", (self.width * k, self.height * k), background)
        self._draw = ImageDraw.Draw(self._image)

    def _px(self, points) -> list[tuple[float, float]]:
        p = np.asarray(points, np.float64).reshape(-1, 2)
        x = (self.origin[0] + self.scale * p[:, 0]) * _SUPERSAMPLE
        y = (self.height - self.origin[1] - self.scale * p[:, 1]) * _SUPERSAMPLE
        return list(zip(x.tolist(), y.tolist()))

    def polygon(self, points, colour: Colour):
        self._draw.polygon(self._px(points), fill=colour)

    def circle(self, centre, radius: float, colour: Colour):
        """A disc of `radius` world units (at least half a pixel)."""
        ((x, y),) = self._px([centre])
        r = max(radius * self.scale, 0.5) * _SUPERSAMPLE
        self._draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)

    def line(self, points, colour: Colour, width: float = 1.0):
        """A polyline `width` pixels wide."""
        self._draw.line(self._px(points), fill=colour, width=max(1, round(width * _SUPERSAMPLE)))

    def frame(self) -> np.ndarray:
        return np.asarray(self._image.reduce(_SUPERSAMPLE), np.uint8)


def _rect(left, right, bottom, top, angle=0.0, at=(0.0, 0.0)) -> np.ndarray:
    """Corners (4, 2) of a rectangle rotated counter-clockwise by `angle`, then moved to `at`."""
    corners = np.array([(left, bottom), (left, top), (right, top), (right, bottom)], np.float64)
    return _rotate(corners, angle) + np.asarray(at, np.float64)


def _rotate(points, angle) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.asarray(points, np.float64) @ np.array([[c, s], [-s, c]])


def _cells(shape, background: Colour, *layers) -> np.ndarray:
    """(H, W, 3) cell colours: `background`, then each `(mask, colour)` layer painted on top."""
    out = np.empty((*shape, 3), np.uint8)
    out[:] = background
    for mask, colour in layers:
        out[np.asarray(mask, bool)] = colour
    return out


def _at(shape, row, col) -> np.ndarray:
    """(H, W) bool mask of cell `(row, col)`; empty when the cell is off the grid."""
    rows = np.arange(shape[0])[:, None] == np.asarray(row)
    return rows & (np.arange(shape[1])[None, :] == np.asarray(col))


def _grid(colours: np.ndarray, gap: Colour | None = None) -> np.ndarray:
    """Pixels of an (H, W, 3) array of cell colours: square cells, 1-pixel `gap` lines between."""
    h, w = colours.shape[:2]
    cell = max(4, _GRID_PIXELS // max(h, w))
    img = np.repeat(np.repeat(np.asarray(colours, np.uint8), cell, 0), cell, 1)
    if gap is not None:
        img[cell - 1 : -1 : cell] = gap
        img[:, cell - 1 : -1 : cell] = gap
    return img


def _shade(values, low, high, cold: Colour = WHITE, hot: Colour = AGENT) -> np.ndarray:
    """Colours (..., 3) interpolating `cold` -> `hot` as `values` go from `low` to `high`."""
    low, high = np.broadcast_arrays(np.asarray(low, np.float64), np.asarray(high, np.float64))
    span = np.where(np.isfinite(high - low) & (high > low), high - low, 1.0)
    base = np.where(np.isfinite(low), low, 0.0)
    u = np.clip((np.asarray(values, np.float64) - base) / span, 0.0, 1.0)[..., None]
    return np.round((1 - u) * np.asarray(cold) + u * np.asarray(hot)).astype(np.uint8)


def _bars(values, low: float, high: float, highlight: int = -1) -> np.ndarray:
    """A bar chart of `values` on the axis `[low, high]`; bar `highlight` in another colour."""
    values = np.asarray(values, np.float64)
    n = len(values)
    width, height = max(160, 30 * n + 20), 160
    scale = (height - 20) / max(high - low, 1e-9)
    canvas = _Canvas(width, height, scale=scale, origin=(10.0, 10.0 - scale * low))
    pitch = (width - 20) / (n * scale)  # one bar slot, in world units
    for i, v in enumerate(np.clip(values, low, high)):
        colour = OPPONENT if i == highlight else AGENT
        canvas.polygon(_rect((i + 0.1) * pitch, (i + 0.9) * pitch, 0.0, v), colour)
    canvas.line([(0.0, 0.0), (n * pitch, 0.0)], BLACK)
    return canvas.frame()


# --------------------------------------------------------------------------- classic control
# Geometry, sizes and colours of gymnasium 1.x's renderers (pixel units, y up).
def _cartpole(env, p, s, obs):
    scale = 600 / (2 * float(p.x_threshold))
    pole_width, pole_len, cart_width, cart_height = 10.0, scale * 2 * float(p.length), 50.0, 30.0
    cart = (float(s.x) * scale + 300.0, 100.0)
    axle = (cart[0], cart[1] + cart_height / 4)
    canvas = _Canvas(600, 400)
    w, h = cart_width / 2, cart_height / 2
    canvas.polygon(_rect(-w, w, -h, h, at=cart), BLACK)
    half = pole_width / 2
    pole = _rect(-half, half, -half, pole_len - half, -float(s.theta), axle)
    canvas.polygon(pole, (202, 152, 101))
    canvas.circle(axle, half, (129, 132, 203))
    canvas.line([(0, 100), (600, 100)], BLACK)
    return canvas.frame()


def _pendulum(env, p, s, obs):
    scale = 500 / (2 * 2.2)
    canvas = _Canvas(500, 500, scale=scale, origin=(250, 250))
    red = (204, 77, 77)
    angle = float(s.theta) + np.pi / 2
    canvas.polygon(_rect(0.0, 1.0, -0.1, 0.1, angle), red)
    canvas.circle((0, 0), 0.1, red)
    canvas.circle(_rotate([(1.0, 0.0)], angle)[0], 0.1, red)
    u = float(s.last_u)
    radius = abs(u) / 4  # gymnasium's arrow picture is |u| / 2 wide
    if radius * scale >= 2:  # a torque arrow: counter-clockwise for u > 0
        sweep = np.pi / 2 + np.sign(u) * np.linspace(-0.75 * np.pi, 0.75 * np.pi, 32)
        arc = radius * np.stack([np.cos(sweep), np.sin(sweep)], -1)
        canvas.line(arc, BLACK, width=max(1.0, 0.15 * radius * scale))
        tangent = np.sign(u) * np.array([-np.sin(sweep[-1]), np.cos(sweep[-1])])
        normal = np.array([-tangent[1], tangent[0]])
        tip, size = arc[-1], 0.35 * radius
        canvas.polygon([tip + size * tangent, tip + size * normal, tip - size * normal], BLACK)
    canvas.circle((0, 0), 0.05, BLACK)
    return canvas.frame()


def _acrobot(env, p, s, obs):
    lengths = (float(p.link_length_1), 1.0)  # gymnasium's LINK_LENGTH_2 is a fixed 1.0
    scale = 500 / (2 * (sum(lengths) + 0.2))
    canvas = _Canvas(500, 500, scale=scale, origin=(250, 250))
    a1, a2 = float(s.joint_angle1), float(s.joint_angle2)
    canvas.line([(-2.2, 1.0), (2.2, 1.0)], BLACK)  # the tip must rise above this line
    joint = (lengths[0] * np.sin(a1), -lengths[0] * np.cos(a1))
    angles = (a1 - np.pi / 2, a1 + a2 - np.pi / 2)  # of the links, from the +x axis
    for at, angle, length in zip([(0.0, 0.0), joint], angles, lengths):
        canvas.polygon(_rect(0.0, length, -0.1, 0.1, angle, at), (0, 204, 204))
        canvas.circle(at, 0.1, (204, 204, 0))
    return canvas.frame()


def _mountain_car(env, p, s, obs):
    low, high = float(p.min_position), float(p.max_position)
    scale = 600 / (high - low)
    height = lambda x: np.sin(3 * x) * 0.45 + 0.55  # noqa: E731
    canvas = _Canvas(600, 400)
    xs = np.linspace(low, high, 100)
    canvas.line(np.stack([(xs - low) * scale, height(xs) * scale], -1), BLACK)
    pos = float(s.position)
    tilt, at = np.cos(3 * pos), ((pos - low) * scale, 10 + height(pos) * scale)
    canvas.polygon(_rect(-20, 20, 0, 20, tilt, at), BLACK)
    for wheel in _rotate([(10.0, 0.0), (-10.0, 0.0)], tilt) + np.asarray(at):
        canvas.circle(wheel, 8.0, (128, 128, 128))
    flag_x = int((float(p.goal_position) - low) * scale)
    flag_y = int(height(float(p.goal_position)) * scale) + 50
    canvas.line([(flag_x, flag_y - 50), (flag_x, flag_y)], BLACK)
    flag = [(flag_x, flag_y), (flag_x, flag_y - 10), (flag_x + 25, flag_y - 5)]
    canvas.polygon(flag, (204, 204, 0))
    return canvas.frame()


# --------------------------------------------------------------------------- grid worlds
def _minatar(env, p, s, obs):
    obs = np.asarray(obs, bool)  # (10, 10, C); later channels drawn over earlier ones
    colours = CHANNEL_COLOURS * (1 + obs.shape[-1] // len(CHANNEL_COLOURS))
    layers = [(obs[..., c], colours[c]) for c in range(obs.shape[-1])]
    return _grid(_cells(obs.shape[:2], BLACK, *layers), gap=(30, 30, 30))


def _catch(env, p, s, obs):
    shape = (env.rows, env.columns)
    paddle = _at(shape, env.rows - 1, s.paddle_x)
    ball = _at(shape, s.ball_y, s.ball_x)
    return _grid(_cells(shape, LIGHT, (paddle, AGENT), (ball, BALL)), WHITE)


def _deep_sea(env, p, s, obs):
    shape = (env.size, env.size)
    rows, cols = np.indices(shape)
    treasure = _at(shape, env.size - 1, env.size - 1)
    unreachable = cols > rows  # the agent drops one row per step and moves at most one column
    agent = _at(shape, s.row, s.column)  # off the grid after the last step
    layers = [(unreachable, (160, 170, 190)), (treasure, (255, 200, 40)), (agent, BALL)]
    return _grid(_cells(shape, (40, 80, 140), *layers), gap=(30, 60, 110))


def _maze(walls, pos, goal):
    shape = walls.shape
    layers = [(walls, WALL), (_at(shape, *goal), GOAL), (_at(shape, *pos), AGENT)]
    return _grid(_cells(shape, LIGHT, *layers), gap=(220, 220, 220))


def _four_rooms(env, p, s, obs):
    return _maze(FOUR_ROOMS_WALLS, s.pos, s.goal)


def _meta_maze(env, p, s, obs):
    return _maze(maze_walls(env.size), s.pos, s.goal)


def _frozen_lake(env, p, s, obs):
    tiles = np.array([list(row) for row in env.desc])
    layers = [(tiles == t, c) for t, c in FROZEN_LAKE_TILES.items()]
    layers.append((_at(tiles.shape, *divmod(int(s.pos), env.ncol)), BALL))
    return _grid(_cells(tiles.shape, WHITE, *layers), gap=WHITE)


def _pong(env, p, s, obs):
    shape = (env.height, env.width)
    rows, cols = np.indices(shape)
    spans = lambda top: (rows >= top) & (rows < top + env.paddle_len)  # noqa: E731
    layers = [
        (spans(s.agent_top) & (cols == 0), AGENT),
        (spans(s.opponent_top) & (cols == env.width - 1), OPPONENT),
        (_at(shape, *s.ball), WHITE),
    ]
    return _grid(_cells(shape, BLACK, *layers), gap=(30, 30, 30))


def _mnist(env, p, s, obs):
    image = np.asarray(p.images)[int(s.index)]  # the observation is blank after the guess
    return _grid(_shade(image, 0.0, 1.0, BLACK, WHITE))


def _chain(env, p, s, obs):
    space = env.observation_space(p)
    colours = _shade(obs, space.low, space.high)
    return _grid(colours.reshape(1, -1, 3), gap=(200, 200, 200))


# --------------------------------------------------------------------------- bandits
def _simple_bandit(env, p, s, obs):
    return _bars(p.rewards, 0.0, 1.0)


def _meta_bandit(env, p, s, obs):
    arms = np.asarray(s.arms, np.float64)
    low, high = (float(b) for b in env.reward_bounds(p))
    if not (np.isfinite(low) and np.isfinite(high)):  # Gaussian arms: a symmetric axis
        high = float(np.ceil(np.max(np.abs(arms)) + 1e-9))
        low = -high
    return _bars(arms, low, high, highlight=int(s.last_action))


# --------------------------------------------------------------------------- continuous misc
def _point_robot(env, p, s, obs):
    arena = float(p.arena)
    canvas = _Canvas(300, 300, scale=145 / arena, origin=(150, 150))
    square = lambda half: _rect(-half, half, -half, half)[[0, 1, 2, 3, 0]]  # noqa: E731
    canvas.line(square(arena), WALL)
    canvas.line(square(float(p.goal_range)), (200, 200, 200))  # where goals are drawn from
    canvas.circle(s.goal, max(float(p.goal_radius), 0.02 * arena), GOAL)
    canvas.line([s.pos - s.last_action, s.pos], (150, 150, 150), width=2)  # the last move
    canvas.circle(s.pos, 0.03 * arena, AGENT)
    return canvas.frame()


def _reacher(env, p, s, obs):
    length = float(p.link_length)
    reach = env.num_links * length
    canvas = _Canvas(300, 300, scale=140 / reach, origin=(150, 150))
    canvas.circle((0, 0), reach, (235, 235, 235))  # the workspace
    phi = np.cumsum(np.asarray(s.angles, np.float64))
    links = length * np.stack([np.cos(phi), np.sin(phi)], -1)
    joints = np.concatenate([np.zeros((1, 2)), np.cumsum(links, 0)])
    canvas.circle(s.target, 0.06 * reach, BALL)
    canvas.line(joints, AGENT, width=0.05 * reach * canvas.scale)
    for joint in joints[:-1]:
        canvas.circle(joint, 0.04 * reach, WALL)
    canvas.circle(joints[-1], 0.03 * reach, OPPONENT)
    return canvas.frame()


# The swimmer's own kinematics, compiled once (eager jnp calls per frame were ~100x slower).
_swimmer_links = jax.jit(
    lambda pose, joints, length: (
        link_centres(jnp.concatenate([pose, joints]), length),
        link_angles(jnp.concatenate([pose, joints])),
    )
)


def _swimmer(env, p, s, obs):
    length = float(p.link_length)
    centres, phi = (np.asarray(a, np.float64) for a in _swimmer_links(s.pose, s.joints, length))
    tangents = np.stack([np.cos(phi), np.sin(phi)], -1)
    scale = 400 / (2.5 * env.num_links * length)
    x, y = (float(v) for v in s.pose[:2])
    canvas = _Canvas(400, 240, scale=scale, origin=(200 - scale * x, 120 - scale * y))  # follow it
    half_width = 200 / scale
    for gx in np.arange(np.floor(x - half_width), np.ceil(x + half_width) + 1):  # the water grid
        colour = (150, 150, 150) if gx == 0 else (225, 225, 225)  # x = 0 darker: the start
        canvas.line([(gx, y - 2 * half_width), (gx, y + 2 * half_width)], colour)
    starts = centres - length / 2 * tangents
    ends = np.concatenate([starts, centres[-1:] + length / 2 * tangents[-1:]])
    canvas.line(ends, AGENT, width=0.12 * length * scale)
    for joint in ends[1:-1]:
        canvas.circle(joint, 0.08 * length, WALL)
    canvas.circle(ends[0], 0.1 * length, BALL)  # the head: the front end of link 0
    return canvas.frame()


#: Environment class -> painter(env, params, state, obs) -> (H, W, 3) uint8; `state` and `params`
#: have numpy leaves, `obs` is `env.get_obs(state, params)` for the `_OBS_PAINTERS` (else None).
#: The first class the environment is an instance of wins.
_PAINTERS: tuple[tuple[type, Callable], ...] = (
    (CartPole, _cartpole),
    (Pendulum, _pendulum),
    (Acrobot, _acrobot),
    (MountainCar, _mountain_car),
    (MountainCarContinuous, _mountain_car),
    (MinAtarEnv, _minatar),
    (Catch, _catch),
    (DeepSea, _deep_sea),
    (MemoryChain, _chain),
    (UmbrellaChain, _chain),
    (DiscountingChain, _chain),
    (SimpleBandit, _simple_bandit),
    (MNISTBandit, _mnist),
    (FourRooms, _four_rooms),
    (MetaMaze, _meta_maze),
    (FrozenLake, _frozen_lake),
    (MetaBandit, _meta_bandit),
    (PointRobot, _point_robot),
    (Pong, _pong),
    (Reacher, _reacher),
    (Swimmer, _swimmer),
)


#: The painters that draw the observation (`render` computes it only for them).
_OBS_PAINTERS = (_minatar, _chain)


def _painter_for(env) -> Callable:
    """The painter of `env`'s class; `TypeError` for an environment it cannot draw."""
    for cls, paint in _PAINTERS:
        if isinstance(env, cls):
            return paint
    names = ", ".join(cls.__name__ for cls, _ in _PAINTERS)
    raise TypeError(f"render: no painter for {type(env).__name__}; rendering supports {names}")


# --------------------------------------------------------------------------- public API
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


def save_gif(frames: Sequence[np.ndarray], path, fps: float = 30) -> Path:
    """Writes frames as an animated GIF that loops forever (Pillow, no ffmpeg).

    Each frame shows for `round(1000 / fps)` ms (GIF stores hundredths of a second, so
    `fps` of 100, 50, 25, 20, 10 ... are exact). Pillow stores a run of identical consecutive
    frames as one frame shown for their summed duration, so the file may hold fewer frames
    than `frames` while playing for the same time.

    Returns:
        The path written (parent folders are created).
    """
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    duration = round(1000 / fps)
    images[0].save(path, save_all=True, append_images=images[1:], duration=duration, loop=0)
    return path


def policy_episode(env, env_params, manager, params, obs_stats=None, seed=0, max_steps=None):
    """The states (stacked, numpy leaves) of one episode of a policy, the reset state first.

    Steps exactly as `manager.single_rollout(jax.random.key(seed), params, env_params,
    obs_stats)`: the same key derivation (reset key and episode key from the seed's key, then
    `fold_in(episode_key, t)` split into policy and environment keys), `model_forward` with or
    without a recurrent carry, observations normalised with `obs_stats` when the manager
    normalises, random actions when it has no policy. Stops after the step that ends the
    episode or after `max_steps` (default `manager.num_env_steps`) steps.

    Returns:
        `(states, rewards)`: `states` with `n + 1` entries along the leading axis, `rewards (n,)`.
    """
    env_params = manager.env_params if env_params is None else env_params
    num_steps = manager.num_env_steps if max_steps is None else int(max_steps)
    if num_steps < 1:
        raise ValueError(f"render_policy: max_steps must be >= 1, got {max_steps}")
    normalize = None
    if manager.obs_normalization:
        if obs_stats is None:
            raise ValueError("render_policy: the manager normalises observations; pass obs_stats")
        from popeval.normalization import normalize  # deferred: environments never need popeval

    def act(params, obs_stats, env_params, obs, carry, key):
        if manager.model_forward is None:
            return env.action_space(env_params).sample(key), carry
        if normalize is not None:
            obs = normalize(obs_stats, obs)
        if manager.recurrent:
            return manager.model_forward(params, obs, carry, key)
        return manager.model_forward(params, obs, key), carry

    def episode(key, params, obs_stats, env_params):
        key_reset, key_episode = jax.random.split(key)
        obs, state = env.reset_env(key_reset, env_params)

        def step(carry, t):
            obs, state, policy_carry = carry
            key_policy, key_env = jax.random.split(jax.random.fold_in(key_episode, t))
            action, policy_carry = act(params, obs_stats, env_params, obs, policy_carry, key_policy)
            obs, state, reward, done, _ = env.step_env(key_env, state, action, env_params)
            return (obs, state, policy_carry), (state, reward, done)

        init = (obs, state, manager.init_carry if manager.recurrent else ())
        _, (states, rewards, dones) = jax.lax.scan(step, init, jnp.arange(num_steps))
        return state, states, rewards, dones

    first, states, rewards, dones = jax.tree.map(
        np.asarray, jax.jit(episode)(jax.random.key(seed), params, obs_stats, env_params)
    )
    n = int(np.argmax(dones)) + 1 if dones.any() else num_steps
    states = jax.tree.map(lambda a, b: np.concatenate([a[None], b[:n]]), first, states)
    return states, rewards[:n]


def render_policy(env, env_params, manager, params, obs_stats=None, seed=0, max_steps=None):
    """Frames of one episode of a policy (see `policy_episode` for how it is stepped).

    Args:
        env: the environment (`manager.env` for a run).
        env_params: its params (`None`: `manager.env_params`).
        manager: the `RolloutWrapper` whose policy semantics to follow.
        params: the policy parameters of one member.
        obs_stats: observation statistics, required when `manager.obs_normalization`.
        seed: the episode is `manager.single_rollout(jax.random.key(seed), params, ...)`'s.
        max_steps: the most steps to draw (default `manager.num_env_steps`).

    Returns:
        One frame per state: the reset state, then the state after each step until done.
    """
    states, _ = policy_episode(env, env_params, manager, params, obs_stats, seed, max_steps)
    env_params = manager.env_params if env_params is None else env_params
    return render(env, env_params, states)


def _caption(frame: np.ndarray, text: str) -> np.ndarray:
    """`frame` below a white strip holding `text`."""
    strip = Image.new("RGB", (frame.shape[1], 16), WHITE)
    ImageDraw.Draw(strip).text((4, 2), text, fill=BLACK)
    return np.concatenate([np.asarray(strip, np.uint8), frame])


class Visualizer:
    """gymnax's `Visualizer` usage, drawn by `render` and written by `save_gif`.

        vis = Visualizer(env, env_params, state_seq, cum_rewards)
        vis.animate("anim.gif")

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
            out.append(_caption(frame, text))
        return out

    def animate(self, save_fname="anim.gif", fps: float = 30) -> Path:
        """Writes the animation to `save_fname` (a GIF) and returns its path."""
        return save_gif(self.frames(), save_fname, fps=fps)
