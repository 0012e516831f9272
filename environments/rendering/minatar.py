"""Painter of the MinAtar games: one square per cell, coloured by the observation channels
(one colour per channel, the later channel on top, as minatar's own display)."""

from __future__ import annotations

import numpy as np

from ..minatar.common import MinAtarEnv
from .kit import BLACK, Colour, cell_colours, grid_image

__all__ = ["CHANNEL_COLOURS", "OBS_PAINTERS", "PAINTERS"]

#: One colour per MinAtar channel, in channel order (up to 10 channels, Seaquest's count).
CHANNEL_COLOURS: tuple[Colour, ...] = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (188, 189, 34), (23, 190, 207), (220, 220, 220),
)  # fmt: skip


def paint_minatar(env, p, s, obs):
    obs = np.asarray(obs, bool)  # (10, 10, C); later channels drawn over earlier ones
    colours = CHANNEL_COLOURS * (1 + obs.shape[-1] // len(CHANNEL_COLOURS))
    layers = [(obs[..., c], colours[c]) for c in range(obs.shape[-1])]
    return grid_image(cell_colours(obs.shape[:2], BLACK, *layers), gap=(30, 30, 30))


PAINTERS = {MinAtarEnv: paint_minatar}
OBS_PAINTERS = frozenset({paint_minatar})
