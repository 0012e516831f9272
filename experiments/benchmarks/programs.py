"""The programs `benchmarks.run` times, one per row, and the populations they evaluate.

    pop = population("CartPole-v1 trained", pop_size=512)
    progs = programs(pop, jax.random.split(jax.random.key(1), 8))   # impl name -> Program

Every program is a function of `(keys (B,), pop_params, env_params)`:

- `popeval trajectory` / `popeval fitness` / `popeval fitness nc`: `RolloutWrapper`'s
  `population_rollout`, `population_fitness` (the default) and `population_fitness` with
  `compaction=False`, over all local devices (the wrapper's default);
- `fused limit` (`fused_limit`): the machine's limit for the same work, over all local devices;
- `gymnax best case`: gymnax's population rollout returning only `cum_return`, what an ES
  loop compiles (XLA drops the trajectories), with XLA's default options; `gymnax best,
  popeval opts`: the same program compiled with popeval's options (`popeval.compiler`, as
  popeval's rows and the fused limit are; only where they differ from XLA's defaults);
  `gymnax trajectories`: the full output;
  `evosax GymnaxProblem`: `GymnaxProblem.eval` (both optional: `pip install popeval[bench]`).

Workloads: an environment id with a fresh population (random initial parameters), or
`CartPole-v1 trained` (`trained_cartpole`): members that keep every episode alive 500 steps.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from popeval import compiler, layouts, sharding
from popeval import keys as keys_lib
from popeval.environments import make
from popeval.policies import MLPPolicy
from popeval.rollout import RolloutWrapper

__all__ = ["HIDDEN", "IMPLS", "LIMIT_CHUNK_EPISODES", "TRAINED", "Population", "Program", "episode_lengths",
           "fitness_program", "fused_limit", "peak_rss_growth", "population", "programs", "trained_cartpole",
           "xla_bytes"]

HIDDEN = (32, 32)
#: The fused limit's chunk on a CPU (episodes a scan steps side by side; popeval's hold 256): 512 ran as
#: fast as 256 or faster (Acrobot 4-7% on Sapphire Rapids, CartPole 1.1-1.3x on Zen 3;
#: experiments/benchmarks/README.md).
LIMIT_CHUNK_EPISODES = 512

#: The workload name of the trained CartPole population.
TRAINED = "CartPole-v1 trained"
IMPLS = ("popeval trajectory", "popeval fitness", "popeval fitness nc", "fused limit", "gymnax best case",
         "gymnax best, popeval opts", "gymnax trajectories", "evosax GymnaxProblem")
#: The trained CartPole controller: push right when `GAINS . (x, x_dot, theta, theta_dot) > 0`. It
#: kept |x| < 0.14, |theta| < 0.052 (limits 2.4, 0.21) for 500 steps in 100,000 random resets.
GAINS = (0.5, 1.0, 5.0, 1.0)
_IN_SCALE, _OUT_SCALE, _NOISE = 0.1, 10.0, 1e-4


class Population(NamedTuple):
    """A workload: an environment, a policy and the parameters of `P` members."""

    workload: str
    env_id: str
    env: Any
    env_params: Any
    policy: MLPPolicy
    pop_params: Any  # leading axis P on every leaf
    num_env_steps: int


class Program(NamedTuple):
    """One row's program and how to read its output."""

    fn: Callable  # fn(keys (B,), pop_params, env_params) -> out
    lengths: Callable  # out -> (P, B) numpy episode lengths (steps before done)
    devices: int  # devices it runs on
    all_steps: bool = False  # its steps/s counts all P*B*T steps, not just those before done
    options: Any = None  # XLA compiler options (None: XLA's defaults)
    parts: int = 1  # run as this many parts on threads, as `RolloutWrapper` does (`sharding.member_parts`)


def episode_lengths(done: Any) -> np.ndarray:
    """Steps up to and including the first `done` along the last axis (T if none)."""
    done = np.asarray(done).reshape(np.shape(done)[:2] + (-1,))
    return np.where(done.any(-1), done.argmax(-1) + 1, done.shape[-1])


def trained_cartpole(policy: MLPPolicy, template: Any, pop_size: int, seed: int = 0) -> Any:
    """`pop_size` MLP members that implement the linear controller `GAINS` on CartPole.

    The first hidden unit computes `tanh(0.1 * GAINS . obs)` (nearly linear on CartPole's
    states), each later hidden layer passes it on through its first unit, and the output
    layer scales it into the logits `(-10 h, 10 h)`: push right when `GAINS . obs > 0`. Every
    weight then gets Gaussian noise of 1e-4 times its layer's largest weight, so members
    differ and no weight is zero. `template`: one member's flax variables (for the shapes).
    """
    layers = template["params"]
    names = [f"Dense_{i}" for i in range(len(layers))]
    if set(names) != set(layers) or layers[names[0]]["kernel"].shape[0] != len(GAINS) \
            or layers[names[-1]]["kernel"].shape[1] != 2:
        raise ValueError(f"trained_cartpole needs an MLPPolicy on CartPole (4 inputs, 2 actions), got layers "
                         f"{ {n: tuple(v['kernel'].shape) for n, v in layers.items()} }")
    rng = np.random.default_rng(seed)
    out = {}
    for i, name in enumerate(names):
        kernel = np.zeros((pop_size,) + tuple(layers[name]["kernel"].shape), np.float32)
        bias = np.zeros((pop_size,) + tuple(layers[name]["bias"].shape), np.float32)
        if i == 0:
            kernel[:, :, 0] = _IN_SCALE * np.asarray(GAINS, np.float32)
        elif i < len(names) - 1:
            kernel[:, 0, 0] = 1.0
        else:
            kernel[:, 0] = (-_OUT_SCALE, _OUT_SCALE)
        scale = _NOISE * np.abs(kernel).max()
        kernel += scale * rng.standard_normal(kernel.shape).astype(np.float32)
        bias += scale * rng.standard_normal(bias.shape).astype(np.float32)
        out[name] = {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias)}
    return {"params": out}


def population(workload: str, pop_size: int, num_env_steps: int | None = None,
               hidden_sizes: tuple[int, ...] = HIDDEN) -> Population:
    """The workload's environment, an MLP policy (tanh, `hidden_sizes`: 2x32) and `pop_size`
    members' parameters (random initialisation with key 0, or `trained_cartpole` for `TRAINED`)."""
    trained = workload == TRAINED
    env_id = "CartPole-v1" if trained else workload
    env, env_params = make(env_id)
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=hidden_sizes)
    if trained:
        pop_params = trained_cartpole(policy, policy.init_params(jax.random.key(0), env, env_params), pop_size)
    else:
        init = jax.jit(jax.vmap(lambda k: policy.init_params(k, env, env_params)))
        pop_params = init(jax.random.split(jax.random.key(0), pop_size))
    steps = int(env_params.max_steps_in_episode) if num_env_steps is None else int(num_env_steps)
    return Population(workload, env_id, env, env_params, policy, pop_params, steps)


def fused_limit(env: Any, policy: MLPPolicy, num_steps: int, devices: int = 1) -> Callable:
    """The machine's limit for this work: `fn(keys (B,), pop_params, env_params) -> (returns, lengths)`.

    Policy and environment fused in one `lax.scan` of `num_steps` steps per chunk of members
    (`layouts.trajectories`: on a CPU chunks of `LIMIT_CHUNK_EPISODES`, where one scan of all
    members was up to 10% slower; elsewhere popeval's accelerator layout, one chunk): no early exit,
    no per-step keys (every `step_env`, and a sampled policy head, gets the key `jax.random.key(0)`),
    one batched matmul per layer and member over its `B` episodes. The episodes start from popeval's reset keys
    (`keys.split_episode`): in an environment that draws no randomness after its reset they are
    popeval's. The lengths depend on every step's `done` (a program returning only CartPole's summed
    reward, 1 per step, would let XLA drop the environment)."""
    fixed = jax.random.key(0)

    def episode(key, params, env_params, _):  # one episode; vmapped over a member's B (one matmul)
        obs, state = env.reset_env(keys_lib.split_episode(key)[0], env_params)

        def body(carry, _):
            obs, state, ret, length, alive = carry
            obs, state, reward, done, _ = env.step_env(fixed, state, policy.apply(params, obs, fixed), env_params)
            ret = ret + jnp.where(alive, reward, 0.0)
            return (obs, state, ret, length + alive.astype(jnp.int32), alive & ~done), None

        init = (obs, state, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), jnp.ones((), bool))
        (_, _, ret, length, _), _ = jax.lax.scan(body, init, None, num_steps)
        return ret, length

    devices = sharding.resolve_devices(devices)
    layout = layouts.for_platform(devices[0].platform)
    if layout.chunk_episodes is not None:
        layout = layout._replace(chunk_episodes=LIMIT_CHUNK_EPISODES)
    sharded = sharding.shard_members(  # member_keys (P, B)
        lambda member_keys, pop_params, env_params: layouts.trajectories(
            episode, member_keys, pop_params, env_params, None, False, layout), devices)

    def run(keys, pop_params, env_params):
        size = jax.tree.leaves(pop_params)[0].shape[0]
        return sharded(jnp.broadcast_to(keys, (size,) + keys.shape), pop_params, env_params)

    return run


def _gymnax() -> tuple[Any, Any, Any]:
    """`(gymnax, its RolloutWrapper, evosax's GymnaxProblem or None)`, or Nones without gymnax."""
    try:
        import gymnax
        from gymnax.experimental import RolloutWrapper as GymnaxRolloutWrapper
    except ImportError:
        return None, None, None
    try:
        from evosax.problems import GymnaxProblem
    except ImportError:
        GymnaxProblem = None
    return gymnax, GymnaxRolloutWrapper, GymnaxProblem


def _gymnax_programs(pop: Population, keys: jax.Array, out: dict[str, Program]) -> None:
    gymnax, GymnaxRolloutWrapper, GymnaxProblem = _gymnax()
    if gymnax is None or pop.env_id not in gymnax.registered_envs:
        return
    try:
        gw = GymnaxRolloutWrapper(pop.policy.apply, env_name=pop.env_id, num_env_steps=pop.num_env_steps)
    except NotImplementedError:  # an env gymnax lists but does not implement
        return
    # gymnax's `done` (terminated | truncated) flags the end of its first episode (`step`
    # auto-resets). The best case's episodes are the trajectories' (same program and keys):
    # their lengths, when that row ran first (`programs`' order), else a program of `done` only.
    seen: dict[str, np.ndarray] = {}
    done_only = jax.jit(lambda k, p: gw.population_rollout(k, p)[4])
    out["gymnax trajectories"] = Program(lambda k, p, e: gw.population_rollout(k, p),
                                         lambda r: seen.setdefault("lengths", episode_lengths(r[4])), 1)
    out["gymnax best case"] = Program(
        lambda k, p, e: gw.population_rollout(k, p)[-1],
        lambda _: seen["lengths"] if seen else episode_lengths(done_only(keys, pop.pop_params)), 1)
    if compiler.options():
        out["gymnax best, popeval opts"] = out["gymnax best case"]._replace(options=compiler.options())
    if GymnaxProblem is None:
        return
    problem = GymnaxProblem(pop.env_id, pop.policy, episode_length=pop.num_env_steps,
                            num_rollouts=keys.shape[0], use_normalize_obs=False)
    state = problem.init(jax.random.key(0))

    def evosax_lengths(r):
        # After an episode's last step gymnax's auto-reset leaves a state with time 0.
        return episode_lengths(np.asarray(r[2]["env_states"][1].time) == 0)

    out["evosax GymnaxProblem"] = Program(lambda k, p, e: problem.eval(k[0], p, state), evosax_lengths, 1)


def programs(pop: Population, keys: jax.Array, impls: tuple[str, ...] = IMPLS,
             threads: int | None = None) -> dict[str, Program]:
    """impl name -> `Program` for the rows `impls`, in `IMPLS`' order but gymnax's trajectories
    before its best case (gymnax's and evosax's rows only when installed and gymnax registers
    the environment). `threads`: `RolloutWrapper`'s, for popeval's rows and the fused limit."""
    if unknown := set(impls) - set(IMPLS):
        raise ValueError(f"unknown impl(s) {sorted(unknown)}; choose from {list(IMPLS)}")
    out: dict[str, Program] = {}
    # popeval's rows and the fused limit run on all local devices, in the pieces on threads of the
    # wrapper's calls from Python (on CPUs each piece a one-device program, so the programs here
    # are one device's); compiled here in another program, so with the wrapper's options.
    devices = jax.local_devices()
    num_members = jax.tree.leaves(pop.pop_params)[0].shape[0]
    parts = sharding.member_parts(tuple(devices), num_members, num_members * keys.shape[0], threads)
    program_devices = 1 if devices[0].platform == "cpu" else len(devices)
    for name, compaction in (("popeval fitness", True), ("popeval fitness nc", False)):
        w = RolloutWrapper(pop.policy.apply, env_name=pop.env_id, num_env_steps=pop.num_env_steps,
                           compaction=compaction, devices=program_devices)
        out[name] = Program(lambda k, p, e, w=w: w.population_fitness(k, p, e), lambda r: np.asarray(r.lengths),
                            len(devices), options=compiler.options(), parts=parts)
        if compaction:
            out["popeval trajectory"] = Program(lambda k, p, e, w=w: w.population_rollout(k, p, e),
                                                lambda r: episode_lengths(r[4]), len(devices),
                                                options=compiler.options(), parts=parts)
    out["fused limit"] = Program(fused_limit(pop.env, pop.policy, pop.num_env_steps, program_devices),
                                 lambda r: np.asarray(r[1]), len(devices), all_steps=True,
                                 options=compiler.options(), parts=parts)
    if any(name.startswith(("gymnax", "evosax")) for name in impls):
        _gymnax_programs(pop, keys, out)
    best = ("gymnax best case", "gymnax best, popeval opts")
    order = [name for name in IMPLS if name not in best]
    order[order.index("gymnax trajectories") + 1:0] = best
    return {name: out[name] for name in order if name in out and name in impls}


def _rss() -> int | None:
    """This process's resident memory in bytes (from Linux's `/proc`; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def peak_rss_growth(call: Callable[[], Any]) -> tuple[Any, int | None]:
    """`(call()'s result, peak resident memory during the call - before it)`, sampled every 5 ms."""
    before = _rss()
    peak, done = [before or 0], threading.Event()

    def sample():
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss() or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out = jax.block_until_ready(call())
    finally:
        done.set()
        sampler.join()
    return out, None if before is None else max(peak[0], _rss() or 0) - before


def fitness_program(env_id: str, pop_size: int, num_rollouts: int, num_steps: int | None, env_kwargs: dict):
    """The default `RolloutWrapper`'s fitness path for a fresh population, compiled."""
    pop = population(env_id, pop_size, num_steps)
    w = RolloutWrapper(pop.policy.apply, env_name=env_id, env_kwargs=env_kwargs, num_env_steps=pop.num_env_steps)
    keys = jax.random.split(jax.random.key(1), num_rollouts)
    compiled = jax.jit(w.population_fitness).lower(keys, pop.pop_params).compile(compiler.options())
    return w, compiled, (keys, pop.pop_params)


def xla_bytes(compiled: Any, devices: int = 1, kinds: tuple[str, ...] = ("temp", "output")) -> int | None:
    """XLA's compiled buffer bytes of `kinds` over all `devices` (it reports one device's share)."""
    mem = compiled.memory_analysis()
    return None if mem is None else devices * sum(int(getattr(mem, f"{k}_size_in_bytes")) for k in kinds)
