"""Where a run's metrics go: one small protocol, six sinks.

```python
sinks = [CSVSink(), PlotSink(), WandbSink("offline"), ProgressSink()]
evolve(config, options, sinks=sinks)      # the loop calls start / log / close
```

A sink is any object with

```python
start(info: RunInfo) -> None              # before the first generation
log(step: int, metrics: dict) -> None     # after every generation, flat `/` keys
close() -> None                           # always, also after an error or Ctrl-C
```

`start` may be slow (W&B's service, matplotlib's import): the loop runs it on a helper
thread while the first generation compiles, and waits for it before the first `log`. A sink
may keep what a resumed run needs in `info.meta` under its own key (W&B keeps its run id);
`meta` is saved with every checkpoint.

Library code returns flat metric dicts; only this package imports wandb, matplotlib and tqdm.
W&B runs offline automatically when no API key is configured (also when `online` is asked
for: it says so), any W&B failure logs one warning and is then ignored: it never stops a run,
and its close waits at most a few seconds (`POPEVAL_WANDB_CLOSE_TIMEOUT`).
"""

from .base import RunInfo, Sink
from .files import (
    CURVE_PNG,
    FINAL_COLUMNS,
    FITNESS_PNG,
    METRICS_CSV,
    CSVSink,
    CurveSink,
    PlotSink,
    plot_curves,
    plot_fitness,
    read_metrics,
)
from .progress import LogSink, ProgressSink
from .weights_and_biases import WandbSink, wandb_mode

__all__ = ["RunInfo", "Sink", "CSVSink", "PlotSink", "CurveSink", "WandbSink", "ProgressSink", "LogSink",
           "read_metrics", "plot_fitness", "plot_curves", "wandb_mode", "METRICS_CSV", "FITNESS_PNG", "CURVE_PNG",
           "FINAL_COLUMNS"]
