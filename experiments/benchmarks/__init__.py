"""The benchmarks (not installed), run as `python -m experiments.benchmarks [BENCHMARK] ...`
(`experiments.benchmarks.__main__`).

- `run`: the population-evaluation benchmark: options, rows, table, JSON (the default).
- `programs`: the programs it times (popeval's, gymnax's, evosax's, the fused limit) and the
  populations they evaluate.
- `checks`: its memory and eager `env.step` checks, and its timing helpers.
- `scaling`: the evolve loop's scaling over processes and devices.
- `low_rank`: low-rank populations against full-rank ones and the inference limit.
- `cnn`: `CNNPolicy`'s convolutions as one product against lax's.
- `suites`: Craftax, Brax, Jumanji and Navix against their own loops.
- `time_to_solve`: wall time until CartPole is solved, popeval against evosax + gymnax.
- `brax_throughput`: one population evaluation on a Brax environment against Brax's own loop.
"""
