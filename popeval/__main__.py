"""`python -m popeval ...`: see `popeval.cli`."""

from popeval.cli import run

if __name__ == "__main__":  # importing the module (a documentation tool does) runs nothing
    run()
