"""The sinks that write the run directory: `metrics.csv` and `fitness.png`."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

from .base import RunInfo

__all__ = ["CSVSink", "PlotSink", "CurveSink", "plot_fitness", "plot_curves", "read_metrics", "METRICS_CSV",
           "FITNESS_PNG", "CURVE_PNG"]

METRICS_CSV = "metrics.csv"
FITNESS_PNG = "fitness.png"
CURVE_PNG = "curve.png"


def read_metrics(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a `metrics.csv` (empty when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class CSVSink:
    """Appends one row per generation to `RUN/metrics.csv` (columns fixed by the first row).

    A resumed run first rewrites the file with the rows up to the checkpoint it restarts from,
    dropping later rows and any damaged row (a partial last line left by a full disk or a kill).
    """

    def __init__(self, filename: str = METRICS_CSV):
        self.filename = filename
        self.path: Path | None = None
        self.columns: list[str] | None = None

    def start(self, info: RunInfo) -> None:
        self.path = info.run_dir / self.filename
        if not self.path.exists():
            return
        with open(self.path, newline="") as f:  # resuming
            reader = csv.DictReader(f)
            self.columns = list(reader.fieldnames or []) or None
            rows = [r for r in reader if _intact(r) and _generation(r) <= info.start_generation]
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


def _generation(row: dict) -> float:
    try:
        return float(row.get("generation") or "nan")
    except ValueError:
        return math.nan


def _intact(row: dict) -> bool:
    """A complete row: every column present, and a generation number."""
    return None not in row and None not in row.values() and not math.isnan(_generation(row))


def _import_pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fitness(csv_path: str | os.PathLike, png_path: str | os.PathLike, title: str = "",
                 target: float | None = None) -> tuple[float, float] | None:
    """Draws the population's fitness (min-max band, mean), the best so far, the evaluations
    of the mean and best policy and the target per generation into a PNG; returns its y-range
    (None without rows)."""
    rows = [r for r in read_metrics(csv_path) if _intact(r)]
    if not rows:
        return None
    plt = _import_pyplot()
    gen = [float(r["generation"]) for r in rows]
    col = lambda k: [float(r[k]) if r.get(k, "") not in ("", "nan") else math.nan for r in rows]  # noqa: E731
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.fill_between(gen, col("fitness/min"), col("fitness/max"), alpha=0.2, label="population min-max")
    ax.plot(gen, col("fitness/mean"), label="population mean")
    ax.plot(gen, col("best/fitness"), label="best member so far", linestyle="--")
    evaluations = (("eval/return", "eval: mean policy", "o-"), ("eval/best_return", "eval: best policy", "s:"))
    for key, label, style in evaluations:
        points = [(g, v) for g, v in zip(gen, col(key)) if not math.isnan(v)]
        if points:
            ax.plot(*zip(*points), style, markersize=3, label=label)
    if target is not None:
        ax.axhline(target, color="black", linewidth=0.8, linestyle="-.", label=f"target {target:g}")
    # The y-range covers the curves and the target; the min-max band is clipped to it, so one
    # diverging member's return does not squash the generations that matter.
    shown = [v for k in ("fitness/mean", "best/fitness", "eval/return", "eval/best_return") for v in col(k)
             if math.isfinite(v)] + ([target] if target is not None else [])
    if shown:
        low, high = min(shown), max(shown)
        pad = 0.05 * (high - low) or 1.0
        ax.set_ylim(low - pad, high + pad)
    ax.set_xlabel("generation")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    limits = ax.get_ylim()
    plt.close(fig)
    return limits


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
                         self.info.title, self.info.target)


def plot_curves(csv_path: str | os.PathLike, png_path: str | os.PathLike, x: str, ys: tuple[str, ...],
                title: str = "", target: float | None = None) -> bool:
    """Draws the columns `ys` of a `metrics.csv` against its column `x` into a PNG (a training
    curve of an RL agent); returns whether there was anything to draw."""
    rows = read_metrics(csv_path)
    num = lambda r, k: float(r[k]) if r.get(k) not in (None, "", "nan") else math.nan  # noqa: E731
    rows = [r for r in rows if None not in r.values() and math.isfinite(num(r, x))]
    if not rows:
        return False
    plt = _import_pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for key in ys:
        points = [(num(r, x), num(r, key)) for r in rows if math.isfinite(num(r, key))]
        if points:
            ax.plot(*zip(*points), label=key)
    if target is not None:
        ax.axhline(target, color="black", linewidth=0.8, linestyle="-.", label=f"target {target:g}")
    ax.set_xlabel(x)
    ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return True


class CurveSink:
    """Draws `RUN/curve.png` (columns `ys` against `x` of `RUN/metrics.csv`) when the run closes."""

    def __init__(self, x: str, ys: tuple[str, ...], filename: str = CURVE_PNG, csv_filename: str = METRICS_CSV):
        self.x, self.ys, self.filename, self.csv_filename = x, tuple(ys), filename, csv_filename
        self.info: RunInfo | None = None

    def start(self, info: RunInfo) -> None:
        self.info = info

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        if self.info is not None:
            plot_curves(self.info.run_dir / self.csv_filename, self.info.run_dir / self.filename, self.x, self.ys,
                        self.info.title, self.info.target)
