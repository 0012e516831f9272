"""`RolloutWrapper`: single, batch and population rollouts, and a lean fitness-only path.

    manager = RolloutWrapper(policy.apply, env_name="CartPole-v1")
    obs, action, reward, next_obs, done, cum_return = manager.single_rollout(key, params)
    ... = manager.batch_rollout(keys, params)            # keys (B,): B episodes, one policy
    ... = manager.population_rollout(keys, pop_params)   # P policies x B episodes
    result = manager.population_fitness(keys, pop_params)  # returns (P, B), no trajectories

Axes. `P` is the population (leading axis of every leaf of `pop_params`, or the members of a
`popeval.low_rank.LowRankPopulation`: a shared mean and per-member low-rank factors), `M`
the optional env-param batch (leading axis of every leaf of `env_params`, see below), `B` the
episodes per member, `T = num_env_steps`. Trajectory outputs are `(P, [M,] B, T, ...)`, `cum_return` and
the fitness path's `returns` / `lengths` are `(P, [M,] B)`.

Episodes. Every path plays `popeval.episode.Episode` (keys from `popeval.keys`), so
`population_fitness` returns exactly the trajectory path's `cum_return`. Rollouts use the raw
`step_env` (no auto-reset): once an episode is done its rewards are masked to 0, `done` stays
true, and in trajectories the state is frozen (obs and next_obs repeat the last observation).
The fitness path stores nothing and stops as soon as every episode of the evaluated batch is
done (`lax.while_loop`).

Keys. `keys` of shape `(B,)` are common random numbers by default: every member sees the same
`B` episodes. With `common_random_numbers=False` member `p` uses `fold_in(keys[b], p)`
(`popeval.keys.member_keys`). Keys of shape `(P, B)` are used as given.

Env-param batches. `env_params` whose every leaf has one more leading axis than the env's
default params is a batch of `M` parameter sets (domain randomisation, meta-learning): each
member is evaluated on each set, with the same `B` episode keys for every set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from popeval import compiler, evaluate, layouts, low_rank, normalization, sharding
from popeval import keys as keys_lib
from popeval.environments import make
from popeval.environments.checks import check_default_params, check_params
from popeval.episode import Episode, check_env, reset_env
from popeval.evaluate import FitnessResult

__all__ = ["RolloutWrapper", "FitnessResult"]


def _leading_axis(tree: Any, what: str) -> int:
    sizes = {x.shape[0] if getattr(x, "ndim", 0) else None for x in jax.tree.leaves(tree)}
    if not sizes or None in sizes or len(sizes) != 1:
        shapes = [getattr(x, "shape", ()) for x in jax.tree.leaves(tree)]
        raise ValueError(f"{what}: every leaf needs the same leading (population) axis P; got leaf shapes "
                         f"{shapes[:6]}{' ...' if len(shapes) > 6 else ''}")
    return sizes.pop()


def _param_shapes(tree: Any, strip: int) -> dict:
    """`{path: shape}` of a pytree's leaves, `strip` leading axes dropped."""
    return {jax.tree_util.keystr(p, simple=True, separator="."): tuple(jnp.shape(x))[strip:]
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _describe(shapes: dict) -> str:
    """`{path: shape, ...}` (the first few), or `an array of shape S` for a bare array."""
    if list(shapes) == [""]:
        return f"an array of shape {shapes['']}"
    items = [f"{k}: {v}" for k, v in list(shapes.items())[:6]]
    return "{" + ", ".join(items) + (", ..." if len(shapes) > 6 else "") + "}"


def _mismatch(expected: dict, given: dict) -> str:
    """What differs between two `{path: shape}` maps, in a line."""
    if expected.keys() != given.keys():
        return f"expected {_describe(expected)}, got {_describe(given)}"
    diff = [f"{k} has shape {given[k]}, expected {v}" for k, v in expected.items() if given[k] != v]
    return "; ".join(diff[:6]) + ("; ..." if len(diff) > 6 else "")


def _concrete_params(env_params: Any) -> bool:
    """Whether `env_params` are checkable popeval params (a dataclass of concrete values)."""
    return dataclasses.is_dataclass(env_params) and not any(
        isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(env_params))


def _environment(env_name: str, env_kwargs: dict | None, env: Any) -> tuple[Any, str, Any]:
    """`(env, env_name, default_params)`: the registered `env_name`, or the given `env`."""
    if env is None:
        env, default_params = make(env_name, **(env_kwargs or {}))
        return env, env_name, default_params
    if env_kwargs:
        raise ValueError("env_kwargs cannot be used together with env=")
    name = getattr(env, "name", type(env).__name__)
    return env, name, check_default_params(env.default_params, name)


def _num_env_steps(num_env_steps: int | None, env: Any, env_name: str, env_params: Any) -> int:
    """Steps per episode: `num_env_steps`, else the episode limit, else (no practical limit,
    MinAtar) the environment's `default_rollout_steps`."""
    if num_env_steps is None:
        limit = int(jnp.max(jnp.asarray(env_params.max_steps_in_episode)))
        if limit > 100_000:  # no practical limit (MinAtar): the environment's rollout default
            limit = getattr(env, "default_rollout_steps", None)
            if limit is None:
                raise ValueError(
                    f"{env_name} has no practical episode limit (max_steps_in_episode="
                    f"{int(jnp.max(jnp.asarray(env_params.max_steps_in_episode)))}); "
                    f"pass num_env_steps"
                )
        num_env_steps = limit
    if isinstance(num_env_steps, bool) or not isinstance(num_env_steps, (int, np.integer)) or num_env_steps <= 0:
        raise ValueError(f"num_env_steps must be a positive integer, got {num_env_steps!r}")
    return int(num_env_steps)


class RolloutWrapper:
    """Evaluates policies on an environment; immutable, its jitted functions built once.

    Args:
        model_forward: `model_forward(params, obs, key) -> action` (flax `Module.apply`
            compatible), or `model_forward(params, obs, carry, key) -> (action, carry)` for a
            recurrent policy (pass `init_carry`). `None` samples random actions.
        env_name: a registered id (ignored when `env` is given).
        num_env_steps: steps per episode `T`; defaults to `max_steps_in_episode`, or where
            that is unbounded (MinAtar) to the environment's `default_rollout_steps` (1000).
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
        compaction: let the fitness path gather the members that still have a running
            episode into fewer chunks as others finish (`popeval.layouts`). Same results
            either way, bit for bit.
        devices: the local devices the population methods split the member axis over: `None`
            (default) all, a count, or a list (`popeval.sharding`). On CPUs a call from Python
            runs one device's program on each device: the same bits as one device.
        threads: on CPU devices a population method called from Python runs this many pieces a
            device side by side on threads (`None`: `cores // devices`, fewer for small
            populations; 1: off), with the same bits.
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
        devices: Any = None,
        threads: int | None = None,
    ):
        env, env_name, default_params = _environment(env_name, env_kwargs, env)
        if isinstance(env_params, dict):
            env_params = default_params.replace(**env_params)
        elif env_params is not None and _concrete_params(env_params):
            check_params(env_params)  # params built directly (`EnvParams(gravity=nan)`) skip `replace`'s check
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
        self.devices = sharding.resolve_devices(devices)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))
                                    or threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        self.threads = threads
        self.layout = layouts.for_platform(self.devices[0].platform)
        self.num_env_steps = _num_env_steps(num_env_steps, env, env_name, self.env_params)

        check_env(env, self.default_env_params, env_name)  # a custom environment's mistakes, in one line
        obs, _ = jax.eval_shape(partial(reset_env, env), jax.random.key(0), self.default_env_params)
        self.obs_shape = tuple(obs.shape)
        self._param_spec: dict = {}  # {"spec": the policy's parameter shapes}, once `_policy_spec` knows them
        self.episode = Episode(env, model_forward, self.obs_shape, init_carry,
                               self.obs_normalization, env_name)
        self._build_programs()

    def _build_programs(self) -> None:
        """The kernel, and its jitted programs (not compiled until first called)."""
        self.kernel = evaluate.Kernel(self.episode, self.num_env_steps,
                                      tuple(jnp.ndim(x) for x in jax.tree.leaves(self.default_env_params)),
                                      self.layout, self.compaction)
        # Compiled with popeval's options (`popeval.compiler`), as the evolve loop's programs are.
        self._single_rollout = compiler.jit(self.kernel.trajectory)
        self._batch_rollout = compiler.jit(jax.vmap(self.kernel.trajectory, in_axes=(0, None, None, None)))
        # (one device's program, the devices' program), for `_run_parts`.
        self._population_rollout, self._population_fitness = (
            tuple(compiler.jit(f) for f in (fn, sharding.shard_members(fn, self.devices)))
            for fn in (self.kernel.trajectories, self.kernel.fitness))
        self._episode_states: dict[int, Callable] = {}

    def _is_param_batch(self, env_params) -> bool:
        """Whether `env_params` is a batch of parameter sets (refusing a mix or another structure)."""
        if len(jax.tree.leaves(env_params)) != len(self.kernel.param_ndims):
            raise TypeError(f"env_params does not match {self.env_name}'s params structure")
        extra = evaluate.param_batch_axes(env_params, self.kernel.param_ndims)
        if extra == {0}:
            return False
        if extra == {1} and len({jnp.shape(g)[0] for g in jax.tree.leaves(env_params)}) == 1:
            return True
        raise ValueError("env_params: either no leaf or every leaf must carry one extra leading axis "
                         "(a batch of M parameter sets)")

    # ------------------------------------------------------------ public API
    def _prepare(self, keys, pop_params, env_params, obs_stats, population: bool):
        """Checks a call's arguments (host-side, before any program runs) and completes them."""
        env_params = self._env_params(env_params)
        obs_stats = self._obs_stats(obs_stats)
        if not population:
            return keys, env_params, obs_stats
        num_members = self._num_members(pop_params)
        batch = keys_lib.key_batch_shape(keys, "keys")
        if num_members == 0 or 0 in batch:
            raise ValueError(f"nothing to evaluate: pop_params has P={num_members} members and keys have shape "
                             f"{batch} ((B,) or (P, B)); P and B must be >= 1")
        if len(batch) == 2:
            if batch[0] != num_members:
                raise ValueError(
                    f"keys of shape {batch} (P, B) do not match the population size "
                    f"P={num_members} of pop_params"
                )
            return keys, env_params, obs_stats
        if len(batch) != 1:
            raise ValueError(f"keys: expected a batch of shape (B,) or (P, B), got {batch}")
        keys = keys_lib.member_keys(keys, jnp.arange(num_members), self.common_random_numbers)
        return keys, env_params, obs_stats

    def _env_params(self, env_params):
        """The call's env params: this wrapper's, or the given ones checked when concrete."""
        if env_params is None:
            return self.env_params
        if type(env_params) is type(self.default_env_params) and _concrete_params(env_params):
            check_params(env_params)  # NaN physics would give undefined episodes
        return env_params

    def _obs_stats(self, obs_stats):
        """The call's observation statistics, checked against this wrapper's observations."""
        if not self.obs_normalization:
            if obs_stats is not None:
                raise ValueError("obs_stats given, but this RolloutWrapper does not normalise observations "
                                 "(build it with obs_normalization=True, or pass obs_stats=None)")
            return None
        if obs_stats is None:
            return normalization.init(self.obs_shape)
        return normalization.check(obs_stats, self.obs_shape)

    def _policy_spec(self) -> Any:
        """The parameter shapes of a popeval policy's `apply` on this environment, else None."""
        if "spec" not in self._param_spec:
            policy, spec = getattr(self.model_forward, "__self__", None), None
            if hasattr(policy, "init_params"):
                try:
                    spec = jax.eval_shape(lambda k: policy.init_params(k, self.env, self.default_env_params),
                                          jax.random.key(0))
                except Exception:  # noqa: BLE001 - no template: the policy itself will say what is wrong
                    spec = None
            self._param_spec["spec"] = spec
        return self._param_spec["spec"]

    def _check_policy_params(self, params, what: str, population: bool) -> None:
        """Refuses parameters that are not the policy's (a flat vector, another environment's
        policy), naming the expected and the given shapes."""
        spec = self._policy_spec()
        if spec is not None:
            expected, given = _param_shapes(spec, 0), _param_shapes(params, int(population))
            if expected != given:
                raise ValueError(f"{what} do not fit this policy on {self.env_name}"
                                 f"{' (shapes per member)' if population else ''}: {_mismatch(expected, given)}")
        elif isinstance(getattr(self.model_forward, "__self__", None), nn.Module) and not isinstance(params, Mapping):
            raise ValueError(f"{what}: a flax Module's apply takes its variables ({{'params': ...}}), got "
                             f"{_describe(_param_shapes(params, 0))}; ParamReshaper(params).unflatten_population "
                             f"turns (P, num_dims) vectors into them")

    def _num_members(self, pop_params) -> int:
        """`P`, with the parameters checked against the policy (a low-rank population's mean)."""
        if isinstance(pop_params, low_rank.LowRankPopulation):
            self._check_policy_params(pop_params.mean, "LowRankPopulation.mean", population=False)
            return pop_params.pop_size
        num_members = _leading_axis(pop_params, "pop_params")
        self._check_policy_params(pop_params, "pop_params", population=True)
        return num_members

    def _run_parts(self, programs, keys, pop_params, env_params, obs_stats):
        """`programs` (one device's, all devices') over the members, on CPUs in pieces on threads
        (of a low-rank population its per-member parts, the rest passed whole)."""
        shared = None
        if isinstance(pop_params, low_rank.LowRankPopulation):
            pop_params, shared = low_rank.split(pop_params)
        sets = jax.tree.leaves(env_params)[0].shape[0] if self._is_param_batch(env_params) else 1
        members, episodes = keys_lib.key_batch_shape(keys)  # typed or raw keys
        parts = sharding.member_parts(self.devices, members, members * episodes * sets, self.threads)

        def run(part):  # a CPU piece of several devices: one device's program, the shared arguments there
            if len(self.devices) > 1 and sharding.on_one_device(part):
                return programs[0](*part, *jax.device_put((env_params, obs_stats, shared),
                                                          jax.tree.leaves(part)[0].sharding))
            return programs[int(len(self.devices) > 1)](*part, env_params, obs_stats, shared)  # one device: never [1]

        return sharding.run_parts(run, sharding.split_members((keys, pop_params), self.devices, parts))

    def single_rollout(self, key, policy_params, env_params=None, obs_stats=None):
        """One episode: `(obs, action, reward, next_obs, done, cum_return)`, each `(T, ...)`."""
        if keys_lib.key_batch_shape(key, "key") != ():
            raise ValueError("single_rollout takes one key; use batch_rollout for a batch")
        key, env_params, obs_stats = self._prepare(key, None, env_params, obs_stats, False)
        self._check_policy_params(policy_params, "policy_params", population=False)
        return self._single_rollout(key, policy_params, env_params, obs_stats)

    def batch_rollout(self, keys, policy_params, env_params=None, obs_stats=None):
        """`B` episodes of one policy: outputs `(B, T, ...)`, `cum_return` `(B,)`."""
        if len(keys_lib.key_batch_shape(keys, "keys")) != 1:
            raise ValueError("batch_rollout takes keys of shape (B,)")
        keys, env_params, obs_stats = self._prepare(keys, None, env_params, obs_stats, False)
        self._check_policy_params(policy_params, "policy_params", population=False)
        return self._batch_rollout(keys, policy_params, env_params, obs_stats)

    def population_rollout(self, keys, pop_params, env_params=None, obs_stats=None):
        """`P x B` episodes: outputs `(P, [M,] B, T, ...)`, `cum_return` `(P, [M,] B)`.
        `pop_params`: the members' parameters stacked (member axis first), or a
        `popeval.low_rank.LowRankPopulation`."""
        keys, env_params, obs_stats = self._prepare(keys, pop_params, env_params, obs_stats, True)
        return self._run_parts(self._population_rollout, keys, pop_params, env_params, obs_stats)

    def population_fitness(self, keys, pop_params, env_params=None, obs_stats=None) -> FitnessResult:
        """Returns and lengths `(P, [M,] B)` without materialising trajectories.

        Memory does not grow with `T`; stepping stops once every episode is done. `pop_params`:
        the members' parameters stacked (member axis first), or a
        `popeval.low_rank.LowRankPopulation` (its mean shared, its factors per member).
        """
        keys, env_params, obs_stats = self._prepare(keys, pop_params, env_params, obs_stats, True)
        return self._run_parts(self._population_fitness, keys, pop_params, env_params, obs_stats)

    def episode_states(self, key, policy_params, env_params=None, obs_stats=None, max_steps=None):
        """The states of `single_rollout(key, ...)`'s episode, for drawing it.

        Returns:
            `(states, rewards)` as numpy pytrees: `states` has `n + 1` entries along its
            leading axis (the reset state, then the state after each step until the step
            that ends the episode or `max_steps`, default `num_env_steps`), `rewards (n,)`.
        """
        num_steps = self.num_env_steps if max_steps is None else int(max_steps)
        if num_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if self.obs_normalization and obs_stats is None:
            raise ValueError("this RolloutWrapper normalises observations; pass obs_stats")
        if keys_lib.key_batch_shape(key, "key") != ():
            raise ValueError("episode_states takes one key")
        env_params, obs_stats = self._env_params(env_params), self._obs_stats(obs_stats)
        self._check_policy_params(policy_params, "policy_params", population=False)
        if num_steps not in self._episode_states:
            def run(key, policy_params, env_params, obs_stats):
                first, _, (_, _, reward, _, done, states) = self.episode.scan(
                    key, policy_params, env_params, obs_stats, num_steps)
                return first, states, reward, done

            self._episode_states[num_steps] = compiler.jit(run)
        first, states, rewards, dones = jax.tree.map(
            np.asarray, self._episode_states[num_steps](key, policy_params, env_params, obs_stats))
        n = int(np.argmax(dones)) + 1 if dones.any() else num_steps
        states = jax.tree.map(lambda a, b: np.concatenate([a[None], b[:n]]), first, states)
        return states, rewards[:n]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Observation shape (gymnax compatibility)."""
        return self.obs_shape
