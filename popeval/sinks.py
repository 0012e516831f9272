"""Where a run's metrics go: one small protocol, four sinks.

    sinks = [CSVSink(), PlotSink(), WandbSink("offline"), ProgressSink()]
    evolve(config, options, sinks=sinks)      # the loop calls start / log / close

A sink is any object with
    start(info: RunInfo) -> None              # before the first generation
    log(step: int, metrics: dict) -> None     # after every generation, flat `/` keys
    close() -> None                           # always, also after an error or Ctrl-C
`start` may be slow (W&B's service, matplotlib's import): the loop runs it on a helper
thread while the first generation compiles, and waits for it before the first `log`. A sink
may keep what a resumed run needs in `info.meta` under its own key (W&B keeps its run id);
`meta` is saved with every checkpoint.

Library code returns flat metric dicts; only this module imports wandb, matplotlib and tqdm.
W&B runs offline automatically when no API key is configured, and any W&B failure logs one
warning and is then ignored: it never stops a run.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any, Protocol

__all__ = ["RunInfo", "Sink", "CSVSink", "PlotSink", "WandbSink", "ProgressSink", "read_metrics",
           "plot_fitness", "wandb_mode", "METRICS_CSV", "FITNESS_PNG"]

log = logging.getLogger("popeval")

METRICS_CSV = "metrics.csv"
FITNESS_PNG = "fitness.png"


@dataclasses.dataclass
class RunInfo:
    """What sinks are told about a run when it starts."""

    run_dir: Path
    name: str  # the run's name (its directory's name)
    title: str  # e.g. "CartPole-v1 / Open_ES"
    config: dict  # the experiment, as saved in config.json
    start_generation: int  # > 0 when resuming
    num_generations: int
    meta: dict  # saved with every checkpoint; sinks may keep resume information here


class Sink(Protocol):
    def start(self, info: RunInfo) -> None: ...

    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def read_metrics(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a `metrics.csv` (empty when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class CSVSink:
    """Appends one row per generation to `RUN/metrics.csv` (columns fixed by the first row).

    A resumed run first drops the rows written after the checkpoint it restarts from.
    """

    def __init__(self, filename: str = METRICS_CSV):
        self.filename = filename
        self.path: Path | None = None
        self.columns: list[str] | None = None

    def start(self, info: RunInfo) -> None:
        self.path = info.run_dir / self.filename
        rows = read_metrics(self.path)
        if rows:
            self.columns = list(rows[0].keys())
        if self.path.exists():  # resuming
            rows = [r for r in rows if int(float(r["generation"])) <= info.start_generation]
            self._write_all(rows)

    def _write_all(self, rows: list[dict]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            if self.columns:
                w = csv.DictWriter(f, fieldnames=self.columns)
                w.writeheader()
                w.writerows(rows)
        os.replace(tmp, self.path)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        new = self.columns is None
        if new:
            self.columns = list(metrics)
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow({k: metrics.get(k, "") for k in self.columns})

    def close(self) -> None:
        pass


def _import_pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fitness(csv_path: str | os.PathLike, png_path: str | os.PathLike, title: str = "") -> None:
    """Draws max / mean / min fitness (and eval return) per generation into a PNG."""
    rows = read_metrics(csv_path)
    if not rows:
        return
    plt = _import_pyplot()
    gen = [float(r["generation"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    col = lambda k: [float(r[k]) if r.get(k, "") not in ("", "nan") else math.nan for r in rows]  # noqa: E731
    ax.fill_between(gen, col("fitness/min"), col("fitness/max"), alpha=0.2, label="min-max")
    ax.plot(gen, col("fitness/mean"), label="population mean")
    ax.plot(gen, col("best/fitness"), label="best so far", linestyle="--")
    ev = [(g, v) for g, v in zip(gen, col("eval/return")) if not math.isnan(v)]
    if ev:
        ax.plot(*zip(*ev), "o-", label="eval (mean params)")
    ax.set_xlabel("generation")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


class PlotSink:
    """Draws `RUN/fitness.png` from `RUN/metrics.csv` when the run closes (matplotlib is
    imported at `start`, which the loop runs while the first generation compiles)."""

    def __init__(self, filename: str = FITNESS_PNG, csv_filename: str = METRICS_CSV):
        self.filename, self.csv_filename = filename, csv_filename
        self.info: RunInfo | None = None

    def start(self, info: RunInfo) -> None:
        self.info = info
        _import_pyplot()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        if self.info is not None:
            plot_fitness(self.info.run_dir / self.csv_filename, self.info.run_dir / self.filename,
                         self.info.title)


def wandb_mode(requested: str) -> str:
    """`auto` -> `online` with an API key configured, else `offline`."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


class WandbSink:
    """W&B logging into `RUN/wandb`; turns itself off with one warning on any failure.

    A resumed run continues the W&B run whose id the checkpoint's metadata holds (`wandb_id`).
    """

    META_KEY = "wandb_id"

    def __init__(self, mode: str = "auto", project: str = "popeval"):
        self.mode = wandb_mode(mode)
        self.project = project
        self.run = None

    def start(self, info: RunInfo) -> None:
        if self.mode == "disabled":
            return
        try:
            import wandb

            resume_id = info.meta.get(self.META_KEY)
            self.run = wandb.init(
                project=self.project, dir=str(info.run_dir), config=info.config, mode=self.mode,
                name=info.name, id=resume_id, resume="allow" if resume_id else None, reinit=True,
                settings=wandb.Settings(init_timeout=60),
            )
            info.meta[self.META_KEY] = self.run.id or resume_id
        except Exception as e:  # noqa: BLE001 - W&B must never stop a run
            log.warning("W&B disabled for this run (%s: %s)", type(e).__name__, e)
            self.run = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.run is None:
            return
        try:
            self.run.log({k: v for k, v in metrics.items() if v == v}, step=step)
        except Exception as e:  # noqa: BLE001
            log.warning("W&B logging failed, disabling it (%s: %s)", type(e).__name__, e)
            self.run = None

    def close(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as e:  # noqa: BLE001
            log.warning("W&B finish failed (%s: %s)", type(e).__name__, e)
        self.run = None


class ProgressSink:
    """A tqdm progress bar over generations with best / mean fitness and steps per second."""

    def __init__(self):
        self.bar = None

    def start(self, info: RunInfo) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=info.num_generations, initial=info.start_generation,
                        desc=info.config.get("env_name"), unit="gen")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.bar.set_postfix(best=f"{metrics['best/fitness']:.1f}", mean=f"{metrics['fitness/mean']:.1f}",
                             sps=f"{metrics['steps/per_second']:.2e}")
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
