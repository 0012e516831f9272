"""Logging sinks: a local CSV + PNG that always work, and Weights & Biases.

Library code returns flat metric dicts with `/`-namespaced keys; only this module imports
wandb or matplotlib. W&B runs offline automatically when no API key is configured, and any
W&B failure logs one warning and is then ignored: it never stops a run.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["CSVSink", "WandbSink", "plot_fitness", "preload_plotting", "wandb_mode"]

log = logging.getLogger("popeval")


class CSVSink:
    """Appends one row per generation to `metrics.csv` (columns fixed by the first row)."""

    def __init__(self, path: str | os.PathLike, keep_until: int | None = None):
        self.path = Path(path)
        self.columns: list[str] | None = None
        if self.path.exists():
            with open(self.path, newline="") as f:
                rows = list(csv.DictReader(f))
            if rows:
                self.columns = list(rows[0].keys())
            if keep_until is not None:
                # Resuming: drop rows written after the checkpoint we restart from.
                rows = [r for r in rows if int(float(r["generation"])) <= keep_until]
                self._write_all(rows)

    def _write_all(self, rows: list[dict]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            if self.columns:
                w = csv.DictWriter(f, fieldnames=self.columns)
                w.writeheader()
                w.writerows(rows)
        os.replace(tmp, self.path)

    def log(self, metrics: dict[str, Any]) -> None:
        new = self.columns is None
        if new:
            self.columns = list(metrics)
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow({k: metrics.get(k, "") for k in self.columns})

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))


def preload_plotting() -> None:
    """Imports matplotlib (Agg) ahead of `plot_fitness` (about a second), e.g. on a thread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401


def plot_fitness(csv_path: str | os.PathLike, png_path: str | os.PathLike, title: str = "") -> None:
    """Draws max / mean / min fitness (and eval return) per generation into a PNG."""
    preload_plotting()
    import matplotlib.pyplot as plt

    rows = CSVSink(csv_path).rows()
    if not rows:
        return
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
    """W&B logging; turns itself off with one warning on any failure."""

    def __init__(self, mode: str, project: str, run_dir: str | os.PathLike, config: dict, name: str | None = None,
                 resume_id: str | None = None):
        self.run = None
        self.mode = wandb_mode(mode)
        if self.mode == "disabled":
            return
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.run = wandb.init(
                project=project, dir=str(run_dir), config=config, mode=self.mode, name=name,
                id=resume_id, resume="allow" if resume_id else None, reinit=True,
                settings=wandb.Settings(init_timeout=60),
            )
        except Exception as e:  # noqa: BLE001 - W&B must never stop a run
            log.warning("W&B disabled for this run (%s: %s)", type(e).__name__, e)
            self.run = None

    @property
    def run_id(self) -> str | None:
        return getattr(self.run, "id", None)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log({k: v for k, v in metrics.items() if v == v}, step=step)
        except Exception as e:  # noqa: BLE001
            log.warning("W&B logging failed, disabling it (%s: %s)", type(e).__name__, e)
            self.run = None

    def finish(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as e:  # noqa: BLE001
            log.warning("W&B finish failed (%s: %s)", type(e).__name__, e)
        self.run = None
