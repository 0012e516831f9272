"""The sinks that write the run directory: `metrics.csv` and `fitness.png`."""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from .base import RunInfo

__all__ = ["CSVSink", "PlotSink", "CurveSink", "plot_fitness", "plot_curves", "read_metrics", "METRICS_CSV",
           "FITNESS_PNG", "CURVE_PNG", "FINAL_COLUMNS"]

log = logging.getLogger("popeval")

METRICS_CSV = "metrics.csv"
FITNESS_PNG = "fitness.png"
CURVE_PNG = "curve.png"


def read_metrics(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a `metrics.csv` (empty when it does not exist); bytes that are not UTF-8
    read as U+FFFD, so a damaged file is still read."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:  # a spreadsheet's BOM
        return list(csv.DictReader(f))


class CSVSink:
    """Appends one row per generation to `RUN/metrics.csv` (columns fixed by the first row).

    A resumed run repairs the file from the checkpoint's generation count
    (`RunInfo.start_generation`) when it writes its first row (or closes):

    - rows past the checkpoint are dropped (the resumed run writes them again);
    - damaged rows (missing or extra fields, no whole generation number, bytes that are not
      UTF-8) are dropped and named by line in one warning, the original file kept as
      `metrics.csv.damaged` (or `.damaged.1`, `.damaged.2`, ...: an earlier copy is never
      overwritten; every copy keeps the file's permissions); of a duplicated generation the
      last row is kept, with a warning;
    - an intact header is trusted when some row fits it, however many damaged lines there are;
      a damaged one is rebuilt from the names of the metrics logged, when rows fit them;
      otherwise nothing in the file can be placed, and it is moved aside (the checkpoint is
      intact, so the run goes on) with a warning;
    - a UTF-8 byte-order mark (a spreadsheet's) is removed, with a warning; a directory or
      other non-file in the file's place is moved aside, with a warning;
    - the final evaluation's columns (`FINAL_COLUMNS`) of the rows kept are cleared when the run
      continues past the generation that was its last.

    Rewrites go through a temporary file and a rename, appends through `O_NOFOLLOW`: no write
    follows a symbolic link out of the run directory.
    """

    def __init__(self, filename: str = METRICS_CSV):
        self.filename = filename
        self.path: Path | None = None
        self.columns: list[str] | None = None
        self._found: _FoundCSV | None = None

    def start(self, info: RunInfo) -> None:
        self.path = info.run_dir / self.filename
        self.columns, self._found = None, None
        if os.path.lexists(self.path) and _regular_or_moved_aside(self.path):  # resuming
            self._found = _FoundCSV(self.path, info.start_generation,
                                    continues=info.start_generation < info.num_generations)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.columns is None:
            self._open(list(metrics))
        out = io.StringIO()
        csv.DictWriter(out, fieldnames=self.columns, extrasaction="ignore").writerow(
            {k: metrics.get(k, "") for k in self.columns})
        _append(self.path, out.getvalue())

    def close(self) -> None:
        if self.columns is None and self._found is not None and self._found.usable_header():
            self._open(self._found.header)  # resumed, nothing logged: the file is still repaired

    def _open(self, names: list[str]) -> None:
        """Fixes the columns, and writes the header (with the repaired rows when resuming)."""
        found, self._found = self._found, None
        if found is None:
            self.columns = names
            _append(self.path, _csv_text([names]))
            return
        self.columns, rows, notes, damaged = found.repair(names)
        from popeval.checkpoint import atomic_write  # the sinks package stays free of JAX imports

        kept = f"; the original is kept in {_keep_copy(self.path, found.data).name}" if damaged else ""
        atomic_write(self.path, _csv_text([self.columns, *rows]).encode())
        if notes:
            log.warning("%s, resuming after generation %d: %s%s", self.path, found.start_generation,
                        "; ".join(notes), kept)


DAMAGED_SUFFIX = ".damaged"
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which spreadsheets write
#: The run's final evaluation (`result.json`'s returns), filled in its last row only.
FINAL_COLUMNS = ("eval/final_return", "eval/final_best_return")


def _damaged_names(path: Path):
    """`metrics.csv.damaged`, then `metrics.csv.damaged.1`, `.damaged.2`, ..."""
    yield path.with_name(path.name + DAMAGED_SUFFIX)
    n = 1
    while True:
        yield path.with_name(f"{path.name}{DAMAGED_SUFFIX}.{n}")
        n += 1


def _keep_copy(path: Path, data: bytes) -> Path:
    """Writes `data` to the first free `.damaged` name beside `path`, with `path`'s permission
    bits; never overwrites an earlier copy nor follows a link. Returns the copy's path."""
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    for copy in _damaged_names(path):
        try:
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)  # the umask may have narrowed os.open's mode
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            copy.unlink(missing_ok=True)
            e.filename = e.filename or str(copy)  # a full disk names no file
            raise
        return copy


def _regular_or_moved_aside(path: Path) -> bool:
    """True for a regular file or a link (refused later, by name); anything else (a directory,
    a pipe) is renamed to a free `.damaged` name, with a warning, and False returned."""
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return True
    copy = next(c for c in _damaged_names(path) if not os.path.lexists(c))
    os.rename(path, copy)
    log.warning("%s was not a file (a %s); it was moved aside to %s, and the file starts again",
                path, "directory" if stat.S_ISDIR(mode) else "special file", copy.name)
    return False


def _csv_text(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


def _append(path: Path, text: str) -> None:
    """Appends to `path` (created if absent) without following a symbolic link."""
    from popeval.checkpoint import open_append  # the sinks package stays free of JAX imports

    try:
        with open_append(path) as f:
            f.write(text)
    except OSError as e:
        e.filename = e.filename or str(path)  # a full disk fails in write or close, which name no file
        raise


def _fields(line: bytes) -> list[str] | None:
    """One CSV line's fields; None when it is not UTF-8 or not CSV (a stray carriage return)."""
    try:
        return next(csv.reader([line.decode("utf-8").removesuffix("\r")]), [])
    except (UnicodeDecodeError, csv.Error):
        return None


def _whole_generation(text: str) -> int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() and value >= 1 else None


def _damage(fields: list[str] | None, width: int, at: int) -> str | None:
    """What is wrong with a row (None: nothing); its generation is column `at`."""
    if fields is None:
        return "not UTF-8 CSV text"
    if len(fields) != width:
        return f"{len(fields)} fields, not {width}"
    if _whole_generation(fields[at]) is None:
        return f"generation {fields[at][:20]!r}"
    return None


class _FoundCSV:
    """A `metrics.csv` a resumed run found: read at `start`, repaired by `repair` once the
    names of the metrics are known."""

    def __init__(self, path: Path, start_generation: int, continues: bool = True):
        if path.is_symlink():
            raise ValueError(f"{path}: a symbolic link; popeval writes no file through a link "
                             "(move it away to resume the run)")
        self.path, self.start_generation, self.continues = path, start_generation, continues
        self.data = path.read_bytes()
        self.bom = self.data.startswith(BOM)
        lines = self.data.removeprefix(BOM).split(b"\n")
        self.header = _fields(lines[0]) if lines[0].strip() else None
        self.rows = [(n, _fields(line)) for n, line in enumerate(lines[1:], start=2) if line.strip()]
        widths = Counter(len(f) for _, f in self.rows if f is not None)
        self.width = widths.most_common(1)[0][0] if widths else None  # the rows' usual field count

    def _fit(self, columns: list[str] | None) -> int:
        """How many rows fit `columns`: as many fields, and a whole generation number in the
        `generation` column."""
        if not columns or "generation" not in columns:
            return 0
        at = columns.index("generation")
        return sum(1 for _, f in self.rows if not _damage(f, len(columns), at))

    def _named_header(self) -> bool:
        """Names, none empty or repeated, including `generation`."""
        h = self.header
        return h is not None and all(h) and len(set(h)) == len(h) and "generation" in h

    def usable_header(self) -> bool:
        """A header of names that some row fits (or no rows at all): trusted over any number
        of damaged lines, whatever their usual width."""
        return self._named_header() and (self.width is None or self._fit(self.header) > 0)

    def repair(self, names: list[str]) -> tuple[list[str], list[list[str]], list[str], bool]:
        """`(columns, rows kept, what was repaired, whether damaged lines were dropped)` for a
        run whose metrics are `names`."""
        if not self.data.removeprefix(BOM).strip():  # created, then killed before its first write
            return names, [], self._bom_note(), False
        if self.usable_header() or (self._named_header() and not self._fit(names)):
            columns, width, notes = self.header + [n for n in names if n not in self.header], len(self.header), []
        elif self.width is None:  # no rows to place
            return names, [], ["its damaged header was rebuilt from the metrics' names"], False
        elif self._fit(names):
            columns, width, notes = list(names), len(names), ["its damaged header was rebuilt from the metrics' names"]
        else:
            return names, [], [f"could not be repaired (a damaged header, and rows of {self.width} fields where "
                                f"this run logs {len(names)} metrics); it starts again at generation "
                                f"{self.start_generation + 1}"], True
        notes = self._bom_note() + notes
        rows, damaged, duplicated = self._rows(columns, width)
        if damaged:
            notes.append(f"dropped damaged line{'s' if len(damaged) > 1 else ''} {', '.join(damaged)}")
        if duplicated:
            notes.append(f"kept the last row of duplicated generation(s) {', '.join(map(str, duplicated))}")
        return columns, rows, notes, bool(damaged)

    def _bom_note(self) -> list[str]:
        return ["removed a UTF-8 byte-order mark from its start (saved by a spreadsheet?)"] if self.bom else []

    def _rows(self, columns: list[str], width: int) -> tuple[list[list[str]], list[str], list[int]]:
        """The intact rows of `width` fields up to the checkpoint in generation order (the last
        one of each generation, padded to `columns`), the damaged lines (number and why) and the
        generations that were duplicated."""
        at = columns.index("generation")
        finals = [i for i, c in enumerate(columns) if c in FINAL_COLUMNS]
        kept: dict[int, list[str]] = {}
        damaged, duplicated = [], []
        for n, fields in self.rows:
            why = _damage(fields, width, at)
            if why:
                damaged.append(f"{n} ({why})")
                continue
            generation = _whole_generation(fields[at])
            if generation <= self.start_generation:
                if generation in kept:
                    duplicated.append(generation)
                kept[generation] = fields + [""] * (len(columns) - width)
        for fields in kept.values() if self.continues else ():
            for i in finals:
                fields[i] = "nan"
        return [kept[g] for g in sorted(kept)], damaged, sorted(set(duplicated))


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


def _save(fig, path: str | os.PathLike) -> None:
    """Writes `fig` through a temporary file and a rename (never through a symbolic link)."""
    from popeval.checkpoint import atomic_write

    out = io.BytesIO()
    fig.savefig(out, format=Path(path).suffix.lstrip(".").lower() or "png", dpi=100)
    atomic_write(Path(path), out.getvalue())


def _number(text: str | None) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


#: The evaluations `plot_fitness` draws as points: column, label, matplotlib format, marker size.
_EVALUATIONS = (("eval/return", "eval: mean policy", "o-", 3), ("eval/best_return", "eval: best policy", "s:", 3),
                ("eval/final_return", "final evaluation: mean policy", "*", 12),
                ("eval/final_best_return", "final evaluation: best policy", "X", 8))


def plot_fitness(csv_path: str | os.PathLike, png_path: str | os.PathLike, title: str = "",
                 target: float | None = None) -> tuple[float, float] | None:
    """Draws the population's fitness (min-max band, mean), the best so far, the evaluations
    of the mean and best policy (the run's final evaluation as large points) and the target per
    generation into a PNG; returns its y-range (None without rows)."""
    rows = [r for r in read_metrics(csv_path) if _intact(r)]
    if not rows:
        return None
    plt = _import_pyplot()
    gen = [float(r["generation"]) for r in rows]
    col = lambda k: [_number(r.get(k)) for r in rows]  # noqa: E731
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.fill_between(gen, col("fitness/min"), col("fitness/max"), alpha=0.2, label="population min-max")
    ax.plot(gen, col("fitness/mean"), label="population mean")
    ax.plot(gen, col("best/fitness"), label="best member so far", linestyle="--")
    for key, label, style, size in _EVALUATIONS:
        points = [(g, v) for g, v in zip(gen, col(key)) if not math.isnan(v)]
        if points:
            ax.plot(*zip(*points), style, markersize=size, label=label)
    if target is not None:
        ax.axhline(target, color="black", linewidth=0.8, linestyle="-.", label=f"target {target:g}")
    # The y-range covers the curves and the target; the min-max band is clipped to it, so one
    # diverging member's return does not squash the generations that matter.
    shown = [v for k in ("fitness/mean", "best/fitness", *(e[0] for e in _EVALUATIONS)) for v in col(k)
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
    _save(fig, png_path)
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
    num = lambda r, k: _number(r.get(k))  # noqa: E731
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
    _save(fig, png_path)
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
