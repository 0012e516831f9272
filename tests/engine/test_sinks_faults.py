"""The sinks and the shutdown under faults: `metrics.csv` repaired on resume (damaged header,
rows, bytes, duplicates; never a write through a link), W&B's bounded close and its offline
fallback, Ctrl-C during compilation and twice, the final evaluation's row, the CLI's noise.

Sink-level tests need no JAX; the evolve tests are tiny CartPole runs (issue 49 rows 4-9,
issue 50)."""

from __future__ import annotations

import importlib
import json
import logging
import math
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from popeval import cli, distributed
from popeval.sinks import FINAL_COLUMNS, CSVSink, LogSink, RunInfo, WandbSink, plot_fitness, read_metrics
from popeval.sinks import weights_and_biases as wandb_sink
from popeval.strategies import EvolveConfig, RunOptions, evolve
from popeval.strategies.run.evolve import RunInterrupted

TINY = dict(
    env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 50}, pop_size=8, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
)
NAMES = ["best/fitness", "fitness/mean", "generation", "eval/return", *FINAL_COLUMNS, "time/elapsed"]


def row(generation: int, final: float = math.nan) -> dict:
    return {"best/fitness": 2.0 * generation, "fitness/mean": float(generation), "generation": generation,
            "eval/return": math.nan, FINAL_COLUMNS[0]: final, FINAL_COLUMNS[1]: final,
            "time/elapsed": 0.5 * generation}


def info(run_dir: Path, start_generation: int) -> RunInfo:
    return RunInfo(run_dir, "run", "t", {}, start_generation, 10, {})


def written(run_dir: Path, generations: int) -> bytes:
    """`metrics.csv` of `generations` rows as CSVSink writes it, the last one final."""
    sink = CSVSink()
    sink.start(info(run_dir, 0))
    for g in range(1, generations + 1):
        sink.log(g, row(g, 7.0 if g == generations else math.nan))
    sink.close()
    return (run_dir / "metrics.csv").read_bytes()


def resume(run_dir: Path, start_generation: int, caplog, log_next: bool = True) -> list[str]:
    """A resumed CSVSink: started at `start_generation`, logging the next generation; returns the
    warnings it gave."""
    caplog.clear()
    sink = CSVSink()
    with caplog.at_level(logging.WARNING, logger="popeval"):
        sink.start(info(run_dir, start_generation))
        if log_next:
            sink.log(start_generation + 1, row(start_generation + 1))
        sink.close()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def generations(run_dir: Path) -> list[int]:
    return [int(r["generation"]) for r in read_metrics(run_dir / "metrics.csv")]


# ------------------------------------------------------------------ metrics.csv on resume
@pytest.mark.parametrize("header", [b"best/fitness,fitness/mean,fit", b"x,y,z", b"\xff\xfe\xfd"])
def test_a_damaged_header_is_rebuilt_from_the_metric_names(tmp_path, caplog, header):
    """Issue 49 row 4: a header cut short or garbage (and row 5: not UTF-8), alone or above
    intact rows."""
    (tmp_path / "metrics.csv").write_bytes(header)
    warnings = resume(tmp_path, 0, caplog)
    assert len(warnings) == 1 and "metrics.csv" in warnings[0] and "header was rebuilt" in warnings[0], warnings
    rows = read_metrics(tmp_path / "metrics.csv")
    assert list(rows[0]) == NAMES and generations(tmp_path) == [1]
    (tmp_path / "w").mkdir()
    rows = written(tmp_path / "w", 3).split(b"\r\n", 1)[1]
    (tmp_path / "metrics.csv").write_bytes(header + b"\r\n" + rows)
    warnings = resume(tmp_path, 2, caplog)
    assert len(warnings) == 1 and "header was rebuilt" in warnings[0]
    assert generations(tmp_path) == [1, 2, 3] and read_metrics(tmp_path / "metrics.csv")[0]["best/fitness"] == "2.0"


def test_damaged_and_duplicated_rows_are_reported_by_line_and_kept_aside(tmp_path, caplog):
    """Issue 49 rows 5-6: extra and missing fields, a replaced generation, bytes that are not
    UTF-8 (middle and last line), a duplicated row; rows past the checkpoint are dropped."""
    lines = written(tmp_path, 8).split(b"\r\n")  # line i + 1 holds generation i
    lines[2] += b",1.0"  # generation 2: an extra field (line 3)
    lines[3] = lines[3][:5]  # generation 3: cut short (line 4)
    lines[4] = lines[4].replace(b",4,", b",four,")  # generation 4: no generation number (line 5)
    lines[5] = b"\xff" + lines[5]  # generation 5: not UTF-8 (line 6)
    lines.insert(7, lines[6])  # generation 6 twice (lines 7 and 8)
    lines[-1] = b"9.0,\xfe"  # a partial last line, not UTF-8 either (line 11)
    original = b"\r\n".join(lines)
    (tmp_path / "metrics.csv").write_bytes(original)
    warnings = resume(tmp_path, 7, caplog)
    assert len(warnings) == 1, warnings
    assert "lines 3 (8 fields, not 7), 4 (2 fields, not 7), 5 (generation 'four'), 6 (not UTF-8 CSV text), " \
           "11 (not UTF-8 CSV text)" in warnings[0], warnings
    assert "duplicated generation(s) 6" in warnings[0] and "metrics.csv.damaged" in warnings[0]
    assert generations(tmp_path) == [1, 6, 7, 8]  # 8 is the resumed run's own row
    assert (tmp_path / "metrics.csv.damaged").read_bytes() == original


def test_a_csv_that_cannot_be_repaired_is_moved_aside(tmp_path, caplog):
    (tmp_path / "metrics.csv").write_bytes(b"x,y\n1,2\n3,4\n")
    warnings = resume(tmp_path, 2, caplog)
    assert len(warnings) == 1 and "could not be repaired" in warnings[0] and "metrics.csv.damaged" in warnings[0]
    assert (tmp_path / "metrics.csv.damaged").read_bytes() == b"x,y\n1,2\n3,4\n"
    assert generations(tmp_path) == [3]


def test_an_intact_header_outvotes_junk_lines(tmp_path, caplog):
    """Issue 61 N4 (a): ten one-field junk lines among eight intact rows; the header and the rows
    up to the checkpoint are kept, and only the junk lines are named."""
    lines = written(tmp_path, 8).split(b"\r\n")
    (tmp_path / "metrics.csv").write_bytes(b"\r\n".join(lines[:5] + [b"junk"] * 10 + lines[5:]))
    warnings = resume(tmp_path, 7, caplog)
    assert len(warnings) == 1 and "damaged header" not in warnings[0], warnings
    assert "dropped damaged lines 6 (1 fields, not 7), 7 (1 fields" in warnings[0], warnings
    assert generations(tmp_path) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_damaged_copies_are_numbered_and_keep_the_permissions(tmp_path, caplog):
    """Issue 61 N4 (b), N5: a second repair keeps the first original; every copy is 0600 like
    the file it repaired."""
    originals = []
    for damage in (b"\r\nfirst", b"\r\nsecond", b"\r\nthird"):
        data = written(tmp_path, 2) + damage
        (tmp_path / "metrics.csv").write_bytes(data)
        (tmp_path / "metrics.csv").chmod(0o600)
        originals.append(data)
        warnings = resume(tmp_path, 2, caplog)
        assert len(warnings) == 1, warnings
        (tmp_path / "metrics.csv").unlink()
    copies = ["metrics.csv.damaged", "metrics.csv.damaged.1", "metrics.csv.damaged.2"]
    assert warnings[0].endswith("the original is kept in metrics.csv.damaged.2")
    assert [(tmp_path / c).read_bytes() for c in copies] == originals
    assert all((tmp_path / c).stat().st_mode & 0o777 == 0o600 for c in copies)
    written(tmp_path, 2)
    (tmp_path / "metrics.csv").chmod(0o600)
    resume(tmp_path, 2, caplog)  # the repaired file itself, too
    assert (tmp_path / "metrics.csv").stat().st_mode & 0o777 == 0o600


def test_a_byte_order_mark_is_removed_with_a_warning(tmp_path, caplog):
    """Issue 61 N4 (c): a spreadsheet's UTF-8 BOM; no column `\\ufeffbest/fitness`."""
    data = written(tmp_path, 3)
    (tmp_path / "metrics.csv").write_bytes(b"\xef\xbb\xbf" + data)
    assert list(read_metrics(tmp_path / "metrics.csv")[0])[0] == "best/fitness"
    warnings = resume(tmp_path, 3, caplog)
    assert len(warnings) == 1 and "byte-order mark" in warnings[0], warnings
    assert (tmp_path / "metrics.csv").read_bytes().startswith(b"best/fitness,")
    assert list(read_metrics(tmp_path / "metrics.csv")[0]) == NAMES and generations(tmp_path) == [1, 2, 3, 4]


def test_a_directory_in_the_place_of_metrics_csv_is_moved_aside(tmp_path, caplog):
    """Issue 61 N4 (d): the resume goes on, a new file is written, the directory is kept."""
    (tmp_path / "metrics.csv.damaged").write_text("an earlier copy")
    (tmp_path / "metrics.csv").mkdir()
    (tmp_path / "metrics.csv" / "inside").write_text("kept")
    warnings = resume(tmp_path, 3, caplog)
    assert len(warnings) == 1 and "not a file (a directory)" in warnings[0] and "metrics.csv.damaged.1" in warnings[0]
    assert (tmp_path / "metrics.csv.damaged.1" / "inside").read_text() == "kept"
    assert (tmp_path / "metrics.csv.damaged").read_text() == "an earlier copy"
    assert generations(tmp_path) == [4]


def test_a_resumed_csv_drops_the_former_final_evaluation_and_gains_new_columns(tmp_path, caplog):
    """An extended run: the row that was the last loses its final evaluation (an uninterrupted
    run has none there); a file of an older version gains the columns it lacked."""
    written(tmp_path, 4)
    assert read_metrics(tmp_path / "metrics.csv")[3][FINAL_COLUMNS[0]] == "7.0"
    assert resume(tmp_path, 4, caplog) == []
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r[FINAL_COLUMNS[0]] for r in rows] == ["nan"] * 5
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.csv").write_text("generation,fitness/mean\r\n1,1.0\r\n")
    assert resume(old, 1, caplog) == []
    rows = read_metrics(old / "metrics.csv")
    assert list(rows[0]) == ["generation", "fitness/mean", *[n for n in NAMES if n not in ("generation",
                                                                                           "fitness/mean")]]
    assert generations(old) == [1, 2] and rows[0]["best/fitness"] == "" and rows[1]["best/fitness"] == "4.0"


def test_a_resumed_run_that_logs_nothing_still_repairs_its_csv(tmp_path, caplog):
    written(tmp_path, 5)
    assert resume(tmp_path, 3, caplog, log_next=False) == []
    assert generations(tmp_path) == [1, 2, 3]


def test_metrics_csv_is_never_written_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").symlink_to(victim)
    with pytest.raises(ValueError, match="metrics.csv: a symbolic link"):
        CSVSink().start(info(run_dir, 2))
    (run_dir / "metrics.csv").unlink()
    sink = CSVSink()
    sink.start(info(run_dir, 0))  # a new file, then a link planted before the first row
    (run_dir / "metrics.csv").symlink_to(victim)
    with pytest.raises(OSError):
        sink.log(1, row(1))
    (run_dir / "metrics.csv").unlink()
    written(run_dir, 3)
    (run_dir / "metrics.csv.tmp").symlink_to(victim)  # the rewrite's temporary
    sink = CSVSink()
    sink.start(info(run_dir, 2))
    sink.log(3, row(3))
    assert victim.read_text() == "mine" and generations(run_dir) == [1, 2, 3]


def test_a_damaged_csv_is_still_read_and_drawn(tmp_path):
    data = written(tmp_path, 4).replace(b",3,", b",\xff,")
    (tmp_path / "metrics.csv").write_bytes(data)
    assert len(read_metrics(tmp_path / "metrics.csv")) == 4  # no UnicodeDecodeError
    assert plot_fitness(tmp_path / "metrics.csv", tmp_path / "fitness.png") is not None


# ------------------------------------------------------------------ W&B
def fake_wandb(hang: threading.Event | None = None) -> types.ModuleType:
    """A `wandb` module without a service: runs record their calls; `finish` blocks until `hang`
    is set, when given. Online without an API key it fails as W&B does."""
    module = types.ModuleType("wandb")
    module.calls, module.finishing = [], threading.Event()

    class Run:
        def log(self, values, step):
            module.calls.append(("log", step))

        def finish(self):
            module.finishing.set()
            if hang is not None:
                hang.wait(120)
            module.calls.append(("finish",))

    def init(mode, **kwargs):
        module.calls.append(("init", mode))
        run = Run()
        run.sync_dir = str(Path(kwargs["dir"]) / "wandb" / f"offline-run-20260101_000000-{kwargs['id']}")
        return run

    module.init, module.Settings = init, dict
    return module


def test_wandb_close_waits_a_bounded_configurable_time(tmp_path, monkeypatch, caplog):
    """Issue 49 row 8: W&B's close waited 60 s for a silent server."""
    monkeypatch.delenv("POPEVAL_WANDB_CLOSE_TIMEOUT", raising=False)
    assert wandb_sink.CLOSE_TIMEOUT <= 5 and WandbSink("offline").close_timeout == wandb_sink.CLOSE_TIMEOUT
    hang = threading.Event()
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(hang))
    monkeypatch.setenv("POPEVAL_WANDB_CLOSE_TIMEOUT", "0.2")
    sink = WandbSink("offline")
    try:
        with caplog.at_level(logging.WARNING, logger="popeval"):
            sink.start(info(tmp_path, 0))
            sink.log(1, {"fitness/mean": 1.0})
            sink.close()
        assert sys.modules["wandb"].finishing.wait(30) and ("finish",) not in sys.modules["wandb"].calls
        assert any("did not finish within 0.2 s" in r.getMessage() for r in caplog.records)
        assert wandb_sink.gave_up.is_set()  # so the command's exit does not wait for W&B's service either
        cli._teardown_wandb()  # returns at once
        wandb_sink.gave_up.clear()
        sys.modules["wandb"].teardown = lambda: hang.wait(120)  # a service that never stops
        cli._teardown_wandb()  # returns after 0.2 s
    finally:
        wandb_sink.gave_up.clear()
        hang.set()
    monkeypatch.setenv("POPEVAL_WANDB_CLOSE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="POPEVAL_WANDB_CLOSE_TIMEOUT must be a number of seconds >= 0, got 'soon'"):
        WandbSink("offline")


def test_wandb_refuses_a_link_in_the_place_of_its_directory(tmp_path, monkeypatch):
    """Issue 61 N8: `ln -s /elsewhere RUN/wandb` made W&B write its files in /elsewhere."""
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").symlink_to(elsewhere)
    sink = WandbSink("offline")
    with pytest.raises(ValueError, match=r"run/wandb: a symbolic link; W&B would write its files where it points"):
        sink.start(info(run_dir, 2))
    assert sys.modules["wandb"].calls == [] and list(elsewhere.iterdir()) == []
    sink.close()  # nothing was started


def test_wandb_online_without_an_api_key_logs_offline_and_says_how_to_sync(tmp_path, monkeypatch, caplog):
    """Issue 50: `--wandb online` without a key wrote nothing and said so only at the end."""
    import wandb  # the real one: its own error for a missing key

    for var in ("WANDB_API_KEY", "NETRC", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("POPEVAL_WANDB_CLOSE_TIMEOUT", "120")  # a loaded machine: let W&B finish
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sink = WandbSink("online")
    with caplog.at_level(logging.WARNING, logger="popeval"):
        sink.start(info(run_dir, 0))
        sink.log(1, {"fitness/mean": 1.0})
        sink.close()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("popeval")]  # not W&B's own logger
    assert len(messages) == 1 and "no API key" in messages[0], messages
    [offline] = (run_dir / "wandb").glob("offline-run-*")
    assert f"logs offline to {offline}; upload it later with `wandb sync {offline}`" in messages[0]
    assert f"{run_dir / 'metrics.csv'} holds the same metrics" in messages[0]
    assert sink.mode == "offline" and list(offline.glob("run-*.wandb"))
    assert wandb.run is None  # finished


@pytest.mark.parametrize("mode", ["auto", "offline", "online", "disabled"])
def test_an_offline_wandb_run_says_where_its_files_are_and_how_to_upload_them(tmp_path, monkeypatch, caplog, mode):
    """A new user's issue: `--wandb offline` and the default without an API key wrote
    RUN/wandb/offline-run-* without a word; only the no-key fallback said where."""
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb())
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: auto is offline
    sink, run = WandbSink(mode), info(tmp_path, 0)
    with caplog.at_level(logging.INFO, logger="popeval"):
        sink.start(run)
        sink.close()
    said = [r for r in caplog.records if "W&B" in r.getMessage()]
    if mode in ("online", "disabled"):
        assert not said
        return
    offline = tmp_path / "wandb" / f"offline-run-20260101_000000-{run.meta['wandb_id']}"
    assert [(r.levelno, r.getMessage()) for r in said] == [
        (logging.INFO, f"W&B: this run logs offline to {offline}; upload it later with `wandb sync {offline}`; "
                       f"{tmp_path / 'metrics.csv'} holds the same metrics")]


# ------------------------------------------------------------------ Ctrl-C and the final evaluation
@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A tiny run with the default sinks (W&B off)."""
    run_dir = tmp_path_factory.mktemp("sinks") / "run"
    summary = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 3}),
                     RunOptions(run_dir=str(run_dir), wandb="disabled", progress=False))
    return run_dir, summary


@pytest.mark.xdist_group("sinks-finished-run")
def test_the_final_evaluation_is_the_last_row_of_metrics_csv(finished_run):
    """Issue 50: result.json's returns were in neither metrics.csv nor fitness.png."""
    run_dir, summary = finished_run
    rows = read_metrics(run_dir / "metrics.csv")
    assert [r[FINAL_COLUMNS[0]] for r in rows[:-1]] == ["nan", "nan"]
    assert float(rows[-1][FINAL_COLUMNS[0]]) == summary["mean_policy_return"]
    assert float(rows[-1][FINAL_COLUMNS[1]]) == summary["best_policy_return"]
    low, high = plot_fitness(run_dir / "metrics.csv", run_dir / "fitness.png")
    assert low <= summary["mean_policy_return"] <= high and (run_dir / "fitness.png").stat().st_size > 0


def test_ctrl_c_while_compiling_and_with_wandb_hung_does_not_wait_for_either(tmp_path, monkeypatch):
    """Issue 49 rows 8-9: Ctrl-C while the generation program compiles (here: a compilation
    that never ends) and W&B's finish hangs; `evolve` raises at once, saving nothing."""
    evolve_module = importlib.import_module("popeval.strategies.run.evolve")
    release, hang, compiled = threading.Event(), threading.Event(), threading.Event()

    class NeverCompiles:
        def __init__(self, step):
            self._step = step

        def __getattr__(self, name):
            return getattr(self._step, name)

        def compile(self, lowered):
            # Ctrl-C reaches a process on any of its threads: here, the compiling one.
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            release.wait(60)
            compiled.set()
            raise RuntimeError("the test abandoned this compilation")

    real = evolve_module.generation_step
    monkeypatch.setattr(evolve_module, "generation_step", lambda *a: NeverCompiles(real(*a)))
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(hang))
    monkeypatch.setenv("POPEVAL_WANDB_CLOSE_TIMEOUT", "0.2")
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist's workers ignore SIGINT
    try:
        with pytest.raises(RunInterrupted, match=r"before the first generation \(nothing to save\); resume with"):
            evolve(EvolveConfig.from_flat(**TINY),
                   RunOptions(run_dir=str(tmp_path / "run"), wandb="online", progress=False))
        assert not compiled.is_set() and ("finish",) not in sys.modules["wandb"].calls  # neither was waited for
    finally:
        signal.signal(signal.SIGINT, handler)
        release.set()
        hang.set()
    assert not (tmp_path / "run" / "checkpoint.msgpack").exists()


# ------------------------------------------------------------------ the command line
def test_ctrl_c_anywhere_in_the_cli_is_one_line(monkeypatch, capsys):
    """Issue 49 row 9: a second Ctrl-C printed an empty 'popeval evolve: '; Ctrl-C while JAX
    was imported printed a traceback."""
    def interrupted(args, extra):
        raise KeyboardInterrupt

    def twice(args, extra):
        try:
            raise RunInterrupted(Path("runs/x"), 4)
        finally:
            raise KeyboardInterrupt  # a second Ctrl-C while the run was stopping

    for command, expected in [(interrupted, "popeval list-envs: interrupted"),
                              (twice, "popeval list-envs: interrupted again while stopping, so it stopped at "
                                      "once; runs/x keeps its last complete checkpoint; resume with popeval "
                                      "evolve --resume runs/x")]:
        monkeypatch.setitem(cli._COMMANDS, "list-envs", command)
        assert cli.main(["list-envs"]) == 130
        assert capsys.readouterr().err.strip() == expected
    monkeypatch.setattr(cli, "_parser", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))  # while importing
    assert cli.main(["evolve", "--config", "x.yaml"]) == 130
    assert capsys.readouterr().err.strip() == "popeval evolve: interrupted"
    # The command's module imports no JAX, so Ctrl-C reaches `main` from the start.
    code = "import sys, popeval.cli, popeval.__main__; assert 'jax' not in sys.modules, 'jax imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_an_error_without_a_message_is_still_a_line():
    assert cli._one_line(RuntimeError()) == "RuntimeError, without a message (--debug shows the traceback)"
    assert cli._one_line(ValueError("")).startswith("ValueError, without a message")
    assert cli._one_line(MemoryError()) == ("out of memory; try a smaller pop_size or num_rollouts, or a smaller "
                                            "policy (hidden_sizes, conv_channels)")


def test_the_cli_silences_library_info_lines(capsys):
    """Issue 50: matplotlib's "generated new fontManager" and JAX's backend INFO lines."""
    loggers = [logging.getLogger(name) for name in ("matplotlib.font_manager", "jax._src.xla_bridge")]
    levels = {name: logging.getLogger(name).level for name in cli._QUIET_LOGGERS}
    try:
        assert cli.main(["list-envs"]) == 0
        for logger in loggers:
            assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    capsys.readouterr()


def test_without_a_terminal_a_compiling_line_comes_first(caplog):
    """Issue 50: nothing between the header and generation 1 looked like a hang."""
    sink = LogSink(every_seconds=3600)
    with caplog.at_level(logging.INFO, logger="popeval"):
        sink.start(RunInfo(None, "r", "t", {}, 2, 5, {}))
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["compiling generation 3/5"]


def test_the_heartbeat_is_checked_and_passed_to_jax(monkeypatch):
    """Issue 49 row 7: a stopped process is declared dead after `distributed_heartbeat` s."""
    with pytest.raises(ValueError, match="heartbeat timeout must be >= 1 second"):
        distributed.initialize("127.0.0.1:1", 2, 0, heartbeat=0)
    with pytest.raises(ValueError, match="distributed_heartbeat must be >= 1 second"):
        RunOptions(distributed_heartbeat=0.5)
    seen = {}
    monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr(distributed.jax.config, "update", lambda *a: None)
    monkeypatch.setattr(distributed, "_wait_for_coordinator", lambda *a: None)
    monkeypatch.setattr(distributed, "_joined", None)
    monkeypatch.setattr(distributed.jax, "process_index", lambda: 1)
    monkeypatch.setattr(distributed.jax, "process_count", lambda: 2)
    distributed.initialize("127.0.0.1:1", 2, 1, heartbeat=7.5)
    assert seen["heartbeat_timeout_seconds"] == 8


@pytest.mark.slow
def test_a_stopped_process_ends_the_run_within_the_heartbeat(tmp_path):
    """SIGSTOP on process 1: JAX's heartbeat ends process 0 (SIGABRT, JAX's own log) within
    `--distributed_heartbeat`, keeping its last checkpoint (docs/devices.md)."""
    import os
    import socket
    import time

    from tests.helpers import subprocess_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "popeval", "evolve", "--env_name=Pendulum-v1", "--pop_size=32", "--num_rollouts=4",
            "--num_generations=100000", "--eval_every=50", "--eval_episodes=4", "--checkpoint_every=1", "--quiet",
            "--wandb=disabled", "--run_dir=run", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
            "--distributed_timeout=60", "--distributed_heartbeat=5"]
    env = subprocess_env(JAX_NUM_CPU_DEVICES="1")
    procs = [subprocess.Popen([*args, f"--process_id={i}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        metrics, deadline = tmp_path / "run" / "metrics.csv", time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) > 5):
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, err = procs[0].communicate(timeout=120)
        waited = time.monotonic() - stopped_at
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
    assert procs[0].returncode == -signal.SIGABRT, err[-2000:]
    assert waited < 60 and "stopped sending heartbeats" in err, err[-2000:]
    saved = json.loads((tmp_path / "run" / "checkpoint.json").read_text())["generation"]
    assert saved >= 5
