"""The benchmarks: popeval against its peers (`experiments.benchmarks.run`, the default) and the others.

    python -m experiments.benchmarks [--quick] [--envs ...] [--pop_sizes ...] [--devices N ...] [--out FILE]
    python -m experiments.benchmarks scaling [--quick] [--configs ...] [--layouts 1x1 2x1 ...]
    python -m experiments.benchmarks low_rank [--quick] [--pop_size 256] [--num_rollouts 8]
    python -m experiments.benchmarks cnn [--quick] [--pop_size 128] [--num_rollouts 2]
    python -m experiments.benchmarks suites [--quick] [--workloads ...] [--repeats 3]
    python -m experiments.benchmarks time_to_solve [--repeats 1] [--compile_options]
    python -m experiments.benchmarks brax_throughput [--env ant] [--pop_size 64] [--backends mjx]

experiments/benchmarks/README.md says what each row measures. `scaling` measures the evolve loop
over processes and devices instead; `low_rank` low-rank populations against full-rank ones and
the inference limit; `cnn` `CNNPolicy`'s convolutions as one product against lax's; `suites`
Craftax, Brax, Jumanji and Navix against their own loops; `time_to_solve` the wall time until the
shipped CartPole config is solved, against evosax + gymnax; `brax_throughput` one evaluation on a
Brax environment against Brax's own loop. `popeval bench` (`popeval.bench`) is the small installed
timing of popeval's own fitness path, without the peers.
"""

import importlib
import sys

#: The first argument -> the module whose `main(argv)` runs (imported only when chosen: each
#: chooses its devices before JAX starts, and `scaling` runs every layout in its own processes).
BENCHMARKS = {name: f"experiments.benchmarks.{name}"
              for name in ("scaling", "low_rank", "cnn", "suites", "time_to_solve", "brax_throughput")}

if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in BENCHMARKS:
        result = importlib.import_module(BENCHMARKS[sys.argv[1]]).main(sys.argv[2:])
        sys.exit(result if isinstance(result, int) else 0)  # some return their rows
    from experiments.benchmarks.run import main

    sys.exit(main())
