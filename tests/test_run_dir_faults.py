"""The run directory under faults (issue 49 rows 1, 2, 3, 11, 13, 15): a kill while starting
never leaves it stuck, nothing is written through a symbolic link, a resumer reads under the
lock, a run that fails at once leaves no litter, a checkpoint knows its experiment, permission
bits are kept, and a finished run leaves no lock. Tiny CartPole runs, most checks without one."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import stat

import numpy as np
import pytest
from conftest import read_metrics

from popeval import checkpoint
from popeval.cli import main
from popeval.strategies import EvolveConfig, RunOptions, evolve
from popeval.strategies import run_dir as run_dir_lib
from popeval.strategies.run_dir import Lock, export_policy

TINY = dict(
    env_name="CartPole-v1", env_kwargs={"max_steps_in_episode": 50}, pop_size=8, num_rollouts=2,
    num_generations=4, hidden_sizes=[8], eval_every=2, eval_episodes=4, checkpoint_every=2,
)
QUIET = dict(wandb="disabled", progress=False)
evolve_module = importlib.import_module("popeval.strategies.evolve")  # the module, not the function


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """A finished 4-generation run; tests copy it before changing it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    evolve(EvolveConfig(**TINY), RunOptions(run_dir=str(run_dir), **QUIET))
    return run_dir


def copy_of(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "run", symlinks=True)


def fake_run(run_dir, generation=1):
    """A run directory with a config and a (tiny, not resumable) checkpoint: enough for checks
    that refuse before building anything."""
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(EvolveConfig(**TINY).to_dict()))
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
    lock, prepared = run_dir_lib.open_run(EvolveConfig(**TINY), RunOptions(run_dir=str(run_dir)))
    run_dir_lib.write_config(prepared)
    lock.release()
    assert [p.name for p in run_dir.iterdir()] == ["config.json"]
    assert run_dir_lib.read_config(run_dir) == EvolveConfig(**TINY)


def test_a_directory_with_other_files_is_still_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a popeval run directory"):
        run_dir_lib.prepare(None, RunOptions(resume=str(tmp_path)))
    with pytest.raises(ValueError, match="is not empty"):
        run_dir_lib.open_run(EvolveConfig(**TINY), RunOptions(run_dir=str(tmp_path)))
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
    longer = EvolveConfig(**{**TINY, "num_generations": 6})
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
        evolve(EvolveConfig(**TINY), RunOptions(**QUIET))  # runs/<env>-..., created by the run
    assert list((tmp_path / "runs").iterdir()) == []
    # A directory the user made is left as a resumable run, without the lock.
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        evolve(EvolveConfig(**TINY), RunOptions(run_dir=str(mine), **QUIET))
    assert sorted(p.name for p in mine.iterdir()) == ["config.json"]


# ------------------------------------------------------------------ row 13: a checkpoint knows its experiment
def test_a_checkpoint_records_its_experiment_and_refuses_an_edited_config(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    recorded = run_dir_lib.config_hash(EvolveConfig(**TINY))
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
        run_dir_lib.prepare(EvolveConfig(**TINY), RunOptions(run_dir=str(run_dir)))
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
    out = evolve(EvolveConfig(**{**TINY, "num_generations": 5}), RunOptions(resume=str(run_dir), **QUIET))
    assert out["generations"] == 5
    assert {name: stat.S_IMODE((run_dir / name).stat().st_mode) for name in private} == dict.fromkeys(private, 0o600)
    assert json.loads((run_dir / "config.json").read_text())["num_generations"] == 5
    assert checkpoint.load_meta(run_dir)["config_sha256"] == run_dir_lib.config_hash(EvolveConfig(**TINY))
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
    opened = run_dir_lib.open_shared(EvolveConfig(**{**TINY, "num_generations": 5}), RunOptions(resume=str(run_dir)),
                                     primary=True)
    opened["lock"].release()
    assert opened["meta"]["generation"] == 4 and opened["resuming"]
    assert json.loads((run_dir / "config.json").read_text()) == {**saved, "num_generations": 5}
    assert not (run_dir / ".lock").exists()
