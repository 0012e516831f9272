"""Evolution strategies written out by hand around `population_fitness`: `custom_es` (OpenAI-ES) and
`eggroll_es` (EGGROLL's low-rank perturbations)."""
