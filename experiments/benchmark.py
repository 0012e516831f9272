"""The population-evaluation benchmark (`popeval.benchmark`), run from a source checkout.

    python experiments/benchmark.py [--quick] [--envs ...] [--pop-sizes ...] [--devices N ...] [--out FILE]
    python experiments/benchmark.py scaling [--quick] [--configs ...] [--layouts 1x1 2x1 ...]

Same as `popeval bench`, which on a CPU first gives JAX one device per core (unless
`JAX_NUM_CPU_DEVICES` is set); experiments/README.md says what each row measures.
`scaling` measures the evolve loop over processes and devices instead
(`popeval.strategies.scaling_benchmark`).
"""

import sys

from popeval import sharding

if __name__ == "__main__":
    if sys.argv[1:2] == ["scaling"]:  # each layout runs in its own processes
        from popeval.strategies.scaling_benchmark import main as scaling

        sys.exit(scaling(sys.argv[2:]))
    message = sharding.use_all_cores()  # before JAX starts its backends, as `popeval bench` does
    if message:
        print(message, file=sys.stderr)
    from popeval.benchmark import main

    sys.exit(main())
