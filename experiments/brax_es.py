"""popeval's command line with brax environments registered as `brax/<name>`.

    python experiments/brax_es.py evolve --config experiments/configs/brax_inverted_pendulum.yaml
    python experiments/brax_es.py eval RUN_DIR            # the saved controller's returns

The registry holds popeval's own environments only (brax is an extra), so this script
registers brax's (`popeval.environments.register`) and hands its arguments to `popeval`'s
`main`: the evolve loop, its run directory (metrics.csv, fitness.png, checkpoints) and
resuming are the CLI's. brax is imported when an environment is built, after the CLI has
given JAX one CPU device per core.
"""

from __future__ import annotations

import sys

from popeval import cli
from popeval.environments import register

#: The brax environments registered here (any `brax.envs` name works with `brax_env`).
BRAX_ENVS = ("inverted_pendulum", "inverted_double_pendulum", "reacher", "swimmer", "hopper",
             "halfcheetah", "walker2d", "ant", "humanoid")


def _factory(env_name: str):
    """`make`'s constructor for one brax environment: its keyword arguments are what a
    config's `env_kwargs` may set."""
    def build(backend: str | None = None, max_steps_in_episode: int = 1000):
        from popeval.environments.suites import brax as brax_suite

        return brax_suite.brax_env(env_name, backend=backend or brax_suite.DEFAULT_BACKEND,
                                   max_steps_in_episode=max_steps_in_episode)

    return build


def main(argv: list[str] | None = None) -> int:
    for name in BRAX_ENVS:
        register(f"brax/{name}", _factory(name))
    return cli.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
