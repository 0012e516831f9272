"""Use popeval from your own ES code: a 30-line OpenAI-ES in plain JAX on CartPole-v1.

    python -m experiments.examples custom_es [--generations 40] [--pop_size 128]

Everything between "the ES proposes a population" and "the ES receives its fitness" is one
call: `manager.population_fitness(keys, pop_params)`.
"""

import argparse

import jax
import jax.numpy as jnp

from popeval import MLPPolicy, ParamReshaper, RolloutWrapper, make


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.examples custom_es", description=__doc__.split("\n\n")[0])
    ap.add_argument("--generations", type=int, default=40)
    ap.add_argument("--pop_size", "--pop-size", type=int, default=128)
    ap.add_argument("--sigma", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=0.3)
    args = ap.parse_args(argv)

    env, env_params = make("CartPole-v1")
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(32, 32))
    reshaper = ParamReshaper(policy.init_params(jax.random.key(0), env, env_params))
    manager = RolloutWrapper(policy.apply, env=env, env_params=env_params)

    @jax.jit
    def generation(mean, key):
        key_noise, key_episodes = jax.random.split(key)
        half = jax.random.normal(key_noise, (args.pop_size // 2, reshaper.num_dims))
        noise = jnp.concatenate([half, -half])  # antithetic pairs
        pop_params = reshaper.unflatten_population(mean + args.sigma * noise)
        keys = jax.random.split(key_episodes, 8)  # the same 8 episodes for every member
        fitness = manager.population_fitness(keys, pop_params).returns.mean(axis=1)
        ranks = jnp.argsort(jnp.argsort(fitness)) / (args.pop_size - 1) - 0.5  # centred ranks
        grad = noise.T @ ranks / (args.pop_size * args.sigma)
        return mean + args.lr * grad, fitness  # plain gradient ascent on the smoothed return

    mean = reshaper.flatten(reshaper.template)
    key = jax.random.key(1)
    for gen in range(args.generations):
        key, sub = jax.random.split(key)
        mean, fitness = generation(mean, sub)
        print(f"generation {gen:3d}  mean fitness {float(fitness.mean()):7.1f}  max {float(fitness.max()):6.1f}")
    returns = manager.population_fitness(jax.random.split(key, 64), reshaper.unflatten_population(mean[None])).returns
    print(f"mean-policy return over 64 episodes: {float(returns.mean()):.1f}")
    return float(returns.mean())


if __name__ == "__main__":
    main()
