"""Miscellaneous environments: grid worlds, meta-RL bandits and navigation, Pong, Reacher and
Swimmer."""

from .bernoulli_bandit import BernoulliBandit
from .four_rooms import FourRooms
from .frozen_lake import FrozenLake
from .gaussian_bandit import GaussianBandit
from .meta_maze import MetaMaze
from .point_robot import PointRobot
from .pong import Pong
from .reacher import Reacher
from .swimmer import Swimmer

__all__ = [
    "BernoulliBandit",
    "FourRooms",
    "FrozenLake",
    "GaussianBandit",
    "MetaMaze",
    "PointRobot",
    "Pong",
    "Reacher",
    "Swimmer",
]
