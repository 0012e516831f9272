"""The evaluation kernel: pure functions that play a population's episodes, for jitted code.

    kernel = Kernel(episode, num_env_steps, param_ndims, layout, compaction)
    result = kernel.fitness(keys, pop_params, env_params, obs_stats)        # keys (P, B)
    obs, action, reward, next_obs, done, cum_return = kernel.trajectories(keys, pop_params, env_params, obs_stats)
    ... = kernel.trajectory(key, params, env_params, obs_stats)           # one episode

The kernel checks no arguments, starts no threads, places nothing on devices and never asks
whether it is being traced: the caller passes complete arguments (a key per member and
episode, the env params, the observation statistics or None) and compiles the call, inside its
own program or on its own. `RolloutWrapper` is the host shell around it (argument checks, the
member axis over devices and threads, popeval's compiler options); the evolve loop's generation
programs call the kernel. Axes, episodes and the fitness path's early exit are as
`popeval.rollout` describes them.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from popeval import layouts, low_rank, normalization
from popeval.episode import Episode

__all__ = ["Kernel", "FitnessResult", "param_batch_axes"]


class FitnessResult(NamedTuple):
    """What the fitness-only path returns."""

    returns: jax.Array  # (P, [M,] B) float32; NaN/inf where a policy diverged
    lengths: jax.Array  # (P, [M,] B) int32, steps taken before done
    obs_stats: Any  # ObsStats with leading axis P (this batch, per member), or None


def _opaque(env_params: Any) -> Any:
    """`env_params` as values XLA cannot see through. Env params are often compile-time
    constants (Python floats); XLA then rewrites the arithmetic around them (a division by a
    constant into a multiplication by its reciprocal, say) in some programs and not in
    others, and a chaotic episode's last bits would depend on the program it runs in."""
    return jax.lax.optimization_barrier(env_params)


def param_batch_axes(env_params: Any, param_ndims: tuple[int, ...]) -> set[int]:
    """The extra leading axes of `env_params`' leaves over the env's default params (whose
    leaves have `param_ndims` dimensions): `{0}` one parameter set, `{1}` a batch of them."""
    return {jnp.ndim(x) - n for x, n in zip(jax.tree.leaves(env_params), param_ndims)}


def _members(pop_params: Any, shared: Any) -> tuple[Any, layouts.Members]:
    """`(rows, members)` for `popeval.layouts`: explicit parameters; or (a
    `LowRankPopulation`, or with `shared` from `low_rank.split`) a low-rank population's, member
    by member its explicit parameters, through the shared product its factors or indices, from
    which each chunk draws its members."""
    if isinstance(pop_params, low_rank.LowRankPopulation):
        pop_params, shared = low_rank.split(pop_params)
    if shared is None:
        return pop_params, layouts.EXPLICIT
    if not shared.shared_product:
        return low_rank.members(pop_params, shared), layouts.EXPLICIT
    return pop_params, layouts.Members(partial(low_rank.members, shared=shared), low_rank.MEMBER_VARIES)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """The episodes of one environment and policy (`popeval.episode.Episode`), `num_env_steps`
    long, laid out for a device (`popeval.layouts`)."""

    episode: Episode
    num_env_steps: int
    param_ndims: tuple[int, ...]  # the env's default params' leaves' dimensions
    layout: layouts.Layout = layouts.CPU
    compaction: bool = True

    def trajectory(self, key, policy_params, env_params, obs_stats):
        """One episode: `(obs, action, reward, next_obs, done, cum_return)`, each `(T, ...)`."""
        return self.episode.trajectory(key, policy_params, _opaque(env_params), obs_stats, self.num_env_steps)

    def trajectories(self, keys, pop_params, env_params, obs_stats, low_rank_shared=None):
        """`P x [M x] B` episodes, keys `(P, B)`: outputs `(P, [M,] B, T, ...)`, `cum_return` `(P, [M,] B)`."""
        meta = param_batch_axes(env_params, self.param_ndims) == {1}
        rows, reading = _members(pop_params, low_rank_shared)
        return layouts.trajectories(self.trajectory, keys, rows, env_params, obs_stats, meta, self.layout, reading)

    def fitness(self, keys, pop_params, env_params, obs_stats, low_rank_shared=None) -> FitnessResult:
        """Returns and lengths `(P, [M,] B)` of `P x [M x] B` episodes, keys `(P, B)`, without
        trajectories; with `obs_stats` also this batch's observation statistics per member."""
        meta = param_batch_axes(env_params, self.param_ndims) == {1}
        rows, reading = _members(pop_params, low_rank_shared)
        carry = layouts.fitness(self.episode, self.num_env_steps, keys, rows, _opaque(env_params),
                                obs_stats, meta, self.compaction, self.layout, reading)
        stats = None
        if obs_stats is not None:
            members = carry.ret.shape[0]
            flat = jax.tree.map(lambda x: x.reshape((members, -1) + x.shape[carry.ret.ndim:]), carry.stats)
            stats = jax.vmap(normalization.merge_stacked)(flat)
        return FitnessResult(returns=carry.ret, lengths=carry.length, obs_stats=stats)
