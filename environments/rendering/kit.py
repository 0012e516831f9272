"""The drawing kit the painters share: colours, a y-up `Canvas`, cell grids and bar charts.

Pillow is imported inside the functions that draw, so importing the painters (and
`popeval.environments`) does not import it.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "AGENT",
    "BALL",
    "BLACK",
    "GOAL",
    "LIGHT",
    "OPPONENT",
    "WALL",
    "WHITE",
    "Canvas",
    "Colour",
    "bars",
    "caption",
    "cell_colours",
    "cell_mask",
    "grid_image",
    "rect",
    "rotate",
    "shade",
]

Colour = tuple[int, int, int]
WHITE: Colour = (255, 255, 255)
BLACK: Colour = (0, 0, 0)
LIGHT: Colour = (245, 245, 245)  # grid-world floor
WALL: Colour = (70, 70, 70)
AGENT: Colour = (31, 119, 180)
GOAL: Colour = (44, 160, 44)
BALL: Colour = (214, 39, 40)
OPPONENT: Colour = (255, 127, 14)

_SUPERSAMPLE = 2  # canvases are drawn at 2x and box-filtered down: smooth edges
_GRID_PIXELS = 240  # grid worlds: the longer side of the picture, in pixels (before gaps)


class Canvas:
    """A Pillow picture addressed in world coordinates, y up.

    A world point `(x, y)` lands on pixel `(origin_x + scale * x, height - (origin_y + scale * y))`.
    Everything is drawn `_SUPERSAMPLE` times larger and box-filtered down by `frame()`.
    """

    def __init__(self, width, height, scale=1.0, origin=(0.0, 0.0), background=WHITE):
        from PIL import Image, ImageDraw

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


def rect(left, right, bottom, top, angle=0.0, at=(0.0, 0.0)) -> np.ndarray:
    """Corners (4, 2) of a rectangle rotated counter-clockwise by `angle`, then moved to `at`."""
    corners = np.array([(left, bottom), (left, top), (right, top), (right, bottom)], np.float64)
    return rotate(corners, angle) + np.asarray(at, np.float64)


def rotate(points, angle) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.asarray(points, np.float64) @ np.array([[c, s], [-s, c]])


def cell_colours(shape, background: Colour, *layers) -> np.ndarray:
    """(H, W, 3) cell colours: `background`, then each `(mask, colour)` layer painted on top."""
    out = np.empty((*shape, 3), np.uint8)
    out[:] = background
    for mask, colour in layers:
        out[np.asarray(mask, bool)] = colour
    return out


def cell_mask(shape, row, col) -> np.ndarray:
    """(H, W) bool mask of cell `(row, col)`; empty when the cell is off the grid."""
    rows = np.arange(shape[0])[:, None] == np.asarray(row)
    return rows & (np.arange(shape[1])[None, :] == np.asarray(col))


def grid_image(colours: np.ndarray, gap: Colour | None = None) -> np.ndarray:
    """Pixels of an (H, W, 3) array of cell colours: square cells, 1-pixel `gap` lines between."""
    h, w = colours.shape[:2]
    cell = max(4, _GRID_PIXELS // max(h, w))
    img = np.repeat(np.repeat(np.asarray(colours, np.uint8), cell, 0), cell, 1)
    if gap is not None:
        img[cell - 1 : -1 : cell] = gap
        img[:, cell - 1 : -1 : cell] = gap
    return img


def shade(values, low, high, cold: Colour = WHITE, hot: Colour = AGENT) -> np.ndarray:
    """Colours (..., 3) interpolating `cold` -> `hot` as `values` go from `low` to `high`."""
    low, high = np.broadcast_arrays(np.asarray(low, np.float64), np.asarray(high, np.float64))
    span = np.where(np.isfinite(high - low) & (high > low), high - low, 1.0)
    base = np.where(np.isfinite(low), low, 0.0)
    u = np.clip((np.asarray(values, np.float64) - base) / span, 0.0, 1.0)[..., None]
    return np.round((1 - u) * np.asarray(cold) + u * np.asarray(hot)).astype(np.uint8)


def bars(values, low: float, high: float, highlight: int = -1) -> np.ndarray:
    """A bar chart of `values` on the axis `[low, high]`; bar `highlight` in another colour."""
    values = np.asarray(values, np.float64)
    n = len(values)
    width, height = max(160, 30 * n + 20), 160
    scale = (height - 20) / max(high - low, 1e-9)
    canvas = Canvas(width, height, scale=scale, origin=(10.0, 10.0 - scale * low))
    pitch = (width - 20) / (n * scale)  # one bar slot, in world units
    for i, v in enumerate(np.clip(values, low, high)):
        colour = OPPONENT if i == highlight else AGENT
        canvas.polygon(rect((i + 0.1) * pitch, (i + 0.9) * pitch, 0.0, v), colour)
    canvas.line([(0.0, 0.0), (n * pitch, 0.0)], BLACK)
    return canvas.frame()


def caption(frame: np.ndarray, text: str) -> np.ndarray:
    """`frame` below a white strip holding `text`."""
    from PIL import Image, ImageDraw

    strip = Image.new("RGB", (frame.shape[1], 16), WHITE)
    ImageDraw.Draw(strip).text((4, 2), text, fill=BLACK)
    return np.concatenate([np.asarray(strip, np.uint8), frame])
