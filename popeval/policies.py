"""Policies whose output head follows the environment's action space, and parameter helpers.

    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(32, 32))
    params = policy.init_params(key, env, env_params)          # flax variables
    action = policy.apply(params, obs, key)                     # RolloutWrapper's model_forward

`Discrete(n)` action spaces get `n` logits and a greedy `argmax`; `Box` spaces get a `tanh`
head scaled to the bounds. With `head="sampled"` the action is drawn instead, from the step's
policy key (so members playing the same episode keys still share their random numbers): a
categorical over the logits, or a Gaussian around the `tanh` mean whose scale, in units of
the bounds' half-width, is `action_std` (fixed) or a learned parameter (`action_std=None`).
A `Discrete(n)` observation (a state index) is one-hot encoded.

`MLPPolicy` is feed-forward, `CNNPolicy` convolves image observations (`(H, W, C)`, MinAtar)
first. `LSTMPolicy` is recurrent: `apply(params, obs, carry, key)` returns `(action, carry)`
and `initialize_carry()` gives the episode's first carry.

ES works on flat vectors: `ParamReshaper` converts between a parameter pytree and a flat
`(num_dims,)` vector (and between stacked pytrees and `(P, num_dims)` matrices).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from popeval.environments import spaces

__all__ = ["MLPPolicy", "CNNPolicy", "LSTMPolicy", "ParamReshaper", "action_head", "conv_by_patches", "HEADS", "POOLS"]

#: How an action is chosen from the network output.
HEADS = ("greedy", "sampled")
#: What `CNNPolicy` does with its last convolution's output before the hidden layers.
POOLS = ("none", "max")


def _head_config(space: spaces.Space) -> tuple[int, bool, tuple[float, ...], tuple[float, ...]]:
    """(num_outputs, discrete, low, high) of the output head for an action space."""
    if isinstance(space, spaces.Discrete) or hasattr(space, "n") and not hasattr(space, "low"):
        return int(space.n), True, (), ()
    low = tuple(float(x) for x in jnp.ravel(jnp.asarray(space.low)))
    high = tuple(float(x) for x in jnp.ravel(jnp.asarray(space.high)))
    return len(low), False, low, high


def action_head(x: jax.Array, discrete: bool, low: Sequence[float], high: Sequence[float],
                key: jax.Array | None = None, std: jax.Array | None = None):
    """Maps the network output to an action: argmax for discrete, tanh-scaled for boxes; with
    a `key`, sampled: a categorical over the logits, or `std` (times the half-width) of
    Gaussian noise around the box's tanh mean, clipped to the bounds."""
    if discrete:
        if key is not None:
            return jax.random.categorical(key, x).astype(jnp.int32)
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    finite = jnp.isfinite(low) & jnp.isfinite(high)
    # centre + half-width * tanh, not low + (tanh + 1) * ...: XLA folds `(t + 1) - 1` to `t`
    # in some programs and not in others, which broke the bit-exact fitness == trajectory
    # promise for Box([-1, 1]) actions. The clip guards against rounding past a bound.
    mean = (low + high) * 0.5 + (high - low) * 0.5 * jnp.tanh(x)
    if key is None:
        return jnp.where(finite, jnp.clip(mean, low, high), x)
    noise = std * jax.random.normal(key, x.shape)
    return jnp.where(finite, jnp.clip(mean + (high - low) * 0.5 * noise, low, high), x + noise)


def _as_float(obs: jax.Array) -> jax.Array:
    """`obs` as float32. A boolean observation (MinAtar's) goes through a select: the same
    0/1 values, and XLA:CPU vectorises the select but not a bool-to-float convert
    (experiments/README.md, "Observation encoding")."""
    if obs.dtype == jnp.bool_:
        return jnp.where(obs, jnp.float32(1), jnp.float32(0))
    return obs.astype(jnp.float32)


def conv_by_patches(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding: Any,
                    lhs_dilation: Any = None, rhs_dilation: Any = None, dimension_numbers: Any = None,
                    feature_group_count: int = 1, precision: Any = None) -> jax.Array:
    """`lax.conv_general_dilated` for `nn.Conv`'s valid, stride-1 NHWC convolutions, as one
    matrix product: each output pixel's `(kh, kw, C)` window against the kernel reshaped to
    `(kh * kw * C, O)`. The same sums; under `vmap` over members' kernels XLA:CPU runs a
    batched product where lax's convolution runs a grouped one, 1.7x (3x3) to 3x (3x10) the
    time of a MinAtar population's evaluation (experiments/README.md, "CNN policies")."""
    ones = (None, (1, 1), [1, 1])
    if (padding != "VALID" or tuple(window_strides) != (1, 1) or feature_group_count != 1
            or lhs_dilation not in ones or rhs_dilation not in ones):
        raise ValueError("conv_by_patches computes valid, stride-1, undilated, ungrouped convolutions")
    kh, kw, c, o = rhs.shape
    ho, wo = lhs.shape[1] - kh + 1, lhs.shape[2] - kw + 1
    patches = jnp.concatenate([lhs[:, i:i + ho, j:j + wo, :] for i in range(kh) for j in range(kw)], axis=-1)
    return jnp.matmul(patches, rhs.reshape(kh * kw * c, o), precision=precision)


def _positive_ints(owner: str, name: str, sizes: Any) -> None:
    values = sizes if isinstance(sizes, (tuple, list)) else (sizes,)
    if not all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1 for n in values):
        raise ValueError(f"{owner}: {name} must be {'positive integers' if values is sizes else 'an integer >= 1'}, "
                         f"got {sizes!r}")


def _check_policy(policy: nn.Module) -> None:
    """Refuses settings that would fail deep inside flax or XLA (a layer of 0 units, say)."""
    owner = type(policy).__name__
    _positive_ints(owner, "num_outputs", policy.num_outputs)
    for name in ("hidden_sizes", "conv_channels", "kernel_size", "hidden_size"):
        if hasattr(policy, name):
            _positive_ints(owner, name, getattr(policy, name))
    if hasattr(policy, "kernel_size") and not (isinstance(policy.kernel_size, (tuple, list))
                                               and len(policy.kernel_size) == 2):
        raise ValueError(f"{owner}: kernel_size must be (height, width), got {policy.kernel_size!r}")
    if getattr(policy, "pool", "none") not in POOLS:
        raise ValueError(f"{owner}: pool must be one of {list(POOLS)}, got {policy.pool!r}")
    if policy.head not in HEADS:
        raise ValueError(f"{owner}: head must be one of {list(HEADS)}, got {policy.head!r}")
    activation = getattr(policy, "activation", "tanh")
    if not isinstance(activation, str) or not callable(getattr(nn, activation, None)):
        raise ValueError(f"{owner}: activation must name a flax.linen activation (tanh, relu, ...), "
                         f"got {activation!r}")
    std = policy.action_std
    if std is not None and (isinstance(std, bool) or not isinstance(std, (int, float)) or not 0 < std < float("inf")):
        raise ValueError(f"{owner}: action_std must be a finite number > 0 or None (learned), got {std!r}")


class _ForEnv:
    """Shared constructors from an environment, observation encoding and the action head."""

    @classmethod
    def for_env(cls, env: Any, env_params: Any = None, **kwargs: Any):
        """The policy for `env`'s action space (outputs, head, bounds) and observations; `kwargs`
        are the policy's own settings (`hidden_sizes`, `head`, ...)."""
        env_params = env.default_params if env_params is None else env_params
        n, discrete, low, high = _head_config(env.action_space(env_params))
        obs_space = env.observation_space(env_params)
        if isinstance(obs_space, spaces.Discrete) and "obs_categories" not in kwargs:
            kwargs["obs_categories"] = int(obs_space.n)
        return cls(num_outputs=n, discrete=discrete, low=low, high=high, **kwargs)

    def init_params(self, key: jax.Array, env: Any, env_params: Any = None):
        """Flax variables for this policy on `env`'s observations."""
        env_params = env.default_params if env_params is None else env_params
        shape = jax.eval_shape(lambda p: env.reset(jax.random.key(0), p)[0], env_params)
        obs = jnp.zeros(shape.shape, shape.dtype)
        # One compiled program: flax's eager init would compile every op separately.
        if isinstance(self, LSTMPolicy):
            return jax.jit(lambda k, o: self.init(k, o, self.initialize_carry(), k))(key, obs)
        return jax.jit(lambda k, o: self.init(k, o, k))(key, obs)

    def _encode(self, obs: jax.Array) -> jax.Array:
        """The observation as a flat float vector (a state index one-hot)."""
        if self.obs_categories:
            return jax.nn.one_hot(jnp.ravel(obs), self.obs_categories, dtype=jnp.float32).ravel()
        return _as_float(jnp.ravel(obs))

    def _act(self, x: jax.Array, key: jax.Array | None) -> jax.Array:
        """The action head on the network output (called inside the compact `__call__`)."""
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {list(HEADS)}, got {self.head!r}")
        if self.head == "greedy":
            return action_head(x, self.discrete, self.low, self.high)
        if key is None:
            raise ValueError("a sampled head needs the step's key: apply(params, obs, key)")
        std = None
        if not self.discrete:
            if self.action_std is None:
                std = jnp.exp(self.param("log_std", nn.initializers.constant(jnp.log(0.5)), (self.num_outputs,)))
            else:
                std = jnp.full((self.num_outputs,), self.action_std, jnp.float32)
        return action_head(x, self.discrete, self.low, self.high, key, std)


class MLPPolicy(nn.Module, _ForEnv):
    """Feed-forward policy: flattened obs -> hidden tanh layers -> action head."""

    num_outputs: int
    discrete: bool = True
    low: tuple = ()
    high: tuple = ()
    hidden_sizes: Sequence[int] = (32, 32)
    activation: str = "tanh"
    head: str = "greedy"  # or "sampled"
    action_std: float | None = None  # a sampled Box head's scale (half-widths); None: learned
    obs_categories: int = 0  # > 0: the observation is a state index, one-hot encoded

    def __post_init__(self):
        _check_policy(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        x = self._encode(obs)
        act = getattr(nn, self.activation)
        for size in self.hidden_sizes:
            x = act(nn.Dense(size)(x))
        return self._act(nn.Dense(self.num_outputs)(x), key)


class CNNPolicy(nn.Module, _ForEnv):
    """Convolutional policy for `(H, W, C)` image observations: convolutions of
    `kernel_size` (3x3 unless set; valid padding, stride 1) with ReLU -> flatten -> hidden
    layers -> action head. A kernel as wide as the image (`(3, W)`) reads whole rows: one
    filter, slid down the image, sees each band of rows the same way. `pool="max"` keeps each
    channel's maximum over the image instead of every position: the hidden layers then see
    whether a pattern occurs, wherever it does."""

    num_outputs: int
    discrete: bool = True
    low: tuple = ()
    high: tuple = ()
    conv_channels: Sequence[int] = (16,)
    kernel_size: Sequence[int] = (3, 3)
    pool: str = "none"
    hidden_sizes: Sequence[int] = (32,)
    activation: str = "relu"
    head: str = "greedy"
    action_std: float | None = None
    obs_categories: int = 0

    def __post_init__(self):
        _check_policy(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        if obs.ndim != 3 or self.obs_categories:
            raise ValueError(f"CNNPolicy needs (H, W, C) image observations, got shape {obs.shape}")
        x = _as_float(obs)
        act = getattr(nn, self.activation)
        for channels in self.conv_channels:
            if any(k > n for k, n in zip(self.kernel_size, x.shape)):
                raise ValueError(f"CNNPolicy: kernel_size {tuple(self.kernel_size)} does not fit the "
                                 f"{x.shape[:2]} image its layer convolves")
            conv = nn.Conv(channels, tuple(self.kernel_size), padding="VALID", conv_general_dilated=conv_by_patches)
            x = nn.relu(conv(x))
        x = jnp.max(x, axis=(0, 1)) if self.pool == "max" else jnp.ravel(x)
        for size in self.hidden_sizes:
            x = act(nn.Dense(size)(x))
        return self._act(nn.Dense(self.num_outputs)(x), key)


class LSTMPolicy(nn.Module, _ForEnv):
    """Recurrent policy: obs -> dense -> LSTM cell -> action head, carry threaded per step."""

    num_outputs: int
    discrete: bool = True
    low: tuple = ()
    high: tuple = ()
    hidden_size: int = 32
    head: str = "greedy"
    action_std: float | None = None
    obs_categories: int = 0

    def __post_init__(self):
        _check_policy(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, obs: jax.Array, carry: Any, key: jax.Array | None = None):
        x = nn.tanh(nn.Dense(self.hidden_size)(self._encode(obs)))
        carry, h = nn.OptimizedLSTMCell(self.hidden_size)(carry, x)
        return self._act(nn.Dense(self.num_outputs)(h), key), carry

    def initialize_carry(self) -> tuple[jax.Array, jax.Array]:
        """An episode's first carry (`RolloutWrapper(init_carry=...)`): zero cell and hidden state."""
        zeros = jnp.zeros((self.hidden_size,), jnp.float32)
        return (zeros, zeros)


class ParamReshaper:
    """Flat vector <-> parameter pytree conversion for evolution strategies."""

    def __init__(self, params: Any):
        flat, self._unravel = ravel_pytree(params)
        self.template = params
        self.num_dims = int(flat.size)

    def flatten(self, params: Any) -> jax.Array:
        """Pytree -> `(num_dims,)`."""
        return ravel_pytree(params)[0]

    def unflatten(self, flat: jax.Array) -> Any:
        """`(num_dims,)` -> pytree."""
        if flat.shape != (self.num_dims,):
            raise ValueError(f"expected a flat vector of shape ({self.num_dims},), got {flat.shape}")
        return self._unravel(flat)

    def flatten_population(self, pop_params: Any) -> jax.Array:
        """Stacked pytree -> `(P, num_dims)`."""
        return jax.vmap(self.flatten)(pop_params)

    def unflatten_population(self, flat: jax.Array) -> Any:
        """`(P, num_dims)` -> stacked pytree (leading axis P on every leaf)."""
        if flat.ndim != 2 or flat.shape[1] != self.num_dims:
            raise ValueError(f"expected shape (P, {self.num_dims}), got {flat.shape}")
        return jax.vmap(self._unravel)(flat)
