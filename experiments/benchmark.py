"""The population-evaluation benchmark (`popeval.benchmark`), run from a source checkout.

    python experiments/benchmark.py [--quick] [--envs ...] [--pop-sizes ...] [--devices N ...] [--out FILE]
    python experiments/benchmark.py scaling [--quick] [--configs ...] [--layouts 1x1 2x1 ...]

Same as `popeval bench`; experiments/README.md says what each row measures.
`scaling` measures the evolve loop over processes and devices instead
(`popeval.strategies.scaling_benchmark`).
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["scaling"]:  # each layout runs in its own processes
        from popeval.strategies.scaling_benchmark import main as scaling

        sys.exit(scaling(sys.argv[2:]))
    from popeval.benchmark import main

    sys.exit(main())
