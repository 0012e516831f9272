"""Policies whose output head follows the environment's action space, and parameter helpers.

    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(32, 32))
    params = policy.init_params(key, env, env_params)          # flax variables
    action = policy.apply(params, obs, key)                     # RolloutWrapper's model_forward

`Discrete(n)` spaces get `n` logits and a greedy `argmax`; `Box` spaces get a `tanh` head
scaled to the bounds. `LSTMPolicy` is recurrent: `apply(params, obs, carry, key)` returns
`(action, carry)` and `initialize_carry()` gives the episode's first carry.

ES works on flat vectors: `ParamReshaper` converts between a parameter pytree and a flat
`(num_dims,)` vector (and between stacked pytrees and `(P, num_dims)` matrices).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from popeval.environments import spaces

__all__ = ["MLPPolicy", "LSTMPolicy", "ParamReshaper", "action_head"]


def _head_config(space: spaces.Space) -> tuple[int, bool, tuple[float, ...], tuple[float, ...]]:
    """(num_outputs, discrete, low, high) of the output head for an action space."""
    if isinstance(space, spaces.Discrete) or hasattr(space, "n") and not hasattr(space, "low"):
        return int(space.n), True, (), ()
    low = tuple(float(x) for x in jnp.ravel(jnp.asarray(space.low)))
    high = tuple(float(x) for x in jnp.ravel(jnp.asarray(space.high)))
    return len(low), False, low, high


def action_head(x: jax.Array, discrete: bool, low: Sequence[float], high: Sequence[float]):
    """Maps the network output to an action: argmax for discrete, tanh-scaled for boxes."""
    if discrete:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    finite = jnp.isfinite(low) & jnp.isfinite(high)
    # centre + half-width * tanh, not low + (tanh + 1) * ...: XLA folds `(t + 1) - 1` to `t`
    # in some programs and not in others, which broke the bit-exact fitness == trajectory
    # promise for Box([-1, 1]) actions. The clip guards against rounding past a bound.
    scaled = jnp.clip((low + high) * 0.5 + (high - low) * 0.5 * jnp.tanh(x), low, high)
    return jnp.where(finite, scaled, x)


class _ForEnv:
    """Shared constructors from an environment."""

    @classmethod
    def for_env(cls, env: Any, env_params: Any = None, **kwargs: Any):
        n, discrete, low, high = _head_config(env.action_space(env_params or env.default_params))
        return cls(num_outputs=n, discrete=discrete, low=low, high=high, **kwargs)

    def init_params(self, key: jax.Array, env: Any, env_params: Any = None):
        """Flax variables for this policy on `env`'s observations."""
        env_params = env.default_params if env_params is None else env_params
        shape = jax.eval_shape(lambda p: env.reset(jax.random.key(0), p)[0], env_params)
        obs = jnp.zeros(shape.shape, shape.dtype)
        # One compiled program: flax's eager init would compile every op separately (~1 s).
        if isinstance(self, LSTMPolicy):
            return jax.jit(lambda k, o: self.init(k, o, self.initialize_carry(), k))(key, obs)
        return jax.jit(lambda k, o: self.init(k, o, k))(key, obs)


class MLPPolicy(nn.Module, _ForEnv):
    """Feed-forward policy: flattened obs -> hidden tanh layers -> action head."""

    num_outputs: int
    discrete: bool = True
    low: tuple = ()
    high: tuple = ()
    hidden_sizes: Sequence[int] = (32, 32)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        x = jnp.ravel(obs).astype(jnp.float32)
        act = getattr(nn, self.activation)
        for size in self.hidden_sizes:
            x = act(nn.Dense(size)(x))
        x = nn.Dense(self.num_outputs)(x)
        return action_head(x, self.discrete, self.low, self.high)


class LSTMPolicy(nn.Module, _ForEnv):
    """Recurrent policy: obs -> dense -> LSTM cell -> action head, carry threaded per step."""

    num_outputs: int
    discrete: bool = True
    low: tuple = ()
    high: tuple = ()
    hidden_size: int = 32

    @nn.compact
    def __call__(self, obs: jax.Array, carry: Any, key: jax.Array | None = None):
        x = nn.tanh(nn.Dense(self.hidden_size)(jnp.ravel(obs).astype(jnp.float32)))
        carry, h = nn.OptimizedLSTMCell(self.hidden_size)(carry, x)
        x = nn.Dense(self.num_outputs)(h)
        return action_head(x, self.discrete, self.low, self.high), carry

    def initialize_carry(self) -> tuple[jax.Array, jax.Array]:
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
