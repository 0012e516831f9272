"""Painters of the bsuite environments: Catch, DeepSea and MNIST as grids of cells, the
chains as their observation vector (one cell per entry, shaded between the observation
space's bounds), the bandit as bars of the arm rewards."""

from __future__ import annotations

import numpy as np

from ..bsuite import (
    Catch,
    DeepSea,
    DiscountingChain,
    MemoryChain,
    MNISTBandit,
    SimpleBandit,
    UmbrellaChain,
)
from .kit import AGENT, BALL, BLACK, LIGHT, WHITE, bars, cell_colours, cell_mask, grid_image, shade

__all__ = ["OBS_PAINTERS", "PAINTERS"]


def paint_catch(env, p, s, obs):
    shape = (env.rows, env.columns)
    paddle = cell_mask(shape, env.rows - 1, s.paddle_x)
    ball = cell_mask(shape, s.ball_y, s.ball_x)
    return grid_image(cell_colours(shape, LIGHT, (paddle, AGENT), (ball, BALL)), WHITE)


def paint_deep_sea(env, p, s, obs):
    shape = (env.size, env.size)
    rows, cols = np.indices(shape)
    treasure = cell_mask(shape, env.size - 1, env.size - 1)
    unreachable = cols > rows  # the agent drops one row per step and moves at most one column
    agent = cell_mask(shape, s.row, s.column)  # off the grid after the last step
    layers = [(unreachable, (160, 170, 190)), (treasure, (255, 200, 40)), (agent, BALL)]
    return grid_image(cell_colours(shape, (40, 80, 140), *layers), gap=(30, 60, 110))


def paint_mnist(env, p, s, obs):
    image = np.asarray(p.images)[int(s.index)]  # the observation is blank after the guess
    return grid_image(shade(image, 0.0, 1.0, BLACK, WHITE))


def paint_chain(env, p, s, obs):
    space = env.observation_space(p)
    colours = shade(obs, space.low, space.high)
    return grid_image(colours.reshape(1, -1, 3), gap=(200, 200, 200))


def paint_simple_bandit(env, p, s, obs):
    return bars(p.rewards, 0.0, 1.0)


PAINTERS = {
    Catch: paint_catch,
    DeepSea: paint_deep_sea,
    MemoryChain: paint_chain,
    UmbrellaChain: paint_chain,
    DiscountingChain: paint_chain,
    SimpleBandit: paint_simple_bandit,
    MNISTBandit: paint_mnist,
}
OBS_PAINTERS = frozenset({paint_chain})
