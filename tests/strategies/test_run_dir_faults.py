"""The run directory under faults (issue 49 rows 1, 2, 3, 11, 13, 15; issue 61 N1, N2, N6, N7,
N12): a kill while starting never leaves it stuck, nothing is written through a symbolic link, a
resumer reads under the lock, a run that fails at once leaves no litter, a checkpoint knows its
experiment (and every command checks it), permission bits are kept, a finished run leaves no
lock, a stop at any moment of a run's end is finished on resume, and crafted checkpoints are
refused by name. Tiny CartPole runs, most checks without one."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
from flax import serialization

from popeval import checkpoint
from popeval.cli import main
from popeval.strategies import EvolveConfig, RunOptions, evolve
from popeval.strategies.run import run_dir as run_dir_lib
from popeval.strategies.run.run_dir import Lock, export_policy
from tests.helpers import read_metrics, subprocess_env

TINY = dict(
    env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 50}, pop_size=8, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
)
QUIET = dict(wandb="disabled", progress=False)
evolve_module = importlib.import_module("popeval.strategies.run.evolve")  # the module, not the function


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """A finished 4-generation run; tests copy it before changing it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    return run_dir


def copy_of(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "run", symlinks=True)


def fake_run(run_dir, generation=1):
    """A run directory with a config and a (tiny, not resumable) checkpoint: enough for checks
    that refuse before building anything."""
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(EvolveConfig.from_flat(**TINY).to_dict()))
    checkpoint.save(run_dir, {"w": np.zeros(2, np.float32)}, {"generation": generation, "env_steps": 10})


# ------------------------------------------------------------------ row 1: never stuck
@pytest.mark.parametrize("left", [[".lock"], [".lock", "config.json.tmp"], ["checkpoint.msgpack.tmp"]])
def test_a_run_killed_while_starting_is_not_stuck(tmp_path, capsys, left):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    for name in left:
        (run_dir / name).write_text("1234")
    assert main(["evolve", "--resume", str(run_dir), "--quiet", "--wandb=disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the run never started" in err[0] and f"--run_dir {run_dir}" in err[0]
    # A fresh start into it works: it counts as empty.
    lock, prepared = run_dir_lib.open_run(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir)))
    run_dir_lib.write_config(prepared)
    lock.release()
    assert [p.name for p in run_dir.iterdir()] == ["config.json"]
    assert run_dir_lib.read_config(run_dir) == EvolveConfig.from_flat(**TINY)


def test_a_directory_with_other_files_is_still_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a popeval run directory"):
        run_dir_lib.prepare(None, RunOptions(resume=str(tmp_path)))
    with pytest.raises(ValueError, match="is not empty"):
        run_dir_lib.open_run(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # not even a lock


# ------------------------------------------------------------------ row 2: no writes through links
@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_bytes(b"the user's file")
    return path


def test_atomic_write_replaces_a_link_and_never_writes_through_one(tmp_path, victim):
    target = tmp_path / "data.json"
    (tmp_path / "data.json.tmp").symlink_to(victim)  # a planted temporary
    checkpoint.atomic_write(target, b"new")
    assert victim.read_bytes() == b"the user's file" and target.read_bytes() == b"new"
    link = tmp_path / "link.json"
    link.symlink_to(victim)  # a planted file: the link is replaced
    checkpoint.atomic_write(link, b"new")
    assert victim.read_bytes() == b"the user's file" and not link.is_symlink() and link.read_bytes() == b"new"
    assert not list(tmp_path.glob("*.tmp"))
    metrics = tmp_path / "metrics.csv"
    metrics.symlink_to(victim)
    with pytest.raises(OSError):
        checkpoint.open_append(metrics)
    assert victim.read_bytes() == b"the user's file"


def test_checkpoints_lock_and_gif_never_write_through_a_link(tmp_path, victim):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("checkpoint.msgpack.tmp", "checkpoint.json.tmp", "policy.gif"):
        (run_dir / name).symlink_to(victim)
    checkpoint.save(run_dir, {"w": np.ones(2, np.float32)}, {"generation": 1, "env_steps": 2})
    from popeval.visualize import save_gif

    save_gif([np.zeros((4, 4, 3), np.uint8)] * 2, run_dir / "policy.gif")
    assert (run_dir / "policy.gif").read_bytes()[:3] == b"GIF" and not (run_dir / "policy.gif").is_symlink()
    lock_dir = tmp_path / "locked"
    lock_dir.mkdir()
    (lock_dir / ".lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"\.lock: a symbolic link"):
        Lock(lock_dir)
    assert victim.read_bytes() == b"the user's file"
    assert checkpoint.load_meta(run_dir)["generation"] == 1


def test_export_refuses_a_symlinked_file_and_writes_nothing(tmp_path, victim):
    run_dir = tmp_path / "run"
    fake_run(run_dir)
    (run_dir / "metrics.csv").symlink_to(victim)
    with pytest.raises(ValueError, match=r"metrics\.csv: a symbolic link"):
        export_policy(run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ row 3: lock, then read
def test_a_resumer_delayed_before_the_lock_uses_the_fresh_checkpoint(finished, tmp_path, monkeypatch):
    """B resumes; between its first look and its lock, A resumes the same run to the end."""
    run_dir = copy_of(finished, tmp_path)
    longer = EvolveConfig.from_flat(**{**TINY, "num_generations": 6})
    after_a = []

    class Delayed(Lock):
        def __init__(self, *args, **kwargs):
            if not after_a:
                monkeypatch.setattr(run_dir_lib, "Lock", Lock)
                evolve(longer, RunOptions(resume=str(run_dir), **QUIET))  # process A
                after_a.append((run_dir / "checkpoint.msgpack").read_bytes())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(run_dir_lib, "Lock", Delayed)
    out = evolve(longer, RunOptions(resume=str(run_dir), **QUIET))  # process B
    assert after_a and out["generations"] == 6
    # B found A's generation 6 (complete): it ran nothing more on A's state with its stale counters.
    assert (run_dir / "checkpoint.msgpack").read_bytes() == after_a[0]
    assert checkpoint.load_meta(run_dir)["generation"] == 6
    assert [int(r["generation"]) for r in read_metrics(run_dir)] == list(range(1, 7))


# ------------------------------------------------------------------ row 11: no litter
def _fail_at_compile(monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 GiB")

    monkeypatch.setattr(evolve_module, "generation_step", out_of_memory)


def test_a_run_failing_before_its_first_generation_leaves_no_litter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fail_at_compile(monkeypatch)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(**QUIET))  # runs/<env>-..., created by the run
    assert not (tmp_path / "runs").exists()  # issue 61 N13: runs/ too, when the run made it
    (tmp_path / "runs").mkdir()
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir="runs/a/b", **QUIET))
    assert list((tmp_path / "runs").iterdir()) == []  # the user's runs/ stays
    # A directory the user made is left as a resumable run, without the lock.
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        evolve(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(mine), **QUIET))
    assert sorted(p.name for p in mine.iterdir()) == ["config.json"]


def test_the_default_run_directory_stays_under_runs(tmp_path, monkeypatch):
    """Issue 61 N11: an id's separators become `-` in the directory's name."""
    monkeypatch.chdir(tmp_path)
    for env_name in ("brax/ant", "../../escape-v0", "a\\b"):
        run_dir = run_dir_lib.prepare(EvolveConfig.from_flat(**{**TINY, "env_name": env_name}),
                                      RunOptions(**QUIET)).run_dir
        assert run_dir.parent == run_dir_lib.Path("runs") and "/" not in run_dir.name and "\\" not in run_dir.name
        assert run_dir.name.startswith(env_name.replace("/", "-").replace("\\", "-") + "-openai_es-seed0-")


def test_a_full_disk_while_starting_names_the_file(tmp_path, monkeypatch):
    """Issue 61 N13: the lock's first write and metrics.csv's first row on a full disk."""
    import errno

    from popeval.cli import _one_line
    from popeval.sinks import CSVSink, RunInfo

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_dir_lib.os, "pwrite", no_space)
    with pytest.raises(OSError) as failed:
        run_dir_lib.open_run(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(tmp_path / "runs" / "r"), **QUIET))
    monkeypatch.undo()
    assert _one_line(failed.value) == f"No space left on device: {tmp_path / 'runs' / 'r' / '.lock'}"
    assert list(tmp_path.iterdir()) == []  # nothing left behind, runs/ included
    sink = CSVSink()
    sink.start(RunInfo(tmp_path, "r", "t", {}, 0, 4, {}))

    class Full:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            no_space()

    monkeypatch.setattr(checkpoint, "open_append", lambda path: Full())
    with pytest.raises(OSError) as failed:
        sink.log(1, {"generation": 1})
    assert _one_line(failed.value) == f"No space left on device: {tmp_path / 'metrics.csv'}"


def test_a_config_json_with_a_byte_order_mark_is_read_alike_everywhere(finished, tmp_path):
    """Issue 61 N13: `--resume` failed with "Unexpected UTF-8 BOM", naming no file."""
    run_dir = copy_of(finished, tmp_path)
    config = run_dir / "config.json"
    config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())
    summary = evolve(EvolveConfig.from_flat(**TINY), RunOptions(resume=str(run_dir), **QUIET))
    assert summary["generations"] == 4  # complete: nothing to do, and no error


# ------------------------------------------------------------------ row 13: a checkpoint knows its experiment
def test_a_checkpoint_records_its_experiment_and_refuses_an_edited_config(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    recorded = run_dir_lib.config_hash(EvolveConfig.from_flat(**TINY))
    assert json.loads((run_dir / "checkpoint.json").read_text())["config_sha256"] == recorded
    assert checkpoint.read(run_dir)[1]["config_sha256"] == recorded
    (run_dir / "checkpoint.json").unlink()
    assert checkpoint.load_meta(run_dir)["config_sha256"] == recorded  # inside checkpoint.msgpack too
    shutil.copy(finished / "checkpoint.json", run_dir / "checkpoint.json")
    saved = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**saved, "seed": 7}))
    with pytest.raises(ValueError, match=r"config\.json no longer matches the experiment that made the checkpoint"):
        evolve(None, RunOptions(resume=str(run_dir), **QUIET))
    assert not (run_dir / ".lock").exists()


def test_checkpoint_json_without_its_msgpack_is_refused_not_restarted(tmp_path, capsys):
    run_dir = tmp_path / "run"
    fake_run(run_dir, generation=7)
    (run_dir / "checkpoint.msgpack").unlink()
    assert main(["evolve", "--resume", str(run_dir), "--quiet", "--wandb=disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint.json says generation 7 but checkpoint.msgpack is missing" in err[0]
    with pytest.raises(ValueError, match="is not empty"):
        run_dir_lib.prepare(EvolveConfig.from_flat(**TINY), RunOptions(run_dir=str(run_dir)))
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint.json", "config.json"]


def test_an_old_checkpoint_resumes_keeps_permissions_and_records_the_raised_budget(finished, tmp_path):
    """A checkpoint without a config hash (earlier versions) still resumes; replaced files keep
    their permission bits; config.json says the raised budget; no lock is left behind."""
    run_dir = copy_of(finished, tmp_path)
    state_dict, meta = checkpoint.read(run_dir)
    del meta["config_sha256"]
    checkpoint.save(run_dir, state_dict, meta)  # as an earlier version wrote it
    assert "config_sha256" not in checkpoint.read(run_dir)[1]
    private = ("config.json", "checkpoint.msgpack", "checkpoint.json", "result.json")
    for name in private:
        os.chmod(run_dir / name, 0o600)
    out = evolve(EvolveConfig.from_flat(**{**TINY, "num_generations": 5}), RunOptions(resume=str(run_dir), **QUIET))
    assert out["generations"] == 5
    assert {name: stat.S_IMODE((run_dir / name).stat().st_mode) for name in private} == dict.fromkeys(private, 0o600)
    assert json.loads((run_dir / "config.json").read_text())["num_generations"] == 5
    assert checkpoint.load_meta(run_dir)["config_sha256"] == run_dir_lib.config_hash(EvolveConfig.from_flat(**TINY))
    assert not (run_dir / ".lock").exists() and not (finished / ".lock").exists()
    again = evolve(None, RunOptions(resume=str(run_dir), **QUIET))  # "complete (generation 5 of 5)"
    assert again["generations"] == 5 and not (run_dir / ".lock").exists()


def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    checkpoint.atomic_write(path, b"new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_bytes() == b"new"


def test_a_run_saved_before_a_config_key_existed_still_resumes(finished, tmp_path):
    """The hash is of `config.json`'s own keys: a later popeval's new key (here: one removed from
    the file, as an earlier version wrote it) does not refuse the run, and a raised budget
    changes only `num_generations` in the file."""
    run_dir = copy_of(finished, tmp_path)
    saved = json.loads((run_dir / "config.json").read_text())
    del saved["sharded_sampling"]
    (run_dir / "config.json").write_text(json.dumps(saved))
    state_dict, meta = checkpoint.read(run_dir)
    checkpoint.save(run_dir, state_dict, {**meta, "config_sha256": run_dir_lib.config_hash(saved)})
    opened = run_dir_lib.open_shared(EvolveConfig.from_flat(**{**TINY, "num_generations": 5}),
                                     RunOptions(resume=str(run_dir)),
                                     primary=True)
    opened.lock.release()
    assert opened.meta["generation"] == 4 and opened.resuming
    assert json.loads((run_dir / "config.json").read_text()) == {**saved, "num_generations": 5}
    assert not (run_dir / ".lock").exists()


# ------------------------------------------------------------------ issue 61: every stop ends a run
AT_TARGET = {**TINY, "num_generations": 12, "target": 25.0, "stop_at_target": True}
SAME = ("generations", "env_steps", "mean_policy_return", "best_policy_return", "best_fitness")


class _Freeze:
    """A sink whose `close` copies the run directory: what a kill while the sinks close (the
    figure, W&B) leaves."""

    def __init__(self, freeze):
        self.freeze = freeze

    def start(self, info):
        pass

    def log(self, step, metrics):
        pass

    def close(self):
        self.freeze("closing")


@pytest.fixture(scope="module")
def stopped_at_target(tmp_path_factory):
    """A run that stops at its target, and copies of its directory as a kill at each moment of
    its end leaves it: `msgpack`, once the checkpoint of the target's generation is renamed into
    place (`checkpoint.json` still of an earlier generation); `json`, once the last
    `checkpoint.json` is (no `result.json` yet); `closing`, while the sinks close."""
    from popeval.sinks import CSVSink, PlotSink

    root = tmp_path_factory.mktemp("at-target")
    run_dir, writes, write = root / "run", [], checkpoint.atomic_write

    def freeze(point):
        shutil.rmtree(root / point, ignore_errors=True)
        shutil.copytree(run_dir, root / point, symlinks=True)

    def atomic_write(path, data):
        write(path, data)
        if path.name in (checkpoint.CHECKPOINT, checkpoint.META):
            writes.append(f"{path.name}-{len(writes)}")
            freeze(writes[-1])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint, "atomic_write", atomic_write)
        out = evolve(EvolveConfig.from_flat(**AT_TARGET), RunOptions(run_dir=str(run_dir), **QUIET),
                     sinks=[CSVSink(), _Freeze(freeze), PlotSink()])
    solved = out["solved_at"]["generation"]
    assert out["generations"] == solved and 2 < solved < 12  # checkpoint.json of generation 2 lacks the target
    first_final = next(w for w in writes if w.startswith(checkpoint.CHECKPOINT)
                       and checkpoint.load_meta(root / w)["generation"] == solved)
    last_json = [w for w in writes if w.startswith(checkpoint.META)][-1]
    return {"run": run_dir, "result": out, "msgpack": root / first_final, "json": root / last_json,
            "closing": root / "closing"}


def _arrays(run_dir):
    """The checkpoint's arrays by path."""
    flat, todo = {}, [("", checkpoint.load_state_dict(run_dir))]
    while todo:
        prefix, tree = todo.pop()
        for k, v in tree.items():
            if isinstance(v, dict):
                todo.append((f"{prefix}/{k}", v))
            else:
                flat[f"{prefix}/{k}"] = np.asarray(v)
    return flat


@pytest.mark.parametrize("point", ["msgpack", "json", "closing"])
def test_a_run_stopped_at_any_moment_of_its_end_finishes_it_on_resume(stopped_at_target, point, tmp_path):
    """N1, N2: the target's generation is inside the checksummed checkpoint, and a run stopped
    at its target without `result.json` runs only its final evaluation on resume: the rows, the
    checkpoint and the result of the uninterrupted run, no generation past the target."""
    run_dir = copy_of(stopped_at_target[point], tmp_path)
    solved = stopped_at_target["result"]["solved_at"]["generation"]
    assert not (run_dir / "result.json").exists()
    stale = json.loads((run_dir / "checkpoint.json").read_text())
    assert (stale["generation"] < solved) == (point == "msgpack")
    evolve(None, RunOptions(resume=str(run_dir), **QUIET))
    _assert_finished_as(run_dir, stopped_at_target)


def _assert_finished_as(run_dir, stopped_at_target):
    """`run_dir` ended as the uninterrupted run did; a second resume changes nothing."""
    reference, expected = stopped_at_target["run"], stopped_at_target["result"]
    solved = expected["solved_at"]["generation"]
    out = json.loads((run_dir / "result.json").read_text())
    assert {k: out[k] for k in SAME} == {k: expected[k] for k in SAME} and out["solved_at"]["generation"] == solved
    assert read_metrics(run_dir, timing=False) == read_metrics(reference, timing=False)
    mine, theirs = _arrays(run_dir), _arrays(reference)
    assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
    meta = json.loads((run_dir / "checkpoint.json").read_text())  # no longer behind
    assert meta["generation"] == solved and meta["solved_at"]["generation"] == solved
    assert (run_dir / "fitness.png").is_file() and not (run_dir / ".lock").exists()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    again = evolve(None, RunOptions(resume=str(run_dir), **QUIET))  # complete now: nothing to do
    assert again["generations"] == solved and {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


#: `python -c KILL_AT POINT SOLVED popeval-argv...`: popeval stopped at one moment of its end, by a
#: real signal: SIGKILL once the checkpoint of generation SOLVED is renamed into place
#: (`msgpack`) or just before `result.json` is written (`result`), Ctrl-C while `fitness.png`
#: is drawn (`closing`).
KILL_AT = """
import os, signal, sys, time
from popeval import checkpoint
from popeval.cli import main
from popeval.sinks import files
from popeval.strategies.run import run_dir

point, solved = sys.argv[1], int(sys.argv[2])
write = checkpoint.atomic_write

def atomic_write(path, data):
    write(path, data)
    if path.name == checkpoint.CHECKPOINT and checkpoint.read(path.parent)[1]["generation"] == solved:
        os.kill(os.getpid(), signal.SIGKILL)

def stop(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT if point == "closing" else signal.SIGKILL)
    time.sleep(60)

if point == "msgpack":
    checkpoint.atomic_write = atomic_write
elif point == "result":
    run_dir.write_result = stop
else:
    files.PlotSink.close = stop
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("point, returncode", [("msgpack", -9), ("result", -9), ("closing", 130)])
def test_a_process_killed_at_any_moment_of_its_end_finishes_on_resume(stopped_at_target, tmp_path, point,
                                                                       returncode):
    """The same moments as above, by real signals to a `popeval evolve` process."""
    config, run_dir = tmp_path / "at-target.yaml", tmp_path / "run"
    config.write_text(json.dumps(AT_TARGET))  # JSON is YAML
    solved = str(stopped_at_target["result"]["solved_at"]["generation"])
    argv = ["evolve", "--config", str(config), "--run_dir", str(run_dir), "--quiet", "--wandb=disabled"]
    killed = subprocess.run([sys.executable, "-c", KILL_AT, point, solved, *argv], env=subprocess_env(),
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == returncode, killed.stderr
    assert checkpoint.exists(run_dir) and not (run_dir / "result.json").exists()
    resumed = subprocess.run([sys.executable, "-m", "popeval", "evolve", "--resume", str(run_dir), "--quiet",
                              "--wandb=disabled"], env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    _assert_finished_as(run_dir, stopped_at_target)


def test_the_target_generation_is_read_from_the_checkpoint_and_older_ones_still_load(tmp_path):
    """`checkpoint.json` one checkpoint behind keeps the target's generation (the seconds are
    lost: null); a checkpoint without it (older popeval) keeps `checkpoint.json`'s."""
    state = {"w": np.zeros(2, np.float32)}
    behind = {"generation": 4, "env_steps": 40, "solved_at": None}
    checkpoint.save(tmp_path, state, behind)
    stale = (tmp_path / "checkpoint.json").read_bytes()
    checkpoint.save(tmp_path, state, {"generation": 5, "env_steps": 50, "solved_at": {"generation": 5, "seconds": 2.5}})
    assert checkpoint.load_meta(tmp_path)["solved_at"] == {"generation": 5, "seconds": 2.5}
    (tmp_path / "checkpoint.json").write_bytes(stale)
    assert checkpoint.load_meta(tmp_path)["solved_at"] == {"generation": 5, "seconds": None}
    # An older popeval's: the counters alone in the msgpack, the target in checkpoint.json.
    payload = serialization.msgpack_serialize({"state": state, "progress": {"generation": 5, "env_steps": 50}})
    _write_wrapped(tmp_path, payload)
    (tmp_path / "checkpoint.json").write_text(json.dumps({**behind, "solved_at": {"generation": 3, "seconds": 1.0}}))
    assert checkpoint.load_meta(tmp_path) == {"generation": 5, "env_steps": 50,
                                              "solved_at": {"generation": 3, "seconds": 1.0}}


def _write_wrapped(run_dir, payload, fmt=3):
    """A checkpoint.msgpack of `payload` with a valid SHA-256 (as an attacker can write one)."""
    wrapped = {"format": fmt, "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}
    (run_dir / checkpoint.CHECKPOINT).write_bytes(serialization.msgpack_serialize(wrapped))


# ------------------------------------------------------------------ issue 61 N12: crafted checkpoints
@pytest.mark.parametrize("progress, words", [
    ({"generation": -5, "env_steps": 10}, "progress.generation must be an integer >= 0, got -5"),
    ({"generation": 3, "env_steps": "many"}, "progress.env_steps must be an integer >= 0, got 'many'"),
    ({"generation": 3, "env_steps": 10, "solved_generation": 9},
     "progress.solved_generation must be an integer from 1 to 3, got 9"),
])
def test_crafted_checkpoint_counters_are_refused_by_file_and_field(tmp_path, capsys, progress, words):
    run_dir = tmp_path / "run"
    fake_run(run_dir, generation=3)
    _write_wrapped(run_dir, serialization.msgpack_serialize({"state": {"w": np.zeros(2, np.float32)},
                                                             "progress": progress}))
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(f"{run_dir / checkpoint.CHECKPOINT}: {words}")):
        checkpoint.read(run_dir)
    assert main(["evolve", "--resume", str(run_dir), "--quiet", "--wandb=disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


@pytest.mark.parametrize("meta, words", [
    ({"generation": -5, "env_steps": 10}, "generation must be >= 0 (and finite), got -5"),
    ({"generation": 3, "env_steps": 10, "elapsed_seconds": -1.0}, "elapsed_seconds must be >= 0"),
    ({"generation": 3, "env_steps": 10, "solved_at": {"generation": 0}}, "solved_at.generation must be an integer"),
])
def test_crafted_checkpoint_json_counters_are_refused_by_file_and_field(tmp_path, meta, words):
    run_dir = tmp_path / "run"
    fake_run(run_dir, generation=3)
    (run_dir / checkpoint.META).write_text(json.dumps(meta))
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(f"{run_dir / checkpoint.META}: {words}")):
        checkpoint.read(run_dir)


def test_a_checkpoint_of_a_newer_format_says_so(tmp_path):
    run_dir = tmp_path / "run"
    fake_run(run_dir)
    _write_wrapped(run_dir, b"a layout this popeval does not know", fmt=4)
    newer = "checkpoint.msgpack: made by a newer popeval (checkpoint format 4; this popeval reads formats up to 3)"
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(newer)):
        checkpoint.read(run_dir)


def test_export_refuses_a_linked_checkpoint_and_writes_nothing(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    for name in (checkpoint.CHECKPOINT, checkpoint.META):
        elsewhere = tmp_path / f"elsewhere-{name}"
        (run_dir / name).rename(elsewhere)
        (run_dir / name).symlink_to(elsewhere)
        with pytest.raises(ValueError, match=re.escape(f"{run_dir / name}: a symbolic link")):
            export_policy(run_dir, tmp_path / "out")
        assert not (tmp_path / "out").exists()
        (run_dir / name).unlink()
        elsewhere.rename(run_dir / name)


# ------------------------------------------------------------------ issue 61 N6, N7: one check of the experiment
@pytest.mark.parametrize("command", ["eval", "render", "export", "resume"])
def test_every_command_refuses_an_edited_experiment_by_key_and_writes_nothing(finished, tmp_path, capsys, command):
    run_dir = copy_of(finished, tmp_path)
    saved = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**saved, "activation": "relu", "num_generations": 9}))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    argv = {"eval": ["eval", str(run_dir), "--episodes", "2"], "render": ["render", str(run_dir)],
            "export": ["export", str(run_dir), str(tmp_path / "out")],
            "resume": ["evolve", "--resume", str(run_dir), "--quiet", "--wandb=disabled"]}[command]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'config.json no longer matches the experiment that made the checkpoint ' \
                             '(edited: activation "tanh" -> "relu")' in err[0], err
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before and not (tmp_path / "out").exists()


def test_an_exported_controller_says_it_cannot_be_resumed_and_is_left_as_it_is(finished, tmp_path, capsys):
    exported = export_policy(finished, tmp_path / "exported")
    before = {p.name: p.read_bytes() for p in exported.iterdir()}
    capsys.readouterr()
    assert main(["evolve", "--resume", str(exported), "--num_generations=8", "--quiet", "--wandb=disabled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "an exported controller (its policies, without the strategy's state) cannot be " \
                             "resumed" in err[0], err
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == before
