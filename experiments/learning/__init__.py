"""EGGROLL against OpenAI-ES at equal budgets (`comparisons`): the table in `docs/evolve.md`."""
