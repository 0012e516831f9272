"""Evolution strategies written out by hand around `RolloutWrapper.population_fitness`.

    python -m experiments.examples custom_es [--generations 40] [--pop_size 128]   # OpenAI-ES, 30 lines
    python -m experiments.examples eggroll_es [--generations 30] [--rank 1]        # EGGROLL, low-rank members

Each is a module of `experiments.examples`; `--help` after its name lists its options.
"""

import importlib
import sys

EXAMPLES = {"custom_es": "experiments.examples.custom_es", "eggroll_es": "experiments.examples.eggroll_es"}

if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in EXAMPLES:
        importlib.import_module(EXAMPLES[sys.argv[1]]).main(sys.argv[2:])  # returns the mean policy's return
    else:
        asked = sys.argv[1:] in ([], ["-h"], ["--help"])
        print(__doc__.strip() if asked else f"no example {sys.argv[1]!r}; choose from {', '.join(EXAMPLES)}",
              file=sys.stdout if asked else sys.stderr)
        sys.exit(0 if asked else 2)
