"""`python -m popeval ...`: see `popeval.cli`."""

from popeval.cli import run

run()
