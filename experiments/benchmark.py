"""The population-evaluation benchmark (`benchmarks.run`): popeval against its peers.

    python experiments/benchmark.py [--quick] [--envs ...] [--pop-sizes ...] [--devices N ...] [--out FILE]
    python experiments/benchmark.py scaling [--quick] [--configs ...] [--layouts 1x1 2x1 ...]

experiments/README.md says what each row measures. `scaling` measures the evolve loop over
processes and devices instead (`benchmarks.scaling`). `popeval bench` (`popeval.bench`) is
the small installed timing of popeval's own fitness path, without the peers.
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["scaling"]:  # each layout runs in its own processes
        from benchmarks.scaling import main as scaling

        sys.exit(scaling(sys.argv[2:]))
    from benchmarks.run import main

    sys.exit(main())
