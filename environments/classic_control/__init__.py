"""Classic-control environments, each equal to gymnasium 1.x's version."""

from .acrobot import Acrobot
from .cartpole import CartPole
from .mountain_car import MountainCar, MountainCarContinuous
from .pendulum import Pendulum

__all__ = ["Acrobot", "CartPole", "MountainCar", "MountainCarContinuous", "Pendulum"]
