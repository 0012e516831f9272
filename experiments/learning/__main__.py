"""EGGROLL against OpenAI-ES at equal budgets: `python -m experiments.learning [NAME ...] [--seeds ...]`
(`experiments.learning.comparisons`)."""

from experiments.learning.comparisons import main

if __name__ == "__main__":
    main()
