"""What the RL agents share: typed YAML configs and a run directory with logging.

    config = load_config(DQNConfig, "experiments/configs/dqn_cartpole.yaml", ["lr=1e-3"])
    with RunLogger("runs/dqn", "DQN / CartPole-v1", dataclasses.asdict(config),
                   x="frames", y=("return/mean",), target=475) as logger:
        logger.log(step, {"frames": 10_000, "return/mean": 212.0})

A run directory holds `config.json`, `metrics.csv` (one row per `log`), `curve.png` (the `y`
columns against `x`, drawn when the run closes, also after an error) and W&B's files
(offline unless an API key is configured; `wandb="disabled"` turns it off).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from popeval.sinks import CSVSink, CurveSink, RunInfo, WandbSink
from popeval.typed_config import load

__all__ = ["load_config", "RunLogger", "default_run_dir"]

log = logging.getLogger("popeval")

#: `load_config(cls, path=None, overrides=None)`: a frozen config dataclass from YAML and
#: `key=value` overrides; unknown or mistyped keys raise naming the key.
load_config = load


def default_run_dir(name: str) -> Path:
    """`runs/<name>-<date>-<time>` (a new directory per run)."""
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


class RunLogger:
    """A new run directory and its sinks: `log(step, metrics)` writes a row everywhere.

    Args:
        run_dir: the run directory; must be absent or empty (a run never overwrites another).
        title: the plot's and W&B run's title.
        config: the experiment as a JSON-able mapping, saved as `config.json`.
        x, y: the curve: columns `y` against column `x`.
        target: drawn as a horizontal line, if given.
        wandb: `auto` (online with an API key configured, else offline), `offline`, `online`
            or `disabled`.
    """

    def __init__(self, run_dir: str | os.PathLike, title: str, config: dict, x: str = "frames",
                 y: tuple[str, ...] = ("return/mean",), target: float | None = None, wandb: str = "auto",
                 wandb_project: str = "popeval"):
        self.run_dir = Path(run_dir)
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise FileExistsError(f"run directory {self.run_dir} is not empty; choose a new one")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
        self.sinks = [CSVSink(), CurveSink(x, tuple(y)), WandbSink(wandb, wandb_project)]
        info = RunInfo(run_dir=self.run_dir, name=self.run_dir.name, title=title, config=config,
                       start_generation=0, num_generations=0, meta={}, target=target)
        for sink in self.sinks:
            sink.start(info)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """One row: `metrics` as flat `/` keys; array scalars become Python floats."""
        row = {k: (v if isinstance(v, (str, int)) else float(v)) for k, v in metrics.items()}
        for sink in self.sinks:
            sink.log(int(step), row)

    def close(self) -> None:
        """Closes every sink (draws the curve, finishes W&B); one sink's failure does not stop the others."""
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001 - the metrics are already on disk
                log.warning("closing %s failed (%s: %s)", type(sink).__name__, type(e).__name__, e)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
