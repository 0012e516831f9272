"""bsuite environments (Osband et al. 2020), each equal to the `bsuite` package's version."""

from .bandit import SimpleBandit
from .catch import Catch
from .deep_sea import DeepSea
from .discounting_chain import DiscountingChain
from .memory_chain import MemoryChain
from .mnist import MNISTBandit
from .umbrella_chain import UmbrellaChain

__all__ = [
    "Catch",
    "DeepSea",
    "DiscountingChain",
    "MNISTBandit",
    "MemoryChain",
    "SimpleBandit",
    "UmbrellaChain",
]
