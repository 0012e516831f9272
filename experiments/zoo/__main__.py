"""The controller zoo's command line.

    python -m experiments.zoo fresh [CONFIG ...]           # fresh.json: each controller on 4096+ fresh episodes
    python -m experiments.zoo seeds CONFIG RUN_DIR ...     # seeds.json: a config's runs with other seeds
    python -m experiments.zoo table [--short | --setups]   # docs/zoo.md's (README's) tables
    python -m experiments.zoo figure                       # experiments/zoo/zoo_curves_<family>.png
    python -m experiments.zoo references [CONFIG ...]      # the references the configs derive
    python -m experiments.zoo craftax_eval [RUN_DIR ...]   # Craftax-Classic's reward and achievements

`fresh`, `seeds`, `table` and `figure` are `experiments.zoo.results`; `references` and
`craftax_eval` the modules of those names.
"""

import importlib
import sys

#: The first argument -> the module whose `main(argv)` runs; any other is `results`' own command.
PROGRAMS = {"references": "experiments.zoo.references", "craftax_eval": "experiments.zoo.craftax_eval"}

if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in PROGRAMS:
        sys.exit(importlib.import_module(PROGRAMS[sys.argv[1]]).main(sys.argv[2:]))
    from experiments.zoo.results import main

    sys.exit(main())
