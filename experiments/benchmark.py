"""The population-evaluation benchmark (`benchmarks.run`): popeval against its peers.

    python experiments/benchmark.py [--quick] [--envs ...] [--pop_sizes ...] [--devices N ...] [--out FILE]
    python experiments/benchmark.py scaling [--quick] [--configs ...] [--layouts 1x1 2x1 ...]
    python experiments/benchmark.py low_rank [--quick] [--pop_size 256] [--num_rollouts 8]
    python experiments/benchmark.py cnn [--quick] [--pop_size 128] [--num_rollouts 2]
    python experiments/benchmark.py suites [--quick] [--workloads ...] [--repeats 3]

experiments/README.md says what each row measures. `scaling` measures the evolve loop over
processes and devices instead (`benchmarks.scaling`); `low_rank` low-rank populations against
full-rank ones and the inference limit (`benchmarks.low_rank`); `cnn` `CNNPolicy`'s convolutions as
one product against lax's (`benchmarks.cnn`); `suites` Craftax, Brax, Jumanji and Navix against
their own loops (`benchmarks.suites`). `popeval bench` (`popeval.bench`) is
the small installed timing of popeval's own fitness path, without the peers.
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["scaling"]:  # each layout runs in its own processes
        from benchmarks.scaling import main as scaling

        sys.exit(scaling(sys.argv[2:]))
    if sys.argv[1:2] == ["low_rank"]:
        from benchmarks.low_rank import main as low_rank

        sys.exit(low_rank(sys.argv[2:]))
    if sys.argv[1:2] == ["cnn"]:
        from benchmarks.cnn import main as cnn

        sys.exit(cnn(sys.argv[2:]))
    if sys.argv[1:2] == ["suites"]:
        from benchmarks.suites import main as suites

        sys.exit(suites(sys.argv[2:]))
    from benchmarks.run import main

    sys.exit(main())
