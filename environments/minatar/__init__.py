"""MinAtar games (Young & Tian, 2019) in pure JAX, proven equal to the `minatar` package."""

from .asterix import Asterix
from .breakout import Breakout
from .freeway import Freeway
from .seaquest import Seaquest
from .space_invaders import SpaceInvaders

__all__ = [
    "Asterix",
    "Breakout",
    "Freeway",
    "Seaquest",
    "SpaceInvaders",
]
