"""MNISTBandit-bsuite: classify one digit image per episode; +1 if right, -1 if wrong.

Osband et al. (2020), "Behaviour Suite for Reinforcement Learning", ICLR (experiment
`mnist`). Reference implementation: `bsuite.environments.mnist.MNISTBandit` (bsuite 0.3.x).

Every episode is one step: reset shows a uniformly drawn image of the data set as a float32
array of shape (height, width) with values in [0, 1]; the action (one of 10 labels) is
rewarded +1 if it is the image's label and -1 otherwise, and the episode terminates with an
all-zero observation. `fraction` keeps only the first `int(fraction * N)` images, as bsuite.

Data: nothing is downloaded at run time (bsuite's loader downloads the 60k 28x28 MNIST
training set). By default the environment uses the 8x8 hand-written digits shipped with
popeval in `data/digits.npz` (1797 images of the digits 0-9, uint8 pixel values 0..16,
scaled by 1/16 here, and uint8 labels). Source and licence: the test set of the UCI ML
hand-written digits data set ("Optical Recognition of Handwritten Digits", E. Alpaydin &
C. Kaynak, 1998, https://archive.ics.uci.edu/ml/datasets/Optical+Recognition+of+Handwritten+Digits)
as bundled in scikit-learn (`sklearn.datasets.load_digits()`, distributed under scikit-learn's
BSD-3-Clause licence), copied unchanged; scikit-learn is not needed at run time.
Alternatively pass your own `images` (N, height, width) and `labels` (N,) in 0..9 (e.g. real
MNIST): integer images are taken as 0..255 pixels and scaled by 1/255 as bsuite does, float
images must already lie in [0, 1]. The data are `EnvParams` fields (`images`, `labels`), so jitted code takes them as
arguments instead of baking them into the compiled program as constants (which for real MNIST
would mean hundreds of megabytes of program); to evaluate a population, vmap over policies,
not over a stacked copy of these params. `tests/environments/test_bsuite.py` steps bsuite's environment
side by side after patching bsuite's dataset loader to return the same arrays.
"""

from __future__ import annotations

from importlib import resources

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from .. import spaces
from ..checks import bounded, params_dataclass
from ..environment import Environment

NUM_LABELS = 10


@struct.dataclass
class EnvState:
    index: jax.Array  # int32: the image shown this episode
    time: jax.Array


@params_dataclass
class EnvParams:
    images: jax.Array = bounded(low=0.0, high=1.0)  # (num_data, height, width) float32
    labels: jax.Array = bounded(low=0, high=NUM_LABELS - 1)  # (num_data,) int32
    max_steps_in_episode: int = bounded(1, 1)  # one guess per episode


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The shipped 8x8 digits (as `sklearn.datasets.load_digits`): images float32 in [0, 1], labels int32."""
    with resources.files(__package__).joinpath("data", "digits.npz").open("rb") as f, np.load(f) as data:
        images, labels = data["images"], data["labels"]
    return (images / 16.0).astype(np.float32), labels.astype(np.int32)


def _check_data(images, labels) -> tuple[np.ndarray, np.ndarray]:
    name = "MNISTBandit-bsuite"
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim != 3 or images.shape[0] < 1:
        raise ValueError(f"{name}: images must have shape (N, height, width), got {images.shape}")
    if labels.shape != images.shape[:1]:
        raise ValueError(f"{name}: labels must have shape ({images.shape[0]},), got {labels.shape}")
    integer = np.issubdtype(labels.dtype, np.integer)
    if not integer or not 0 <= labels.min() <= labels.max() < NUM_LABELS:
        raise ValueError(f"{name}: labels must be integers in 0..{NUM_LABELS - 1}")
    if np.issubdtype(images.dtype, np.integer):
        if images.min() < 0 or images.max() > 255:
            raise ValueError(f"{name}: integer images must hold 0..255 pixel values")
        images = images.astype(np.float32) / 255  # bsuite's scaling of uint8 pixels
    elif np.issubdtype(images.dtype, np.floating):
        if not (np.all(np.isfinite(images)) and images.min() >= 0.0 and images.max() <= 1.0):
            raise ValueError(f"{name}: float images must lie in [0, 1]")
    else:
        raise ValueError(f"{name}: images must be integer (0..255) or float ([0, 1]) arrays")
    return images.astype(np.float32), labels.astype(np.int32)


class MNISTBandit(Environment):
    """Ten actions: the guessed label."""

    env_id = "MNISTBandit-bsuite"
    stochastic = False  # only the reset draws (the image)

    def __init__(self, images=None, labels=None, fraction: float = 1.0):
        if (images is None) != (labels is None):
            raise ValueError("MNISTBandit-bsuite: pass both images and labels, or neither")
        number = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
        if not number or not 0 < fraction <= 1:
            raise ValueError(f"MNISTBandit-bsuite: fraction must be in (0, 1], got {fraction!r}")
        if images is None:
            images, labels = load_digits()
        images, labels = _check_data(images, labels)
        num_data = int(fraction * len(labels))
        if num_data < 1:
            raise ValueError(
                f"MNISTBandit-bsuite: fraction={fraction} keeps no image of {len(labels)}"
            )
        self.image_shape = images.shape[1:]  # (height, width): shape-defining
        self._images = jnp.asarray(images[:num_data])
        self._labels = jnp.asarray(labels[:num_data])

    @property
    def default_params(self) -> EnvParams:
        return EnvParams(images=self._images, labels=self._labels)

    def reset_state(self, key, params):
        index = jax.random.randint(key, (), 0, params.labels.shape[0], dtype=jnp.int32)
        return EnvState(index=index, time=jnp.int32(0))

    def transition(self, key, state, action, params):
        reward = jnp.where(action == params.labels[state.index], 1.0, -1.0)
        return state, reward, jnp.bool_(True)

    def get_obs(self, state, params=None, key=None):
        params = self._params(params)
        return jnp.where(state.time == 0, params.images[state.index], 0.0)

    def observation_space(self, params=None):
        return spaces.Box(0.0, 1.0, self.image_shape, jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(NUM_LABELS)
