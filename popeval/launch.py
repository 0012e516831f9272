"""`popeval launch`: one command in N local processes, joined into one multi-process run.

    popeval launch --processes 2 -- evolve --config experiments/configs/cartpole.yaml --run_dir runs/x

starts `popeval evolve ... --coordinator_address=127.0.0.1:PORT --num_processes=2
--process_id=I` for I = 0, 1 on this machine (a free port unless `--port`), each with
`--devices_per_process` CPU devices (default 1). Process 0's output is streamed (without
Gloo's "[Gloo] Rank 0 is connected to N peer ranks" line: see `_relay`); the others'
goes to `process-I.log` files (in `--log_dir`, default a new temporary directory), shown in
part when a process fails. When one process fails, the launcher stops the others and exits
with its code; Ctrl-C or SIGTERM stops them all (each saves what it has, as after Ctrl-C). It is
for tests and demos of multi-process runs on one machine; on a cluster, the scheduler (SLURM,
Open MPI) starts the processes.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from popeval import signals

__all__ = ["launch", "main"]

#: Seconds the launcher gives the other processes to stop (SIGTERM) before killing them.
GRACE_SECONDS = 10.0
#: Seconds the launcher waits, once process 0 ended, for the rest of its output (a helper it
#: started, such as W&B's service, may hold its stdout open a little longer).
RELAY_SECONDS = 2.0
#: The line Gloo (JAX's CPU collectives across processes) prints to stdout from C++ when its
#: connections are made; no setting of JAX's or Gloo's turns it off.
_GLOO_CONNECTED = re.compile(r"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. "
                             r"Expected number of connected peer ranks is : (\d+)\s*")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _noise(line: str) -> bool:
    """Gloo's line saying that every peer connected (one that says some did not is kept)."""
    found = _GLOO_CONNECTED.fullmatch(line)
    return found is not None and found[1] == found[2]


def _relay(stream) -> threading.Thread:
    """Copies a child's output (a pipe) to stdout line by line, without Gloo's connection line."""
    def copy():
        for line in iter(stream.readline, b""):
            text = line.decode(errors="replace")
            if _noise(text):
                continue
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except (OSError, ValueError):  # stdout closed (`| head`): keep draining, or the child blocks
                pass

    thread = threading.Thread(target=copy, name="popeval-launch-relay", daemon=True)
    thread.start()
    return thread


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = [line for line in path.read_text(errors="replace").splitlines() if not _noise(line)]
    except OSError:
        return ""
    return "\n".join(f"  | {line}" for line in text[-lines:])


def _stop(children: list[subprocess.Popen], sig: int = signal.SIGTERM) -> None:
    """Sends `sig` to the children still running, and kills those still running
    `GRACE_SECONDS` later."""
    for child in children:
        if child.poll() is None:
            child.send_signal(sig)
    deadline = time.monotonic() + GRACE_SECONDS
    for i, child in enumerate(children):
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"popeval launch: process {i} did not stop within {GRACE_SECONDS:g} s; killing it",
                  file=sys.stderr, flush=True)
            child.kill()
            child.wait()


def launch(command: list[str], processes: int, *, devices_per_process: int | None = 1, port: int | None = None,
           log_dir: str | os.PathLike | None = None) -> int:
    """Runs `popeval <command>` in `processes` local processes of one run; returns 0 when all
    succeed, else the first failing process's exit code (128 + N for signal N).

    Args:
        command: a `popeval` command line that joins a multi-process run, e.g.
            `["evolve", "--config", "x.yaml"]`.
        processes: how many processes (>= 1).
        devices_per_process: CPU devices per process (`JAX_NUM_CPU_DEVICES`); None: each
            process's own default.
        port: the coordinator's port on 127.0.0.1 (default: a free one).
        log_dir: where processes 1.. write `process-I.log` (default: a new temporary directory).
    """
    _check(command, processes, devices_per_process)
    address = f"127.0.0.1:{port or _free_port()}"
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="popeval-launch-"))
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if devices_per_process is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(devices_per_process)
    children: list[subprocess.Popen] = []
    files, relays = [], []
    print(f"popeval launch: {processes} process(es), coordinator {address}; processes 1.. log to {logs}",
          file=sys.stderr, flush=True)
    try:
        for i in range(processes):
            argv = [sys.executable, "-m", "popeval", *command, f"--coordinator_address={address}",
                    f"--num_processes={processes}", f"--process_id={i}"]
            out = subprocess.PIPE
            if i > 0:
                out = open(logs / f"process-{i}.log", "wb")
                files.append(out)
            children.append(subprocess.Popen(argv, env=env, stdout=out, stderr=None if i == 0 else subprocess.STDOUT))
            if i == 0:
                relays.append(_relay(children[0].stdout))
        return _wait(children, logs)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (`popeval.signals`): every process saves and stops
        # SIGTERM, also for Ctrl-C: the processes may have had the terminal's SIGINT already, and a
        # second SIGINT would stop them at once, while a repeated SIGTERM asks for nothing more.
        _stop(children, signal.SIGTERM)
        return 128 + (signals.received() or signal.SIGINT)
    finally:
        _stop(children, signal.SIGKILL)
        for relay in relays:
            relay.join(RELAY_SECONDS)
        for f in files:
            f.close()


def _check(command: list[str], processes: int, devices_per_process: int | None) -> None:
    """Refuses `launch`'s bad arguments."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"--processes must be a positive integer, got {processes!r}")
    if devices_per_process is not None and devices_per_process < 1:
        raise ValueError(f"--devices_per_process must be >= 1, got {devices_per_process}")
    if command[:1] != ["evolve"]:
        raise ValueError(f"popeval launch runs `popeval evolve ...` in several processes, got "
                         f"{command[:1] or 'nothing'} "
                         "(usage: popeval launch --processes N -- evolve --config FILE ...)")


def _wait(children: list[subprocess.Popen], logs: Path) -> int:
    """Waits until every child succeeded (0) or one failed: then stops the others and returns
    its exit code (128 + N for signal N)."""
    while True:
        codes = [child.poll() for child in children]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None:
            code = codes[failed]
            print(f"popeval launch: process {failed} failed ({_describe(code)}); stopping the others",
                  file=sys.stderr, flush=True)
            if failed > 0:
                print(_tail(logs / f"process-{failed}.log"), file=sys.stderr, flush=True)
            _stop(children)
            return 128 - code if code < 0 else code
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    """`popeval launch [options] -- COMMAND ...`."""
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv, []
    p = argparse.ArgumentParser(prog="popeval launch", description=__doc__.split("\n\n")[0],
                                usage="popeval launch --processes N [options] -- evolve ...")
    p.add_argument("--processes", type=int, required=True, help="how many local processes")
    p.add_argument("--devices_per_process", "--devices-per-process", type=int, default=1,
                   help="CPU devices per process (JAX_NUM_CPU_DEVICES; default 1)")
    p.add_argument("--port", type=int, default=None, help="the coordinator's port (default: a free one)")
    p.add_argument("--log_dir", "--log-dir", default=None, help="where processes 1.. log (default: a temp dir)")
    args = p.parse_args(own)
    try:
        return launch(command, args.processes, devices_per_process=args.devices_per_process, port=args.port,
                      log_dir=args.log_dir)
    except ValueError as e:
        print(f"popeval launch: error: {e}", file=sys.stderr)
        return 2
