"""Low-rank populations (EGGROLL): every member is one shared policy plus a rank-`r` perturbation.

```python
pop = LowRankPopulation.from_key(mean, key, sigma=0.05, rank=1, pop_size=256)
result = manager.population_fitness(keys, pop)        # (P, B), as for explicit params
factors = draw_factors(mean, key, jnp.arange(256), rank=1)   # the same draws, for an update
pop = LowRankPopulation.from_factors(mean, factors, sigma=0.05)   # your own factors
```

EGGROLL (Sarkar et al., "Evolution Strategies at the Hyperscale", arXiv 2511.16652) perturbs
each weight matrix `W` (`m x n`) of member `i` by `(sigma / sqrt(r)) A_i B_i^T`, with Gaussian
`A_i` (`m x r`) and `B_i` (`n x r`), and every other parameter (biases) by full Gaussian noise.
popeval stores parameters as flax does, a Dense kernel as `(n_in, n_out)` (the paper's `W^T`),
so member `i` of a `LowRankPopulation` has:

- for every leaf `W` of two or more dimensions, seen as the matrix `(prod(shape[:-1]),
  shape[-1])` (a Dense kernel `(n_in, n_out)`, a convolution kernel `(kh * kw * c_in, c_out)`):
  `W + sigma / sqrt(r) * B_i A_i^T` with `Factors(a=A (P, n_out, r), b=B (P, n_in, r))`;
- for every other leaf `v` (biases, a learned `log_std`): `v + sigma * E_i`, `E_i` of `v`'s
  shape.

Evaluation. With the shared product (`product="shared"`) each chunk of members
(`popeval.layouts`) draws its members' factors when it starts, so nothing the size of the
whole population's perturbations exists, and the mean parameters are shared by every member
of the chunk (no member axis), so `jax.vmap` turns a layer's `x @ W` for all of a chunk's
episodes into one product, and each member adds its rank-`r` correction `sigma / sqrt(r) *
(x @ B_i) @ A_i^T` (`apply`). `flax.linen.Dense`, `Conv` and `OptimizedLSTMCell` are computed
that way; any other use of a parameter (another layer, your own module) reads the member's
parameter itself, `W + sigma / sqrt(r) * B_i A_i^T` computed for it, which costs a per-member
product but is the same member. (The member's Dense kernels are computed too, then unused:
XLA drops them, so no `(P, n_in, n_out)` array exists.) A chunk holds at least
`popeval.layouts.SHARED_EPISODES` episodes, so that the shared product rounds alike at every
chunk width. Member by member (`product="member"`) the evaluation computes its members'
explicit parameters first and evaluates them as an explicit population. `product="auto"` (the
default) takes the shared product where the corrections are cheap beside the products
(`cheap_corrections`), and goes member by member otherwise (small policies, where the
corrections cost what the shared product saves).

Draws. `draw_factors` draws member `m`'s numbers as one standard normal vector from
`fold_in(fold_in(key, generation), m // 2)`, cut into the leaves in the mean's flattening order
(`A`, then `B`, for a matrix): with `antithetic=True` (the default) members `2k` and `2k + 1`
share those draws and member `2k + 1` negates `A` and `E` (the exact negative perturbation,
`B` unchanged); without, member `m` draws from `fold_in(..., m)`. `m` is the member's global
index, so the draws do not depend on the population's layout over devices, threads or chunks.

Exactness (`tests/engine/test_low_rank.py`): `population_fitness` equals `population_rollout`'s
`cum_return` bit for bit, whatever the device count, threads and population size, as for
explicit populations (measured on XLA:CPU, as theirs is). A member evaluated through the
shared product equals the same member as explicit parameters (`LowRankPopulation.materialize`)
up to float32 rounding: `x W + s (x B) A^T` and `x (W + s B A^T)` round differently, so a
chaotic episode can drift apart after many steps. Member by member, it equals them bit for bit.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from flax.linen.dtypes import promote_dtype

from popeval import keys as keys_lib
from popeval.policies import conv_by_patches

__all__ = ["LowRankPopulation", "Factors", "Member", "draw_factors", "is_matrix", "apply", "MEMBER_VARIES",
           "PRODUCTS", "cheap_corrections"]


class Factors(NamedTuple):
    """The rank-`r` factors of one matrix leaf `W` (`(n_in, n_out)` as a matrix): member `i`'s
    `W` is perturbed by `sigma / sqrt(r) * b[i] @ a[i].T`."""

    a: jax.Array  # (P, n_out, r)
    b: jax.Array  # (P, n_in, r)


def is_matrix(leaf: Any) -> bool:
    """Whether a parameter leaf gets low-rank factors (two or more dimensions) rather than full noise."""
    return jnp.ndim(leaf) >= 2


def _matrix_shape(leaf: Any) -> tuple[int, int]:
    """`(n_in, n_out)`: the leaf as a matrix, its last axis the outputs."""
    shape = jnp.shape(leaf)
    return math.prod(shape[:-1]), shape[-1]


def _draw_shapes(leaf: Any, rank: int) -> tuple[tuple[int, ...], ...]:
    """The shapes one member draws for a leaf: `A (n_out, r)` and `B (n_in, r)` for a matrix,
    the leaf's shape otherwise."""
    if not is_matrix(leaf):
        return (tuple(jnp.shape(leaf)),)
    n_in, n_out = _matrix_shape(leaf)
    return (n_out, rank), (n_in, rank)


def _unpack(flat: jax.Array, leaves: list, rank: int, sign: jax.Array) -> list:
    """One member's draws `flat` cut into each leaf's: `Factors` (`A` signed) or signed noise."""
    out, start = [], 0
    for leaf in leaves:
        parts = []
        for shape in _draw_shapes(leaf, rank):
            size = math.prod(shape)
            parts.append(flat[start:start + size].reshape(shape).astype(jnp.result_type(leaf)))
            start += size
        first = sign.astype(parts[0].dtype) * parts[0]
        out.append(Factors(a=first, b=parts[1]) if is_matrix(leaf) else first)
    return out


def draw_factors(mean: Any, key: jax.Array, members: jax.Array, rank: int, generation: Any = 0,
                 antithetic: bool = True) -> Any:
    """The factors of the members `members` (global indices, `(P,)`), drawn as the evaluation of
    `LowRankPopulation.from_key(mean, key, ...)` draws them (see the module docstring).

    Args:
        mean: one policy's parameters (the population's mean).
        key: a PRNG key (typed or raw).
        members: `(P,)` integer member indices.
        rank: `r`, the rank of every matrix perturbation.
        generation: folded into `key` first (so one key serves a whole run).
        antithetic: members `2k` and `2k + 1` are each other's negatives.

    Returns:
        A pytree like `mean` with `Factors` in place of its matrix leaves and noise `(P, *shape)`
        in place of the others.
    """
    _check_rank(rank)
    return _draw(mean, key, jnp.asarray(members, jnp.int32), generation, rank=int(rank), antithetic=bool(antithetic))


@partial(jax.jit, static_argnames=("rank", "antithetic"))  # one program when called from Python
def _draw(mean: Any, key: jax.Array, members: jax.Array, generation: Any, rank: int, antithetic: bool) -> Any:
    base = jax.random.fold_in(key, generation)
    leaves, treedef = jax.tree.flatten(mean)
    total = sum(math.prod(shape) for leaf in leaves for shape in _draw_shapes(leaf, rank))

    def one(member):
        pair, odd = (member // 2, member % 2) if antithetic else (member, jnp.zeros_like(member))
        sign = jnp.where(odd == 1, -1.0, 1.0)
        # One draw for all the member's numbers, cut into leaves (one random-bits kernel to compile).
        flat = jax.random.normal(jax.random.fold_in(base, pair), (total,), jnp.float32)
        return treedef.unflatten(_unpack(flat, leaves, rank, sign))

    return jax.vmap(one)(members)


def _check_rank(rank: Any) -> None:
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
        raise ValueError(f"LowRankPopulation: rank must be an integer >= 1, got {rank!r}")


def _check_product(product: Any) -> None:
    if product not in PRODUCTS:
        raise ValueError(f"LowRankPopulation: product must be one of {', '.join(PRODUCTS)}, got {product!r}")


#: How a low-rank population is evaluated (`LowRankPopulation.product`).
PRODUCTS = ("auto", "shared", "member")

#: "auto" computes the shared product where the corrections cost at most this fraction of the
#: products they ride on (measured on a 2-vCPU CPU: docs/performance.md).
CORRECTION_SHARE = 1 / 12


def cheap_corrections(mean: Any, rank: int) -> bool:
    """Whether the rank-`rank` corrections of `mean`'s matrices cost little beside the shared
    products: `rank * sum(n_in + n_out) <= CORRECTION_SHARE * sum(n_in * n_out)`."""
    shapes = [_matrix_shape(leaf) for leaf in jax.tree.leaves(mean) if is_matrix(leaf)]
    return rank * sum(m + n for m, n in shapes) <= CORRECTION_SHARE * sum(m * n for m, n in shapes)


def _check_sigma(sigma: Any) -> None:
    if isinstance(sigma, jax.core.Tracer):
        return
    try:
        value = float("nan") if isinstance(sigma, bool) else float(sigma)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise ValueError(f"LowRankPopulation: sigma must be a finite number >= 0, got {sigma!r}")


def _path(path: tuple) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".") or "the params"


def _leaf_factors(path: str, leaf: Any, factor: Any) -> tuple[int, int]:
    """`(P, r)` of one leaf's factors (`r = 0` for noise), checked against the leaf's shape."""
    shape = tuple(jnp.shape(leaf))
    if not is_matrix(leaf):
        got = tuple(jnp.shape(factor)) if hasattr(factor, "shape") else type(factor).__name__
        if not hasattr(factor, "shape") or got[1:] != shape or len(got) != len(shape) + 1:
            raise ValueError(f"LowRankPopulation factors: {path} (shape {shape}) needs noise of shape (P, *{shape}), "
                             f"got {got}")
        return got[0], 0
    n_in, n_out = _matrix_shape(leaf)
    if not isinstance(factor, Factors):
        raise ValueError(f"LowRankPopulation factors: {path} (shape {shape}) is a matrix and needs "
                         f"Factors(a=(P, {n_out}, r), b=(P, {n_in}, r)), got {type(factor).__name__}")
    a, b = jnp.shape(factor.a), jnp.shape(factor.b)
    if len(a) != 3 or len(b) != 3 or a[:2] != (b[0], n_out) or b[1:] != (n_in, a[2]):
        raise ValueError(f"LowRankPopulation factors: {path} (shape {shape}) needs Factors(a=(P, {n_out}, r), "
                         f"b=(P, {n_in}, r)), got a {a} and b {b}")
    return a[0], a[2]


def _check_factors(mean: Any, factors: Any) -> tuple[int, int]:
    """`(P, rank)` of explicit factors, checked leaf by leaf against `mean`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(mean)
    try:
        subtrees = treedef.flatten_up_to(factors)
    except (ValueError, TypeError) as e:
        raise ValueError(f"LowRankPopulation factors: not a pytree like the mean params (Factors in place of its "
                         f"matrix leaves): {str(e).splitlines()[0]}") from None
    found = {_leaf_factors(_path(path), m, f) for (path, m), f in zip(flat, subtrees)}
    sizes, ranks = {p for p, _ in found}, {r for _, r in found} - {0}
    if len(sizes) != 1 or len(ranks) > 1:
        raise ValueError(f"LowRankPopulation factors: every leaf needs the same population size P and every "
                         f"matrix the same rank r; got P in {sorted(sizes)}, r in {sorted(ranks)}")
    return sizes.pop(), ranks.pop() if ranks else 1


@struct.dataclass
class LowRankPopulation:
    """A population given by its mean parameters and each member's low-rank perturbation, for
    `RolloutWrapper.population_fitness` and `population_rollout` (see the module docstring).
    Build it with `from_factors` (explicit factors) or `from_key` (drawn inside the evaluation).
    """

    mean: Any  # one policy's parameters, shared by every member
    sigma: jax.Array  # () the perturbations' scale
    factors: Any = None  # explicit: a pytree like `mean`, `Factors` for its matrix leaves (member axis first)
    key: Any = None  # drawn: the PRNG key of the draws
    members: Any = None  # drawn: (P,) int32 global member indices
    generation: Any = None  # drawn: () int32, folded into `key`
    rank: int = struct.field(pytree_node=False, default=1)
    antithetic: bool = struct.field(pytree_node=False, default=True)
    product: str = struct.field(pytree_node=False, default="auto")  # "auto", "shared" or "member"

    @classmethod
    def from_factors(cls, mean: Any, factors: Any, sigma: float, product: str = "auto") -> LowRankPopulation:
        """A population of your own factors (`draw_factors`' layout: `Factors(a (P, n_out, r),
        b (P, n_in, r))` for matrix leaves, noise `(P, *shape)` for the others)."""
        _check_sigma(sigma)
        _check_product(product)
        _, rank = _check_factors(mean, factors)
        return cls(mean=mean, sigma=jnp.asarray(sigma, jnp.float32), factors=factors, rank=int(rank),
                   product=product)

    @classmethod
    def from_key(cls, mean: Any, key: jax.Array, sigma: float, rank: int = 1, pop_size: int | None = None,
                 members: Any = None, generation: Any = 0, antithetic: bool = True,
                 product: str = "auto") -> LowRankPopulation:
        """A population whose factors are drawn inside the evaluation (`draw_factors`), of the
        members `0 .. pop_size - 1` or of the global indices `members` (a slice of a larger
        population)."""
        _check_sigma(sigma)
        _check_rank(rank)
        _check_product(product)
        if (pop_size is None) == (members is None):
            raise ValueError("LowRankPopulation.from_key: pass either pop_size or members (global indices)")
        if members is None:
            if isinstance(pop_size, bool) or not isinstance(pop_size, numbers.Integral) or pop_size < 1:
                raise ValueError(f"LowRankPopulation.from_key: pop_size must be an integer >= 1, got {pop_size!r}")
            members = jnp.arange(pop_size, dtype=jnp.int32)
        members = jnp.asarray(members, jnp.int32)
        if members.ndim != 1 or members.shape[0] == 0:
            raise ValueError(f"LowRankPopulation.from_key: members must be a non-empty (P,) array, got shape "
                             f"{members.shape}")
        if keys_lib.key_batch_shape(key, "LowRankPopulation.from_key: key") != ():
            raise ValueError(f"LowRankPopulation.from_key: key must be one PRNG key, got a batch of shape "
                             f"{keys_lib.key_batch_shape(key)}")
        return cls(mean=mean, sigma=jnp.asarray(sigma, jnp.float32), key=key, members=members,
                   generation=jnp.asarray(generation, jnp.int32), rank=int(rank), antithetic=bool(antithetic),
                   product=product)

    @property
    def pop_size(self) -> int:
        """`P`, the number of members."""
        if self.members is not None:
            return int(jnp.shape(self.members)[0])
        return int(jnp.shape(jax.tree.leaves(self.factors)[0])[0])

    @property
    def shared_product(self) -> bool:
        """Whether the evaluation computes the shared product plus the corrections (`product`
        "shared", or "auto" where they pay: `cheap_corrections`) rather than each member's own
        parameters and products ("member")."""
        return self.product == "shared" or (self.product == "auto" and cheap_corrections(self.mean, self.rank))

    def all_factors(self) -> Any:
        """Every member's factors: the explicit ones, or drawn (`draw_factors`)."""
        if self.factors is not None:
            return self.factors
        return draw_factors(self.mean, self.key, self.members, self.rank, self.generation, self.antithetic)

    def materialize(self) -> Any:
        """The explicit `(P, ...)` parameters of every member (`P x` the mean's memory: for
        checks and for picking members, not for evaluating large populations)."""
        return _materialized(self)


@jax.jit  # one program rather than an operation at a time
def _materialized(pop: LowRankPopulation) -> Any:
    scale = pop.sigma / jnp.sqrt(jnp.float32(pop.rank))
    return jax.vmap(partial(_member_params, pop.mean, sigma=pop.sigma, scale=scale))(pop.all_factors())


def _perturbed(mean: Any, factor: Any, sigma: jax.Array, scale: jax.Array) -> Any:
    """One member's value of one leaf: `mean + scale * B A^T` or `mean + sigma * E`."""
    if isinstance(factor, Factors):
        return mean + scale * (factor.b @ factor.a.T).reshape(jnp.shape(mean))
    return mean + sigma * factor


def _member_params(mean: Any, factors: Any, sigma: jax.Array, scale: jax.Array) -> Any:
    """One member's explicit parameters."""
    return jax.tree.map(partial(_perturbed, sigma=sigma, scale=scale), mean, factors)


class Member(NamedTuple):
    """What one member's forward pass reads inside the evaluation: the shared mean and its own factors."""

    mean: Any  # shared by every member
    factors: Any  # this member's (no member axis)
    sigma: jax.Array
    scale: jax.Array  # sigma / sqrt(rank)


#: `popeval.layouts`' `varies` of a `Member`: only its factors have a member axis.
MEMBER_VARIES = Member("", "P", "", "")


def split(pop: LowRankPopulation) -> tuple[Any, LowRankPopulation]:
    """`(per_member, shared)`: the parts with a member axis (factors or member indices), and the rest."""
    return (pop.factors, pop.members), pop.replace(factors=None, members=None)


def members(per_member: Any, shared: LowRankPopulation) -> Any:
    """`split`'s parts (of some members: a chunk's) -> what the evaluation reads for them:
    their `Member`s (factors drawn here if need be) stacked along the factors' member axis
    (`MEMBER_VARIES`), or, evaluated member by member, their explicit parameters."""
    pop = shared.replace(factors=per_member[0], members=per_member[1])
    scale = pop.sigma / jnp.sqrt(jnp.float32(pop.rank))
    if not pop.shared_product:
        return jax.vmap(partial(_member_params, pop.mean, sigma=pop.sigma, scale=scale))(pop.all_factors())
    return Member(pop.mean, pop.all_factors(), pop.sigma, scale)


class _Kernel(NamedTuple):
    """A matrix leaf the interceptor computes as the shared product plus the correction."""

    mean: jax.Array
    factors: Factors  # one member's: a (n_out, r), b (n_in, r)
    scale: jax.Array


def apply(model_forward: Callable, member: Member, *args: Any) -> Any:
    """`model_forward(params, *args)` for one member: flax `Dense`, `Conv` and
    `OptimizedLSTMCell` layers as the shared product plus the member's rank-`r` correction,
    anything else on the member's own parameters (see the module docstring)."""
    kernels: dict[int, tuple[jax.Array, _Kernel]] = {}

    def leaf(mean, factor):
        value = _perturbed(mean, factor, member.sigma, member.scale)
        if isinstance(factor, Factors):  # the layers below find their kernel by this value's identity
            kernels[id(value)] = (value, _Kernel(mean, factor, member.scale))
        return value

    params = jax.tree.map(leaf, member.mean, member.factors)
    with nn.intercept_methods(partial(_intercept, kernels)):
        return model_forward(params, *args)


def _intercept(kernels: dict, next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
    """Computes the layers whose kernels are a member's low-rank leaves; passes the rest on."""
    module = context.module
    if context.method_name == "__call__" and not kwargs:
        layer = _LAYERS.get(type(module))
        if layer is not None:
            out = layer(module, kernels, *args)
            if out is not None:
                return out
    return next_fun(*args, **kwargs)


def _kernel(kernels: dict, module: nn.Module, *path: str) -> _Kernel | None:
    """The `_Kernel` of the module's parameter at `path`, if it is a member's matrix leaf."""
    variables = module.variables.get("params", {})
    for name in path:
        variables = variables.get(name, {}) if hasattr(variables, "get") else {}
    hit = kernels.get(id(variables))
    return None if hit is None else hit[1]


def _bias(module: nn.Module, *path: str) -> Any:
    variables = module.variables["params"]
    for name in path:
        variables = variables[name]
    return variables


def _correction(x: jax.Array, kernel: _Kernel, precision: Any) -> jax.Array:
    """`scale * (x @ B) @ A^T` over the last axis of `x`."""
    low = jnp.matmul(x, kernel.factors.b, precision=precision)
    return kernel.scale * jnp.matmul(low, kernel.factors.a.T, precision=precision)


def _dense(module: nn.Dense, kernels: dict, inputs: jax.Array) -> jax.Array | None:
    """`nn.Dense`: `x @ W + scale * (x @ B) @ A^T + bias`, `W` the shared mean."""
    kernel = _kernel(kernels, module, "kernel")
    if kernel is None or module.dot_general is not None or module.dot_general_cls is not None:
        return None
    bias = _bias(module, "bias") if module.use_bias else None
    x, mean, bias = module.promote_dtype(inputs, kernel.mean, bias, dtype=module.dtype)
    y = jax.lax.dot_general(x, mean, (((x.ndim - 1,), (0,)), ((), ())), precision=module.precision)
    y = y + _correction(x, kernel, module.precision)
    if bias is not None:
        y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
    return y


def _conv(module: nn.Conv, kernels: dict, inputs: jax.Array) -> jax.Array | None:
    """`nn.Conv` with the kernel as the matrix `(kh * kw * c_in, c_out)`: the mean's convolution,
    plus the convolution with `B` (`r` channels) times `scale * A^T`, plus the bias."""
    kernel = _kernel(kernels, module, "kernel")
    if (kernel is None or module.feature_group_count != 1 or module.mask is not None
            or module.conv_general_dilated not in (None, conv_by_patches)
            or module.conv_general_dilated_cls is not None):
        return None
    shape = jnp.shape(kernel.mean)
    rank = kernel.factors.b.shape[-1]
    # The same convolution as the layer's own (padding, strides...), on the given kernels.
    conv = lambda features, k: module.clone(parent=None, features=features, use_bias=False).apply(  # noqa: E731
        {"params": {"kernel": k}}, inputs)
    y = conv(shape[-1], kernel.mean)
    low = conv(rank, kernel.factors.b.reshape(shape[:-1] + (rank,)))
    y = y + kernel.scale * jnp.matmul(low, kernel.factors.a.T, precision=module.precision)
    if module.use_bias:
        y += jnp.reshape(_bias(module, "bias"), (1,) * (y.ndim - 1) + (-1,))
    return y


_GATES = ("i", "f", "g", "o")


def _lstm_gates(module: nn.Module, kernels: dict, x: jax.Array, prefix: str, use_bias: bool) -> dict | None:
    """The cell's four pre-activations from `x` (`prefix` "i": the inputs, "h": the hidden state):
    the concatenated mean kernels as one shared product, plus each gate's correction."""
    found = [_kernel(kernels, module, prefix + gate, "kernel") for gate in _GATES]
    if any(k is None for k in found):
        return None
    bias = jnp.concatenate([_bias(module, prefix + g, "bias") for g in _GATES]) if use_bias else None
    x, mean, bias = promote_dtype(x, jnp.concatenate([k.mean for k in found], axis=-1), bias, dtype=module.dtype)
    y = jnp.dot(x, mean) + jnp.concatenate([_correction(x, k, None) for k in found], axis=-1)
    if bias is not None:
        y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
    return dict(zip(_GATES, jnp.split(y, len(_GATES), axis=-1)))


def _lstm(module: nn.OptimizedLSTMCell, kernels: dict, carry: Any, inputs: jax.Array) -> Any:
    """`nn.OptimizedLSTMCell` (its equations) with low-rank kernels."""
    c, h = carry
    dense_h = _lstm_gates(module, kernels, h, "h", True)
    dense_i = _lstm_gates(module, kernels, inputs, "i", False)
    if dense_h is None or dense_i is None:
        return None
    i = module.gate_fn(dense_h["i"] + dense_i["i"])
    f = module.gate_fn(dense_h["f"] + dense_i["f"])
    g = module.activation_fn(dense_h["g"] + dense_i["g"])
    o = module.gate_fn(dense_h["o"] + dense_i["o"])
    new_c = f * c + i * g
    new_h = o * module.activation_fn(new_c)
    return (new_c, new_h), new_h


#: The layers computed as the shared product plus the correction (exact types: a subclass may
#: compute otherwise).
_LAYERS = {nn.Dense: _dense, nn.Conv: _conv, nn.OptimizedLSTMCell: _lstm}
