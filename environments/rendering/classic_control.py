"""Painters of the classic-control environments: the geometry, sizes and colours of
gymnasium 1.x's renderers (screen sizes, scales, cart and pole, pendulum rod and torque
arrow, two-link acrobot with its goal line, mountain curve with car and goal flag), in
pixel units, y up.
"""

from __future__ import annotations

import numpy as np

from ..classic_control import Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum
from .kit import BLACK, Canvas, rect, rotate

__all__ = ["OBS_PAINTERS", "PAINTERS"]


def paint_cartpole(env, p, s, obs):
    scale = 600 / (2 * float(p.x_threshold))
    pole_width, pole_len, cart_width, cart_height = 10.0, scale * 2 * float(p.length), 50.0, 30.0
    cart = (float(s.x) * scale + 300.0, 100.0)
    axle = (cart[0], cart[1] + cart_height / 4)
    canvas = Canvas(600, 400)
    w, h = cart_width / 2, cart_height / 2
    canvas.polygon(rect(-w, w, -h, h, at=cart), BLACK)
    half = pole_width / 2
    pole = rect(-half, half, -half, pole_len - half, -float(s.theta), axle)
    canvas.polygon(pole, (202, 152, 101))
    canvas.circle(axle, half, (129, 132, 203))
    canvas.line([(0, 100), (600, 100)], BLACK)
    return canvas.frame()


def paint_pendulum(env, p, s, obs):
    scale = 500 / (2 * 2.2)
    canvas = Canvas(500, 500, scale=scale, origin=(250, 250))
    red = (204, 77, 77)
    angle = float(s.theta) + np.pi / 2
    canvas.polygon(rect(0.0, 1.0, -0.1, 0.1, angle), red)
    canvas.circle((0, 0), 0.1, red)
    canvas.circle(rotate([(1.0, 0.0)], angle)[0], 0.1, red)
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


def paint_acrobot(env, p, s, obs):
    lengths = (float(p.link_length_1), 1.0)  # gymnasium's LINK_LENGTH_2 is a fixed 1.0
    scale = 500 / (2 * (sum(lengths) + 0.2))
    canvas = Canvas(500, 500, scale=scale, origin=(250, 250))
    a1, a2 = float(s.joint_angle1), float(s.joint_angle2)
    canvas.line([(-2.2, 1.0), (2.2, 1.0)], BLACK)  # the tip must rise above this line
    joint = (lengths[0] * np.sin(a1), -lengths[0] * np.cos(a1))
    angles = (a1 - np.pi / 2, a1 + a2 - np.pi / 2)  # of the links, from the +x axis
    for at, angle, length in zip([(0.0, 0.0), joint], angles, lengths):
        canvas.polygon(rect(0.0, length, -0.1, 0.1, angle, at), (0, 204, 204))
        canvas.circle(at, 0.1, (204, 204, 0))
    return canvas.frame()


def paint_mountain_car(env, p, s, obs):
    low, high = float(p.min_position), float(p.max_position)
    scale = 600 / (high - low)
    height = lambda x: np.sin(3 * x) * 0.45 + 0.55  # noqa: E731
    canvas = Canvas(600, 400)
    xs = np.linspace(low, high, 100)
    canvas.line(np.stack([(xs - low) * scale, height(xs) * scale], -1), BLACK)
    pos = float(s.position)
    tilt, at = np.cos(3 * pos), ((pos - low) * scale, 10 + height(pos) * scale)
    canvas.polygon(rect(-20, 20, 0, 20, tilt, at), BLACK)
    for wheel in rotate([(10.0, 0.0), (-10.0, 0.0)], tilt) + np.asarray(at):
        canvas.circle(wheel, 8.0, (128, 128, 128))
    flag_x = int((float(p.goal_position) - low) * scale)
    flag_y = int(height(float(p.goal_position)) * scale) + 50
    canvas.line([(flag_x, flag_y - 50), (flag_x, flag_y)], BLACK)
    flag = [(flag_x, flag_y), (flag_x, flag_y - 10), (flag_x + 25, flag_y - 5)]
    canvas.polygon(flag, (204, 204, 0))
    return canvas.frame()


PAINTERS = {
    CartPole: paint_cartpole,
    Pendulum: paint_pendulum,
    Acrobot: paint_acrobot,
    MountainCar: paint_mountain_car,
    MountainCarContinuous: paint_mountain_car,
}
OBS_PAINTERS = frozenset()
