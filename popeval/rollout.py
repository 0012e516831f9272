"""`RolloutWrapper`: single, batch and population rollouts, and a lean fitness-only path.

    manager = RolloutWrapper(policy.apply, env_name="CartPole-v1")
    obs, action, reward, next_obs, done, cum_return = manager.single_rollout(key, params)
    ... = manager.batch_rollout(keys, params)            # keys (B,): B episodes, one policy
    ... = manager.population_rollout(keys, pop_params)   # P policies x B episodes
    result = manager.population_fitness(keys, pop_params)  # returns (P, B), no trajectories

Axes. `P` is the population (leading axis of every leaf of `pop_params`), `M` the optional
env-param batch (leading axis of every leaf of `env_params`, see below), `B` the episodes per
member, `T = num_env_steps`. Trajectory outputs are `(P, [M,] B, T, ...)`, `cum_return` and
the fitness path's `returns` / `lengths` are `(P, [M,] B)`.

Episodes. Each episode key is split into a reset key and an episode key; step `t` uses
`fold_in(episode_key, t)` split into a policy key and an environment key. Both paths run the
very same step function, so `population_fitness` returns exactly the trajectory path's
`cum_return`. Rollouts use the raw `step_env` (no auto-reset): once an episode is done its
rewards are masked to 0, `done` stays true, and in trajectories the state is frozen (obs and
next_obs repeat the last observation). The fitness path does not freeze (nothing is stored)
and stops as soon as every episode of the evaluated batch is done (`lax.while_loop`).
Per-step keys cost nothing when neither environment nor policy uses them: unused key
derivations are dead code that XLA removes.

Keys. `keys` of shape `(B,)` are common random numbers by default: every member sees the same
`B` episodes. With `common_random_numbers=False` member `p` uses `fold_in(keys[b], p)`.
Keys of shape `(P, B)` are used as given (the evolve loop derives them from
(seed, generation, member index), so device layouts never change fitness).

Env-param batches. `env_params` whose every leaf has one more leading axis than the env's
default params is a batch of `M` parameter sets (domain randomisation, meta-learning): each
member is evaluated on each set, with the same `B` episode keys for every set.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from popeval import normalization
from popeval.environments import make, spaces

__all__ = ["RolloutWrapper", "FitnessResult"]


class FitnessResult(NamedTuple):
    """What the fitness-only path returns."""

    returns: jax.Array  # (P, [M,] B) float32; NaN/inf where a policy diverged
    lengths: jax.Array  # (P, [M,] B) int32, steps taken before done
    obs_stats: Any  # ObsStats with leading axis P (this batch, per member), or None


class _Carry(NamedTuple):
    obs: Any
    state: Any
    policy_carry: Any
    ret: jax.Array
    length: jax.Array
    alive: jax.Array
    stats: Any


def _key_batch_shape(keys: Any, what: str) -> tuple[int, ...]:
    keys = jnp.asarray(keys) if not isinstance(keys, jax.Array) else keys
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        return tuple(keys.shape)
    if keys.dtype == jnp.uint32 and keys.ndim >= 1 and keys.shape[-1] == 2:
        return tuple(keys.shape[:-1])
    raise ValueError(
        f"{what}: expected PRNG keys (jax.random.key or PRNGKey arrays), got an array of "
        f"shape {keys.shape} and dtype {keys.dtype}"
    )


def _leading_axis(tree: Any, what: str) -> int:
    sizes = {x.shape[0] if getattr(x, "ndim", 0) else None for x in jax.tree.leaves(tree)}
    if not sizes or None in sizes or len(sizes) != 1:
        shapes = [getattr(x, "shape", ()) for x in jax.tree.leaves(tree)]
        raise ValueError(
            f"{what}: every leaf needs the same leading (population) axis P; got leaf shapes "
            f"{shapes[:6]}{' ...' if len(shapes) > 6 else ''}"
        )
    return sizes.pop()


def _vmap_levels(fn: Callable, levels: list[tuple]) -> Callable:
    """Nests `jax.vmap`s, outermost level first."""
    for in_axes in reversed(levels):
        fn = jax.vmap(fn, in_axes=in_axes)
    return fn


class RolloutWrapper:
    """Evaluates policies on an environment; immutable, its jitted functions built once.

    Args:
        model_forward: `model_forward(params, obs, key) -> action` (flax `Module.apply`
            compatible), or `model_forward(params, obs, carry, key) -> (action, carry)` for a
            recurrent policy (pass `init_carry`). `None` samples random actions.
        env_name: a registered id (ignored when `env` is given).
        num_env_steps: steps per episode `T`; defaults to `max_steps_in_episode`.
        env_kwargs: keyword arguments for `make(env_name, ...)`.
        env_params: full env params, or a dict of field overrides of the default params.
            A leading axis on every leaf makes it an env-param batch (see module docs).
        env: any environment object with the popeval/gymnax API (`reset_env`/`step_env` or
            `reset`/`step`, 5- or 6-tuple steps, e.g. gymnax 1.x environments).
        init_carry: initial recurrent state of one episode (a pytree); makes the policy
            recurrent.
        common_random_numbers: whether all members share the `B` episode keys.
        obs_normalization: feed the policy `(obs - mean) / std` from the `obs_stats`
            argument, and collect this batch's statistics in the fitness path.
        compaction: run episodes flat, each with its own copy of its member's parameters,
            and let the fitness path gather the still-running episodes into batches of
            N/4, N/16, ... as episodes end (`_compacted_fitness`). With `False`, a member's
            episodes share its parameters (batched matmuls, less memory) and the fitness
            path stops only when the whole batch is done. Each setting is bit-exact between
            its trajectory and fitness paths; the two settings are not bit-identical to each
            other on CPUs with FMA (XLA contracts multiply-adds differently per layout, and
            chaotic episodes such as a balanced CartPole amplify the last bit).
    """

    def __init__(
        self,
        model_forward: Callable | None = None,
        env_name: str = "Pendulum-v1",
        num_env_steps: int | None = None,
        env_kwargs: dict | None = None,
        env_params: Any = None,
        env: Any = None,
        *,
        init_carry: Any = None,
        common_random_numbers: bool = True,
        obs_normalization: bool = False,
        compaction: bool = True,
    ):
        if env is None:
            env, default_params = make(env_name, **(env_kwargs or {}))
        else:
            if env_kwargs:
                raise ValueError("env_kwargs cannot be used together with env=")
            default_params = env.default_params
            env_name = getattr(env, "name", type(env).__name__)
        if isinstance(env_params, dict):
            env_params = default_params.replace(**env_params)
        self.env = env
        self.env_name = env_name
        self.default_env_params = default_params
        self.env_params = default_params if env_params is None else env_params
        self.model_forward = model_forward
        self.init_carry = init_carry
        self.recurrent = init_carry is not None
        self.common_random_numbers = bool(common_random_numbers)
        self.obs_normalization = bool(obs_normalization)
        self.compaction = bool(compaction)

        if num_env_steps is None:
            limit = int(jnp.max(jnp.asarray(self.env_params.max_steps_in_episode)))
            if limit > 100_000:
                raise ValueError(
                    f"{env_name} has no practical episode limit (max_steps_in_episode="
                    f"{limit}); pass num_env_steps"
                )
            num_env_steps = limit
        if int(num_env_steps) <= 0:
            raise ValueError(f"num_env_steps must be a positive integer, got {num_env_steps}")
        self.num_env_steps = int(num_env_steps)

        obs, _ = jax.eval_shape(self._reset, jax.random.key(0), self.default_env_params)
        self.obs_shape = tuple(obs.shape)

        self._single_rollout = jax.jit(self._single_fn)
        self._batch_rollout = jax.jit(jax.vmap(self._single_fn, in_axes=(0, None, None, None)))
        self._population_rollout = jax.jit(self._population_rollout_fn)
        self._population_fitness = jax.jit(self._population_fitness_fn)

    # ------------------------------------------------------------ environment adapter
    def _reset(self, key, env_params):
        reset = getattr(self.env, "reset_env", None) or self.env.reset
        return reset(key, env_params)

    def _env_step(self, key, state, action, env_params):
        step = getattr(self.env, "step_env", None) or self.env.step
        out = step(key, state, action, env_params)
        if len(out) == 6:  # gymnax >= 1.0: (obs, state, reward, terminated, truncated, info)
            obs, state, reward, terminated, truncated, _ = out
            done = jnp.logical_or(terminated, truncated)
        else:
            obs, state, reward, done, _ = out
        # popeval's step_env already applies the time limit; this makes external
        # environments whose raw step does not (some gymnax versions) honour it as well.
        time = getattr(state, "time", None)
        if time is not None and hasattr(env_params, "max_steps_in_episode"):
            done = jnp.logical_or(done, time >= env_params.max_steps_in_episode)
        return obs, state, jnp.asarray(reward, jnp.float32), jnp.asarray(done, jnp.bool_)

    # ------------------------------------------------------------ policy adapter
    def _act(self, policy_params, obs, policy_carry, key, env_params):
        space = self.env.action_space(env_params)
        if self.model_forward is None:
            return space.sample(key), policy_carry
        if self.recurrent:
            action, policy_carry = self.model_forward(policy_params, obs, policy_carry, key)
        else:
            action = self.model_forward(policy_params, obs, key)
        self._check_action(action, space)
        return action, policy_carry

    def _check_action(self, action, space):
        shape, dtype = jnp.shape(action), jnp.result_type(action)
        if isinstance(space, spaces.Discrete) or type(space).__name__ == "Discrete":
            ok = shape in ((), (1,)) and (jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_)
        else:
            size = 1
            for s in space.shape:
                size *= s
            ok = shape == tuple(space.shape) or (len(shape) <= 1 and jnp.size(action) == size)
            ok = ok and not (dtype == jnp.bool_)
        if not ok:
            raise ValueError(
                f"model_forward returned an action of shape {shape} and dtype {dtype}, but "
                f"{self.env_name} expects {space} (shape {tuple(space.shape)}"
                f"{', an integer dtype' if type(space).__name__ == 'Discrete' else ''})"
            )

    # ------------------------------------------------------------ one episode
    def _init_episode(self, key, policy_params, env_params, obs_stats):
        key_reset, key_episode = jax.random.split(key)
        obs, state = self._reset(key_reset, env_params)
        stats = normalization.init(self.obs_shape) if self.obs_normalization else None
        carry = _Carry(
            obs=obs,
            state=state,
            policy_carry=self.init_carry if self.recurrent else (),
            ret=jnp.zeros((), jnp.float32),
            length=jnp.zeros((), jnp.int32),
            alive=jnp.ones((), jnp.bool_),
            stats=stats,
        )
        return carry, key_episode

    def _step_episode(self, t, key_episode, c, policy_params, env_params, obs_stats, freeze):
        key_policy, key_env = jax.random.split(jax.random.fold_in(key_episode, t))
        x = normalization.normalize(obs_stats, c.obs) if self.obs_normalization else c.obs
        action, policy_carry = self._act(policy_params, x, c.policy_carry, key_policy, env_params)
        obs, state, reward, done = self._env_step(key_env, c.state, action, env_params)
        alive = c.alive
        reward = jnp.where(alive, reward, 0.0)
        if freeze:
            keep = lambda new, old: jnp.where(alive, new, old)  # noqa: E731
            obs = jax.tree.map(keep, obs, c.obs)
            state = jax.tree.map(keep, state, c.state)
            policy_carry = jax.tree.map(keep, policy_carry, c.policy_carry)
        stats = normalization.update(c.stats, c.obs, alive) if self.obs_normalization else None
        new = _Carry(
            obs=obs,
            state=state,
            policy_carry=policy_carry,
            ret=c.ret + reward,
            length=c.length + alive.astype(jnp.int32),
            alive=alive & ~done,
            stats=stats,
        )
        transition = (c.obs, action, reward, obs, done | ~alive)
        return new, transition

    def _single_fn(self, key, policy_params, env_params, obs_stats):
        carry, key_episode = self._init_episode(key, policy_params, env_params, obs_stats)

        def body(c, t):
            return self._step_episode(t, key_episode, c, policy_params, env_params, obs_stats, True)

        carry, (obs, action, reward, next_obs, done) = jax.lax.scan(
            body, carry, jnp.arange(self.num_env_steps)
        )
        return obs, action, reward, next_obs, done, carry.ret

    # ------------------------------------------------------------ populations
    def _is_param_batch(self, env_params) -> bool:
        ref = jax.tree.leaves(self.default_env_params)
        got = jax.tree.leaves(env_params)
        if len(ref) != len(got):
            raise TypeError(f"env_params does not match {self.env_name}'s params structure")
        extra = {jnp.ndim(g) - jnp.ndim(r) for r, g in zip(ref, got)}
        if extra == {0}:
            return False
        if extra == {1} and len({jnp.shape(g)[0] for g in got}) == 1:
            return True
        raise ValueError(
            "env_params: either no leaf or every leaf must carry one extra leading axis "
            "(a batch of M parameter sets)"
        )

    def _levels(self, meta: bool, per_level: list[tuple]) -> list[tuple]:
        """`per_level` = [P axes, M axes, B axes]; drops the M level without a batch."""
        return per_level if meta else [per_level[0], per_level[2]]

    def _flat_episodes(self, keys, pop_params, env_params, meta):
        """Flattens `(P, [M,] B)` episodes to `N`, each with its own params copy."""
        batch_shape = _key_batch_shape(keys, "keys")
        if meta:
            m = jax.tree.leaves(env_params)[0].shape[0]
            batch_shape = (batch_shape[0], m, batch_shape[-1])
            keys = jnp.broadcast_to(keys[:, None], (keys.shape[0], m) + keys.shape[1:])
        n = 1
        for d in batch_shape:
            n *= d
        grid = jnp.indices(batch_shape).reshape(len(batch_shape), n)
        member, env_index = grid[0], (grid[1] if meta else None)
        keys = keys.reshape((n,) + keys.shape[len(batch_shape):])
        return batch_shape, keys, member, env_index

    def _population_rollout_fn(self, keys, pop_params, env_params, obs_stats):
        meta = self._is_param_batch(env_params)
        if not self.compaction:
            levels = self._levels(meta, [(0, 0, None, None), (0, None, 0, None), (0, None, None, None)])
            return _vmap_levels(self._single_fn, levels)(keys, pop_params, env_params, obs_stats)
        # Same flat layout as the compacted fitness path, so both agree to the last bit.
        batch_shape, keys, member, env_index = self._flat_episodes(keys, pop_params, env_params, meta)
        params = jax.tree.map(lambda x: x[member], pop_params)
        env_p = jax.tree.map(lambda x: x[env_index], env_params) if meta else env_params
        fn = jax.vmap(self._single_fn, in_axes=(0, 0, 0 if meta else None, None))
        out = fn(keys, params, env_p, obs_stats)
        return jax.tree.map(lambda x: x.reshape(batch_shape + x.shape[1:]), out)

    def _population_fitness_fn(self, keys, pop_params, env_params, obs_stats):
        meta = self._is_param_batch(env_params)

        def step(t, k, c, p, e, s):
            return self._step_episode(t, k, c, p, e, s, False)[0]

        def run(t, c, step_fn, key_ep, params, env_p, size_next):
            def cond(loop):
                t, c = loop
                return (t < self.num_env_steps) & (jnp.sum(c.alive) > size_next)

            def body(loop):
                t, c = loop
                return t + 1, step_fn(t, key_ep, c, params, env_p, obs_stats)

            return jax.lax.while_loop(cond, body, (t, c))

        if self.compaction:
            carry, batch_shape = self._compacted_fitness(keys, pop_params, env_params, meta, step, run)
        else:
            init = _vmap_levels(
                self._init_episode,
                self._levels(meta, [(0, 0, None, None), (0, None, 0, None), (0, None, None, None)]),
            )
            carry, key_episode = init(keys, pop_params, env_params, obs_stats)
            batch_shape = carry.ret.shape
            step_nested = _vmap_levels(
                step,
                self._levels(
                    meta,
                    [
                        (None, 0, 0, 0, None, None),
                        (None, 0, 0, None, 0, None),
                        (None, 0, 0, None, None, None),
                    ],
                ),
            )
            _, carry = run(jnp.int32(0), carry, step_nested, key_episode, pop_params, env_params, 0)
        stats = None
        if self.obs_normalization:
            flat = jax.tree.map(
                lambda x: x.reshape((x.shape[0], -1) + x.shape[len(batch_shape):]), carry.stats
            )
            stats = jax.vmap(normalization.merge_stacked)(flat)
        return FitnessResult(returns=carry.ret, lengths=carry.length, obs_stats=stats)

    def _stage_sizes(self, num_episodes: int) -> list[int]:
        """Batch sizes of the compaction stages: N, N/4, N/16, ... (not below 64)."""
        sizes = [num_episodes]
        while sizes[-1] // 4 >= 64:
            sizes.append(sizes[-1] // 4)
        return sizes

    def _compacted_fitness(self, keys, pop_params, env_params, meta, step, run):
        """Runs the live episodes in ever smaller batches; returns the `(P, [M,] B)` carry.

        Episodes are flat, each with its own copy of its member's parameters. Once at most
        N/4 are alive, the live ones (padded with finished ones) are gathered into a batch
        of N/4, and so on down to the last stage; results are scattered back. Every stage
        runs the same vmapped step, so results do not depend on the batch an episode is in.
        """
        batch_shape, keys, member, env_index = self._flat_episodes(keys, pop_params, env_params, meta)
        n = keys.shape[0]
        env_axis = 0 if meta else None
        init = jax.vmap(self._init_episode, in_axes=(0, 0, env_axis, None))
        step_flat = jax.vmap(step, in_axes=(None, 0, 0, 0, env_axis, None))
        origin = jnp.arange(n)
        sizes = self._stage_sizes(n)
        t, result, key_flat = jnp.int32(0), None, None
        for j, size in enumerate(sizes):
            if j == 0:
                params = jax.tree.map(lambda x: x[member], pop_params)
                env_p = jax.tree.map(lambda x: x[env_index], env_params) if meta else env_params
                current, key_flat = init(keys, params, env_p, None)
                result = current
            else:
                # Live episodes first (stable), then finished ones as padding.
                order = jnp.argsort(~current.alive, stable=True)[:size]
                origin = origin[order]
                current = jax.tree.map(lambda x: x[order], current)
                params = jax.tree.map(lambda x: x[member[origin]], pop_params)
                env_p = jax.tree.map(lambda x: x[env_index[origin]], env_params) if meta else env_params
            size_next = sizes[j + 1] if j + 1 < len(sizes) else 0
            t, current = run(t, current, step_flat, key_flat[origin], params, env_p, size_next)
            result = jax.tree.map(lambda r, c: r.at[origin].set(c), result, current)
        return jax.tree.map(lambda x: x.reshape(batch_shape + x.shape[1:]), result), batch_shape

    # ------------------------------------------------------------ public API
    def _prepare(self, keys, pop_params, env_params, obs_stats, population: bool):
        env_params = self.env_params if env_params is None else env_params
        if self.obs_normalization and obs_stats is None:
            obs_stats = normalization.init(self.obs_shape)
        if not population:
            return keys, env_params, obs_stats
        num_members = _leading_axis(pop_params, "pop_params")
        batch = _key_batch_shape(keys, "keys")
        if len(batch) == 2:
            if batch[0] != num_members:
                raise ValueError(
                    f"keys of shape {batch} (P, B) do not match the population size "
                    f"P={num_members} of pop_params"
                )
            return keys, env_params, obs_stats
        if len(batch) != 1:
            raise ValueError(f"keys: expected a batch of shape (B,) or (P, B), got {batch}")
        if self.common_random_numbers:
            keys = jnp.broadcast_to(keys, (num_members,) + keys.shape)
        else:
            members = jnp.arange(num_members)
            keys = jax.vmap(lambda p: jax.vmap(lambda k: jax.random.fold_in(k, p))(keys))(members)
        return keys, env_params, obs_stats

    def single_rollout(self, key, policy_params, env_params=None, obs_stats=None):
        """One episode: `(obs, action, reward, next_obs, done, cum_return)`, each `(T, ...)`."""
        if _key_batch_shape(key, "key") != ():
            raise ValueError("single_rollout takes one key; use batch_rollout for a batch")
        key, env_params, obs_stats = self._prepare(key, None, env_params, obs_stats, False)
        return self._single_rollout(key, policy_params, env_params, obs_stats)

    def batch_rollout(self, keys, policy_params, env_params=None, obs_stats=None):
        """`B` episodes of one policy: outputs `(B, T, ...)`, `cum_return` `(B,)`."""
        if len(_key_batch_shape(keys, "keys")) != 1:
            raise ValueError("batch_rollout takes keys of shape (B,)")
        keys, env_params, obs_stats = self._prepare(keys, None, env_params, obs_stats, False)
        return self._batch_rollout(keys, policy_params, env_params, obs_stats)

    def population_rollout(self, keys, pop_params, env_params=None, obs_stats=None):
        """`P x B` episodes: outputs `(P, [M,] B, T, ...)`, `cum_return` `(P, [M,] B)`."""
        keys, env_params, obs_stats = self._prepare(keys, pop_params, env_params, obs_stats, True)
        return self._population_rollout(keys, pop_params, env_params, obs_stats)

    def population_fitness(self, keys, pop_params, env_params=None, obs_stats=None) -> FitnessResult:
        """Returns and lengths `(P, [M,] B)` without materialising trajectories.

        Memory does not grow with `T`; stepping stops once every episode is done.
        """
        keys, env_params, obs_stats = self._prepare(keys, pop_params, env_params, obs_stats, True)
        return self._population_fitness(keys, pop_params, env_params, obs_stats)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Observation shape (gymnax compatibility)."""
        return self.obs_shape
