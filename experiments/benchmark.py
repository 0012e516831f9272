"""The population-evaluation benchmark (`popeval.benchmark`), run from a source checkout.

    python experiments/benchmark.py [--quick] [--envs ...] [--pop-sizes ...] [--out FILE]

Same as `popeval bench`; see `popeval/benchmark.py` for what each row measures.
"""

import sys

from popeval.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
