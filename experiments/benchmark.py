"""The population-evaluation benchmark (`popeval.benchmark`), run from a source checkout.

    python experiments/benchmark.py [--quick] [--envs ...] [--pop-sizes ...] [--devices N ...] [--out FILE]

Same as `popeval bench`, which on a CPU first gives JAX one device per core (unless
`JAX_NUM_CPU_DEVICES` is set); experiments/README.md says what each row measures.
"""

import sys

from popeval import sharding

if __name__ == "__main__":
    message = sharding.use_all_cores()  # before JAX starts its backends, as `popeval bench` does
    if message:
        print(message, file=sys.stderr)
    from popeval.benchmark import main

    sys.exit(main())
