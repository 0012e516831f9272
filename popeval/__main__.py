"""`python -m popeval ...`: see `popeval.cli`."""

import sys

from popeval.cli import main

sys.exit(main())
