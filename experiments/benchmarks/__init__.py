"""The benchmarks run by `experiments/benchmark.py` (not installed; `experiments/` on `sys.path`).

- `benchmarks.run`: the population-evaluation benchmark: options, rows, table, JSON.
- `benchmarks.programs`: the programs it times (popeval's, gymnax's, evosax's, the fused
  limit) and the populations they evaluate.
- `benchmarks.checks`: its memory and eager `env.step` checks, and its timing helpers.
- `benchmarks.scaling`: the evolve loop's scaling over processes and devices
  (`python experiments/benchmark.py scaling`).
"""
