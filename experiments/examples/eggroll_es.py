"""Low-rank populations from your own ES code: a 30-line EGGROLL in plain JAX on CartPole-v1.

    python -m experiments.examples eggroll_es [--generations 30] [--pop_size 128] [--rank 1]

Each member is the mean policy plus a rank-`r` perturbation of every weight matrix (EGGROLL,
Sarkar et al., arXiv 2511.16652): `manager.population_fitness(keys, population)` draws the
members' factors inside the evaluation and runs every layer as one product with the shared
mean plus each member's rank-`r` correction; the update (`popeval.strategies.algorithms.eggroll.gradient`,
what `strategy: eggroll` uses) redraws the same factors and weights them by the members' centred
ranks (docs/rollouts.md, "Low-rank populations").
"""

import argparse
from functools import partial

import jax
import jax.numpy as jnp

from popeval import MLPPolicy, RolloutWrapper, compiler, make
from popeval.low_rank import LowRankPopulation
from popeval.strategies.algorithms.eggroll import gradient


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.examples eggroll_es", description=__doc__.split("\n\n")[0])
    ap.add_argument("--generations", type=int, default=30)
    ap.add_argument("--pop_size", "--pop-size", type=int, default=128)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--sigma", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=0.3)
    args = ap.parse_args(argv)

    env, env_params = make("CartPole-v1")
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(32, 32))
    manager = RolloutWrapper(policy.apply, env=env, env_params=env_params)
    members = jnp.arange(args.pop_size)

    @partial(jax.jit, compiler_options=compiler.options())  # popeval's XLA options: a quicker compile
    def generation(mean, key):
        key_noise, key_episodes = jax.random.split(key)
        population = LowRankPopulation.from_key(mean, key_noise, args.sigma, args.rank, members=members)
        keys = jax.random.split(key_episodes, 8)  # the same 8 episodes for every member
        fitness = manager.population_fitness(keys, population).returns.mean(axis=1)
        ranks = jnp.argsort(jnp.argsort(fitness)) / (args.pop_size - 1) - 0.5  # centred ranks
        # 1 / (P sigma) sum_i w_i E_i, the factors redrawn as the evaluation drew them
        return jax.tree.map(lambda m, g: m + args.lr * g, mean, gradient(population, ranks)), fitness

    mean = policy.init_params(jax.random.key(0), env, env_params)
    key = jax.random.key(1)
    for gen in range(args.generations):
        key, sub = jax.random.split(key)
        mean, fitness = generation(mean, sub)
        print(f"generation {gen:3d}  mean fitness {float(fitness.mean()):7.1f}  max {float(fitness.max()):6.1f}")
    returns = manager.population_fitness(jax.random.split(key, 64), jax.tree.map(lambda x: x[None], mean)).returns
    print(f"mean-policy return over 64 episodes: {float(returns.mean()):.1f}")
    return float(returns.mean())


if __name__ == "__main__":
    main()
