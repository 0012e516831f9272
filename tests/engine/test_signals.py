"""Ctrl-C and SIGTERM stop a command alike, with one line (`popeval.signals`): a run saves its
last generation and leaves no lock or temporary file, at any moment (importing JAX, compiling,
running), in one process and under `popeval launch`. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from popeval import checkpoint
from tests.helpers import subprocess_env

#: A tiny run that never ends by itself (the tests stop it).
RUN = ["evolve", "--env_name=Catch-bsuite", "--pop_size=8", "--num_rollouts=1", "--hidden_sizes=[4]",
       "--num_generations=100000", "--checkpoint_every=1", "--run_dir=run", "--quiet", "--wandb=disabled"]


def start(args: list[str], cwd: Path, prelude: str = "", **kwargs) -> subprocess.Popen:
    """`popeval ARGS` as its console script runs it, after `prelude`. Python's own SIGINT
    handler is put back first: a Python started with SIGINT ignored (as xdist's workers start
    children) keeps ignoring it, as a shell's `cmd &` does."""
    code = (f"import runpy, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n{prelude}\n"
            "sys.argv[0] = 'popeval'\nrunpy.run_module('popeval', run_name='__main__', alter_sys=True)\n")
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, env=subprocess_env(JAX_NUM_CPU_DEVICES="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


class Lines:
    """A child's stderr, read on a thread as it comes."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        self._thread.join(30)
        return "".join(self.lines)


def wait_until(ready, proc: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert proc.poll() is None, f"ended early with {proc.returncode}"
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.02)


def leftovers(run: Path) -> list[str]:
    """A lock or temporary files left in a run directory."""
    return sorted(p.name for p in run.iterdir() if p.name == ".lock" or p.name.endswith(".tmp"))


@pytest.mark.parametrize("moment", ["compiling", pytest.param("running", marks=pytest.mark.slow)])
def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path, moment):
    """SIGTERM while the first generation compiles, or after a checkpoint: the run saves its
    last generation, says so and how to resume in one line (exit code 143), and leaves no lock."""
    proc = start(RUN, tmp_path)
    err = Lines(proc.stderr)
    try:
        if moment == "compiling":  # the run directory is taken, the generation program compiles
            wait_until(lambda: any(line.startswith("run run: ") for line in err.lines), proc)
        else:
            wait_until((tmp_path / "run" / "checkpoint.json").exists, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill()  # a 100,000-generation run never outlives the test
    text = err.text()
    assert proc.returncode == 143, text
    generation = checkpoint.load_meta(tmp_path / "run")["generation"] if checkpoint.exists(tmp_path / "run") else 0
    saved = f"; saved generation {generation}" if generation else " before the first generation (nothing to save)"
    line = f"popeval evolve: interrupted by SIGTERM{saved}; resume with popeval evolve --resume run"
    assert text.strip().splitlines()[-1] == line, text
    assert "Traceback" not in text and leftovers(tmp_path / "run") == []


def test_ctrl_c_inside_jaxs_garbage_collection_callback_stops_at_once(tmp_path):
    """Issue 61 N3: Ctrl-C while JAX is imported landed in a garbage-collection callback, where
    Python ignores exceptions ("Exception ignored in _xla_gc_callback"), and the run carried on
    to the end. Here the SIGINT is raised inside such a callback during `import jax`."""
    prelude = textwrap.dedent("""
        import gc

        def ctrl_c(phase, info):
            if phase == "start" and "jax" in sys.modules:
                gc.callbacks.remove(ctrl_c)
                signal.raise_signal(signal.SIGINT)

        gc.callbacks.append(ctrl_c)
    """)
    proc = start([*RUN, "--num_generations=2"], tmp_path, prelude)  # the last value counts
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["popeval evolve: interrupted"], err
    assert not (tmp_path / "run").exists()


def test_ctrl_c_while_a_sink_starts_does_not_wait_for_it(tmp_path):
    """A sink still starting when Ctrl-C comes (W&B's service, matplotlib's import) is left to
    end with the process, neither waited for nor closed; the sinks that started are closed."""
    from popeval.strategies import EvolveConfig, RunOptions, evolve
    from popeval.strategies.run.evolve import RunInterrupted

    main, release = threading.get_ident(), threading.Event()

    class Sink:
        def __init__(self, hangs: bool):
            self.hangs, self.events = hangs, []

        def start(self, info):
            self.events.append("start")
            if self.hangs:
                signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C reaches the main thread
                release.wait(30)
                self.events.append("started")

        def log(self, step, metrics):
            pass

        def close(self):
            self.events.append("close")

    started, starting = Sink(hangs=False), Sink(hangs=True)
    config = EvolveConfig.from_flat(env_name="Catch-bsuite", pop_size=8, num_rollouts=1, hidden_sizes=[4],
                                    num_generations=3)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist's workers ignore SIGINT
    try:
        with pytest.raises(RunInterrupted):
            evolve(config, RunOptions(run_dir=str(tmp_path / "run"), wandb="disabled", progress=False),
                   sinks=[started, starting])
        assert (started.events, starting.events) == (["start", "close"], ["start"]), (started.events, starting.events)
    finally:
        signal.signal(signal.SIGINT, handler)
        release.set()
    assert leftovers(tmp_path / "run") == []


def script(code: str) -> subprocess.CompletedProcess:
    """`code` run by a fresh Python after `popeval.signals.install("t")` (with Python's own
    SIGINT handler first, as `start` does); no JAX."""
    code = ("import signal, sys, time\nfrom popeval import signals\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\nsignals.install('t')\n" + textwrap.dedent(code))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())


def test_before_anything_is_written_a_signal_ends_the_process_at_once():
    """Ctrl-C and SIGTERM end it; a signal that a library handles itself does not."""
    done = script("""
        signal.signal(signal.SIGUSR1, lambda *args: None)
        signal.raise_signal(signal.SIGUSR1)
        time.sleep(0.5)
        print("went on", flush=True)
        signal.raise_signal(signal.SIGTERM)
        time.sleep(30)
        print("carried on", flush=True)
    """)
    assert (done.returncode, done.stdout, done.stderr) == (143, "went on\n", "t: interrupted by SIGTERM\n")


def test_a_keyboard_interrupt_that_python_ignored_is_raised_again():
    """Raised inside a garbage-collection callback, a KeyboardInterrupt is ignored by Python;
    the signal is delivered again, outside it."""
    done = script("""
        import gc

        signals.now_writing()

        def ctrl_c(phase, info):
            gc.callbacks.remove(ctrl_c)
            signal.raise_signal(signal.SIGINT)

        gc.callbacks.append(ctrl_c)
        try:
            gc.collect()
            for _ in range(1200):  # 120 s, longer than the test waits, in slices as popeval waits
                time.sleep(0.1)
            print("carried on")
        except KeyboardInterrupt:
            print("stopped")
    """)
    assert (done.stdout, done.stderr) == ("stopped\n", ""), done


def test_a_repeated_sigterm_asks_for_nothing_more_and_a_second_ctrl_c_stops_at_once():
    """The launcher forwards SIGTERM to processes that a scheduler may have sent it already: a
    run that is stopping goes on stopping. A second Ctrl-C is the user's 'now'."""
    done = script("""
        signals.now_writing()
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            signal.raise_signal(signal.SIGTERM)
            print("stopping")
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                print("stopped at once")
    """)
    assert (done.stdout, done.stderr) == ("stopping\nstopped at once\n", ""), done


@pytest.mark.slow
@pytest.mark.parametrize("who", ["launcher", "every process"])
def test_sigterm_stops_a_launched_run_as_ctrl_c_does(tmp_path, who):
    """Issue 61 N9: under `popeval launch --processes 2`, JAX's preemption notifier caught
    SIGTERM ("SIGTERM caught") and the run carried on; the launcher's own SIGTERM acted only at
    its SIGKILL. Now the launcher forwards it (to the launcher alone: `kill`; to every process:
    a scheduler), every process stops at once, and process 0 saves the last generation."""
    proc = start(["launch", "--processes=2", f"--log_dir={tmp_path / 'logs'}", "--", *RUN], tmp_path,
                 start_new_session=True)
    err = Lines(proc.stderr)
    try:
        wait_until((tmp_path / "run" / "checkpoint.json").exists, proc)
        (os.killpg if who == "every process" else os.kill)(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)  # the launcher's own SIGKILL comes after 10 s
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # no process of the run outlives the test
        except ProcessLookupError:
            pass
    text = err.text()
    assert proc.returncode == 143, text
    line = (f"popeval evolve: interrupted by SIGTERM; saved generation "
            f"{checkpoint.load_meta(tmp_path / 'run')['generation']}; resume with popeval evolve --resume run")
    assert text.strip().splitlines()[-1] == line and "SIGTERM caught" not in text, text
    last = (tmp_path / "logs" / "process-1.log").read_text().strip().splitlines()[-1]
    assert last.startswith("popeval evolve: interrupted by SIGTERM"), last
    assert "did not stop" not in text and leftovers(tmp_path / "run") == []
