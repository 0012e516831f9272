"""Multi-process evolve (`jax.distributed`, CPU collectives through gloo on 127.0.0.1).

A run over P processes x D devices is the same computation as one process with P*D devices:
its `metrics.csv` (time columns aside) and checkpoint bytes are identical. Only process 0
writes and logs. Faults end every process in bounded time, and the run resumes from its last
checkpoint, with another process count too.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import read_metrics, subprocess_env

ARGS = ["--env_name=CartPole-v1", "--pop_size=12", "--num_rollouts=2", "--num_generations=4", "--eval_every=2",
        "--eval_episodes=4", "--checkpoint_every=2", "--quiet", "--wandb=disabled"]
#: Long enough (about 50 ms a generation after compiling) to stop a process in the middle.
LONG = ["--env_name=Pendulum-v1", "--pop_size=32", "--num_rollouts=4", "--num_generations=150", "--eval_every=50",
        "--eval_episodes=4", "--checkpoint_every=1", "--quiet", "--wandb=disabled"]


def popeval(args: list[str], cwd: Path, devices: int | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    env = subprocess_env(**({"JAX_NUM_CPU_DEVICES": str(devices)} if devices else {}))
    return subprocess.run([sys.executable, "-m", "popeval", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def launch(processes: int, devices: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return popeval(["launch", f"--processes={processes}", f"--devices_per_process={devices}",
                    f"--log_dir={cwd / 'logs'}", "--", "evolve", *args], cwd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main_in_process(argv: list[str], cwd: Path) -> int:
    """`popeval ARGV` in this process (`main(argv)`), for faults that come before JAX joins a run."""
    from popeval import cli

    log = logging.getLogger("popeval")
    level, here = log.level, os.getcwd()
    os.chdir(cwd)
    try:
        return cli.main(argv)
    finally:
        os.chdir(here)
        log.setLevel(level)  # a process_id other than 0 quietens popeval's log, as in its own process


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("processes,devices", [(2, 1), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_processes_of_devices_equal_one_process_of_them_all(tmp_path, processes, devices):
    """With `sharded_sampling` (each device draws its own members): 2 processes x 1 device
    against 1 x 2 by default, 2 x 2 against 1 x 4 under `-m slow` (and, resumed across
    process counts, `test_a_killed_process_ends_the_run_and_it_resumes`)."""
    args = ARGS + ["--sharded_sampling=true"]
    many = ok(launch(processes, devices, args + ["--run_dir=many"], tmp_path))
    ok(popeval(["evolve", *args, "--run_dir=one"], tmp_path, devices=processes * devices))
    a, b = tmp_path / "many", tmp_path / "one"
    assert read_metrics(a, timing=False) == read_metrics(b, timing=False)
    assert (a / "checkpoint.msgpack").read_bytes() == (b / "checkpoint.msgpack").read_bytes()
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    # Process 0 speaks for the run; the others print nothing of popeval's (Gloo's line aside).
    assert f"{processes * devices} device(s) in {processes} processes" in many.stderr
    assert f'"processes": {processes}' in many.stdout
    assert "[Gloo]" not in many.stdout + many.stderr  # "Rank 0 is connected to 1 peer ranks. ..."
    others = (tmp_path / "logs" / "process-1.log").read_text()
    assert "run " not in others and "{" not in others, others


@pytest.mark.slow
def test_eggroll_over_two_processes_equals_one_process(tmp_path):
    """EGGROLL's low-rank members drawn per device: 2 processes x 2 devices, 1 x 4 and 1 x 1
    give the same run (1 against 3 devices: tests/strategies/test_eggroll.py)."""
    args = ARGS + ["--strategy=eggroll", "--strategy_kwargs={rank: 2, sigma: 0.1}", "--hidden_sizes=[16, 16]"]
    ok(launch(2, 2, args + ["--run_dir=many"], tmp_path))
    ok(popeval(["evolve", *args, "--run_dir=four"], tmp_path, devices=4))
    ok(popeval(["evolve", *args, "--run_dir=one"], tmp_path, devices=1))
    runs = [tmp_path / name for name in ("many", "four", "one")]
    rows = [read_metrics(r, timing=False) for r in runs]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == 4
    assert len({(r / "checkpoint.msgpack").read_bytes() for r in runs}) == 1


@pytest.mark.slow
def test_a_killed_process_ends_the_run_and_it_resumes(tmp_path):
    """Process 1 is killed mid-run: process 0 fails within seconds with a message that says
    how to resume, keeping its last checkpoint; the run resumes with two processes of one
    device, then with one process of two, and the whole run equals an uninterrupted run of
    one process with two devices."""
    port = free_port()
    env = subprocess_env(JAX_NUM_CPU_DEVICES="1")
    common = [sys.executable, "-m", "popeval", "evolve", *LONG, "--run_dir=run",
              f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", "--distributed_timeout=60"]
    procs = [subprocess.Popen(common + [f"--process_id={i}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        metrics = tmp_path / "run" / "metrics.csv"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) > 5):
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = procs[0].communicate(timeout=120)
        waited = time.monotonic() - killed_at
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].returncode not in (0, None)
    assert waited < 60, waited
    assert "another process of this run stopped" in err and "--resume run" in err, err[-2000:]
    stopped = len(read_metrics(tmp_path / "run"))
    assert 5 <= stopped < 100, "process 1 was not killed early enough"

    # Resumed by two processes up to generation 100 (process 1 never reads the run directory),
    # then by one process with two devices to the end (the run's budget is now 100: it is raised).
    two = ok(launch(2, 1, ["--resume=run", "--num_generations=100", "--quiet", "--wandb=disabled"], tmp_path))
    assert len(read_metrics(tmp_path / "run")) == 100
    assert "2 device(s) in 2 processes (resumed at generation" in two.stderr and '"processes": 2' in two.stdout
    others = (tmp_path / "logs" / "process-1.log").read_text()
    assert "run " not in others and "{" not in others, others
    ok(popeval(["evolve", "--resume=run", "--num_generations=150", "--quiet", "--wandb=disabled"], tmp_path, devices=2))
    ok(popeval(["evolve", *LONG, "--run_dir=whole"], tmp_path, devices=2))
    assert read_metrics(tmp_path / "run", timing=False) == read_metrics(tmp_path / "whole", timing=False)
    a, b = tmp_path / "run", tmp_path / "whole"
    assert (a / "checkpoint.msgpack").read_bytes() == (b / "checkpoint.msgpack").read_bytes()
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())


def test_the_launcher_relays_process_0s_output_without_gloos_connection_line(capsys):
    """Gloo prints "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer
    ranks is : 1" from C++ (no setting silences it); a line saying a peer is missing stays."""
    from popeval import launch as launcher

    read, write = os.pipe()
    gloo = b"[Gloo] Rank %d is connected to %d peer ranks. Expected number of connected peer ranks is : %d\n"
    lines = [b"compiling\n", gloo % (0, 3, 3), gloo % (1, 0, 1), b'{"processes": 2}\n']
    os.write(write, b"".join(lines))
    os.close(write)
    with os.fdopen(read, "rb") as stream:
        launcher._relay(stream).join(30)
    assert capsys.readouterr().out == "".join(line.decode() for i, line in enumerate(lines) if i != 1)


def test_an_unreachable_coordinator_fails_in_bounded_time(tmp_path, capsys):
    """In-process: a process other than 0 waits for the coordinator before JAX joins anything."""
    t0 = time.monotonic()
    code = main_in_process(["evolve", *ARGS, f"--coordinator_address=127.0.0.1:{free_port()}", "--num_processes=2",
                            "--process_id=1", "--distributed_timeout=2"], tmp_path)
    err = capsys.readouterr().err
    assert code == 2
    assert "could not reach the coordinator" in err, err
    assert time.monotonic() - t0 < 60


def test_a_missing_process_fails_in_bounded_time(tmp_path):
    """Process 0 of two waits for the other up to the timeout, then JAX ends it."""
    t0 = time.monotonic()
    proc = popeval(["evolve", *ARGS, "--run_dir=run", f"--coordinator_address=127.0.0.1:{free_port()}",
                    "--num_processes=2", "--process_id=0", "--distributed_timeout=2"], tmp_path, devices=1,
                   timeout=120)
    assert proc.returncode != 0
    assert "waiting up to 2 s for 2 processes" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 90
    assert not (tmp_path / "run").exists()  # nothing written before every process joined


@pytest.mark.parametrize("flags,message", [
    (["--num_processes=2", "--process_id=2", "--coordinator_address=127.0.0.1:1234"], "process_id must be in [0, 2)"),
    (["--num_processes=2", "--process_id=0"], "needs coordinator_address, num_processes and process_id together"),
    (["--num_processes=2", "--process_id=0", "--coordinator_address=nohost"], "must be HOST:PORT"),
])
def test_bad_process_flags_are_refused(tmp_path, capsys, flags, message):
    """In-process: the flags are checked before JAX joins anything."""
    # A timeout bounds the wait should a check go missing.
    assert main_in_process(["evolve", *ARGS, "--distributed_timeout=2", *flags], tmp_path) == 2
    err = capsys.readouterr().err
    assert message in err.strip().splitlines()[-1] and "Traceback" not in err, err
    assert not any(tmp_path.iterdir())


def test_the_launcher_stops_every_process_when_one_fails(tmp_path, capsys):
    """A bad config fails on every process; the launcher reports it and exits with its code.
    Another command than evolve is refused before any process starts (in-process)."""
    proc = launch(2, 1, ARGS + ["--run_dir=run", "--pop_size=1"], tmp_path)
    assert proc.returncode == 2
    assert "pop_size must be >= 2" in proc.stderr and "failed (exit code 2)" in proc.stderr, proc.stderr
    capsys.readouterr()
    assert main_in_process(["launch", "--processes=2", "--", "eval", "run"], tmp_path) == 2
    assert "runs `popeval evolve ...`" in capsys.readouterr().err


def test_initialize_outside_a_cluster_or_with_one_process_is_a_no_op(monkeypatch):
    from popeval import distributed

    assert distributed.initialize(f"127.0.0.1:{free_port()}", 1, 0) is None  # nothing to join
    assert distributed._joined is None
    for var in ("SLURM_JOB_ID", "SLURM_PROCID", "OMPI_MCA_orte_hnp_uri"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.initialize() is None
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert distributed._detected_cluster() is None  # one task: one process
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert distributed._detected_cluster() == "slurm"
