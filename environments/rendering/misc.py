"""Painters of the misc environments: the grid worlds (FourRooms, MetaMaze, FrozenLake,
Pong) as grids of cells, the meta-RL bandits as bars of the arm values (the last arm
pulled highlighted), PointRobot, Reacher and Swimmer from their state geometry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..misc import FourRooms, FrozenLake, MetaMaze, PointRobot, Pong, Reacher, Swimmer
from ..misc.common import MetaBandit
from ..misc.swimmer import link_angles, link_centres
from .kit import (
    AGENT,
    BALL,
    BLACK,
    GOAL,
    LIGHT,
    OPPONENT,
    WALL,
    WHITE,
    Canvas,
    Colour,
    bars,
    cell_colours,
    cell_mask,
    grid_image,
    rect,
)

__all__ = ["FROZEN_LAKE_TILES", "OBS_PAINTERS", "PAINTERS"]

FROZEN_LAKE_TILES: dict[str, Colour] = {
    "S": (230, 242, 255), "F": (200, 225, 250), "H": (25, 40, 70), "G": GOAL,
}  # fmt: skip


# --------------------------------------------------------------------------- grid worlds
def paint_maze(env, p, s, obs):
    """FourRooms and MetaMaze: the walls, the goal and the agent."""
    shape = env.walls.shape
    goal, agent = cell_mask(shape, *s.goal), cell_mask(shape, *s.pos)
    layers = [(env.walls, WALL), (goal, GOAL), (agent, AGENT)]
    return grid_image(cell_colours(shape, LIGHT, *layers), gap=(220, 220, 220))


def paint_frozen_lake(env, p, s, obs):
    tiles = np.array([list(row) for row in env.desc])
    layers = [(tiles == t, c) for t, c in FROZEN_LAKE_TILES.items()]
    layers.append((cell_mask(tiles.shape, *divmod(int(s.pos), env.ncol)), BALL))
    return grid_image(cell_colours(tiles.shape, WHITE, *layers), gap=WHITE)


def paint_pong(env, p, s, obs):
    shape = (env.height, env.width)
    rows, cols = np.indices(shape)
    spans = lambda top: (rows >= top) & (rows < top + env.paddle_len)  # noqa: E731
    layers = [
        (spans(s.agent_top) & (cols == 0), AGENT),
        (spans(s.opponent_top) & (cols == env.width - 1), OPPONENT),
        (cell_mask(shape, *s.ball), WHITE),
    ]
    return grid_image(cell_colours(shape, BLACK, *layers), gap=(30, 30, 30))


# --------------------------------------------------------------------------- bandits
def paint_meta_bandit(env, p, s, obs):
    arms = np.asarray(s.arms, np.float64)
    low, high = (float(b) for b in env.reward_bounds(p))
    if not (np.isfinite(low) and np.isfinite(high)):  # Gaussian arms: a symmetric axis
        high = float(np.ceil(np.max(np.abs(arms)) + 1e-9))
        low = -high
    return bars(arms, low, high, highlight=int(s.last_action))


# --------------------------------------------------------------------------- continuous
def paint_point_robot(env, p, s, obs):
    arena = float(p.arena)
    canvas = Canvas(300, 300, scale=145 / arena, origin=(150, 150))
    square = lambda half: rect(-half, half, -half, half)[[0, 1, 2, 3, 0]]  # noqa: E731
    canvas.line(square(arena), WALL)
    canvas.line(square(float(p.goal_range)), (200, 200, 200))  # where goals are drawn from
    canvas.circle(s.goal, max(float(p.goal_radius), 0.02 * arena), GOAL)
    canvas.line([s.pos - s.last_action, s.pos], (150, 150, 150), width=2)  # the last move
    canvas.circle(s.pos, 0.03 * arena, AGENT)
    return canvas.frame()


def paint_reacher(env, p, s, obs):
    length = float(p.link_length)
    reach = env.num_links * length
    canvas = Canvas(300, 300, scale=140 / reach, origin=(150, 150))
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


# The swimmer's own kinematics, compiled once: eager jnp calls per frame dispatch op by op.
_swimmer_links = jax.jit(
    lambda pose, joints, length: (
        link_centres(jnp.concatenate([pose, joints]), length),
        link_angles(jnp.concatenate([pose, joints])),
    )
)


def paint_swimmer(env, p, s, obs):
    length = float(p.link_length)
    centres, phi = (np.asarray(a, np.float64) for a in _swimmer_links(s.pose, s.joints, length))
    tangents = np.stack([np.cos(phi), np.sin(phi)], -1)
    scale = 400 / (2.5 * env.num_links * length)
    x, y = (float(v) for v in s.pose[:2])
    canvas = Canvas(400, 240, scale=scale, origin=(200 - scale * x, 120 - scale * y))  # follow it
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


PAINTERS = {
    FourRooms: paint_maze,
    MetaMaze: paint_maze,
    FrozenLake: paint_frozen_lake,
    MetaBandit: paint_meta_bandit,
    PointRobot: paint_point_robot,
    Pong: paint_pong,
    Reacher: paint_reacher,
    Swimmer: paint_swimmer,
}
OBS_PAINTERS = frozenset()
