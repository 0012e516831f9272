"""Any environment from the command line: a module named by `env_module` (`--env_module`, or the
config key), which the run records so that every later command imports it again, and installed
packages' `popeval.environments` entry points, loaded when `make` meets an unknown id. Each bad
input is one line.

The steps of a run are played in one process; between them the id and its module are
forgotten, as a new process would have them."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import sys
from types import SimpleNamespace

import pytest

from popeval import cli
from popeval.environments import make, register
from popeval.environments import registry as registry_lib
from popeval.strategies import EvolveConfig, load_config
from popeval.strategies.run import run_dir as run_dir_lib
from tests.helpers import REPO

TINY_ENVS = '''
import jax
import jax.numpy as jnp
from flax import struct

from popeval.environments import Environment, EnvParams, EnvState, register, spaces


@struct.dataclass
class TinyState(EnvState):
    x: jax.Array


class Tiny(Environment):
    """Walk along a line: actions 0 (back) and 1 (forward); the position is the reward."""

    @property
    def default_params(self):
        return EnvParams(max_steps_in_episode=5)

    def reset_state(self, key, params):
        return TinyState(time=jnp.int32(0), x=jax.random.uniform(key, ()))

    def transition(self, key, state, action, params):
        state = state.replace(x=state.x + jnp.where(action == 1, 0.1, -0.1))
        return state, state.x, state.x > 2.0

    def get_obs(self, state, params=None, key=None):
        return jnp.stack([state.x])

    def observation_space(self, params=None):
        return spaces.Box(-jnp.inf, jnp.inf, (1,))

    def action_space(self, params=None):
        return spaces.Discrete(2)
'''

#: Module name -> source: the modules a test may import (all written before the first import).
MODULES = {
    "tinyenvs": TINY_ENVS + '\nregister("Tiny-v0", Tiny)\n',
    "tinyenvs_fn": "from tinyenvs import Tiny\nfrom popeval.environments import register\n\n\n"
                   "def register_all():\n    register(\"TinyFn-v0\", Tiny)\n",
    "emptyenvs": "ANSWER = 42\n",
    "halfenvs": TINY_ENVS + '\nregister("Half-v0", Tiny)\nraise RuntimeError("the second half is broken")\n',
}

#: The smallest run: two generations of 8 members, checkpointed at each.
TINY = ["--pop_size", "8", "--num_rollouts", "1", "--num_generations", "2", "--hidden_sizes", "[4]",
        "--eval_episodes", "2", "--eval_every", "2", "--checkpoint_every", "1"]
RUN_OPTIONS = ["--wandb", "disabled", "--quiet"]


@pytest.fixture
def envs(tmp_path, monkeypatch):
    """The modules of `MODULES` importable, and a registry that forgets what a test registers."""
    where = tmp_path / "modules"
    where.mkdir()
    for name, source in MODULES.items():
        (where / f"{name}.py").write_text(source)
    importlib.invalidate_caches()
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.setattr(registry_lib, "REGISTRY", dict(registry_lib.REGISTRY))
    monkeypatch.setattr(registry_lib, "registered_envs", list(registry_lib.registered_envs))
    monkeypatch.setattr(registry_lib, "_loaded_entry_points", set())
    yield where
    for name in MODULES:
        sys.modules.pop(name, None)


def _as_a_new_process(*env_ids: str) -> None:
    """Forgets `env_ids` and the modules that registered them."""
    for env_id in env_ids:
        registry_lib.REGISTRY.pop(env_id, None)
        if env_id in registry_lib.registered_envs:
            registry_lib.registered_envs.remove(env_id)
    for name in MODULES:
        sys.modules.pop(name, None)


def _entry_points(monkeypatch, *entries) -> list:
    """Installed packages' `popeval.environments` entry points, faked: `(distribution, name, value)`."""
    calls = []

    class FakeEntryPoint:
        def __init__(self, dist, name, value):
            self.dist, self.name, self.value = SimpleNamespace(name=dist), name, value

        def load(self):
            return importlib.metadata.EntryPoint(self.name, self.value, registry_lib.ENTRY_POINT_GROUP).load()

    def entry_points(group=None):
        calls.append(group)
        return [FakeEntryPoint(*e) for e in entries] if group == registry_lib.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return calls


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err.strip()


# ------------------------------------------------------------------ --env_module, recorded by the run
def test_a_module_named_on_the_command_line_is_imported_again_by_every_later_command(envs, tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "controller"
    assert cli.main(["evolve", "--env_module", "tinyenvs", "--env_name", "Tiny-v0", "--run_dir", str(run),
                     *TINY, *RUN_OPTIONS]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["env_module"] == "tinyenvs" and saved["env_name"] == "Tiny-v0"  # part of the experiment
    steps = [["eval", str(run), "--episodes", "2"], ["export", str(run), str(out)], ["eval", str(out), "--episodes=2"],
             ["evolve", "--resume", str(run), "--num_generations", "3", *RUN_OPTIONS]]
    for argv in steps:
        _as_a_new_process("Tiny-v0")
        capsys.readouterr()
        assert cli.main(argv) == 0, capsys.readouterr().err
        assert "Tiny-v0" in registry_lib.REGISTRY and "tinyenvs" in sys.modules, argv  # imported again
    assert json.loads((run / "result.json").read_text())["generations"] == 3


def test_env_module_is_a_config_key_in_yaml_and_on_the_command_line(tmp_path):
    (tmp_path / "tiny.yaml").write_text("env_module: my_pkg.envs\nenv_name: MyEnv-v0\n")
    for config in (load_config(tmp_path / "tiny.yaml"), load_config(None, ["--env_module=my_pkg.envs"]),
                   load_config(None, ["--env_module", "my_pkg.envs"]), load_config(None, ["--env-module=my_pkg.envs"])):
        assert config.environment.module == "my_pkg.envs"
    assert EvolveConfig().environment.module is None and "env_module" in EvolveConfig().to_dict()


def test_runs_without_env_module_keep_their_experiment_hash():
    """Most shipped controllers' config.json files predate the key: the hash a checkpoint made of
    such a file still matches (the file's own keys are hashed), and they load with no module."""
    older = [f for f in sorted((REPO / "experiments" / "controllers").glob("*/config.json"))
             if "env_module" not in json.loads(f.read_text())]
    assert len(older) >= 20
    for config_file in older:
        saved = json.loads(config_file.read_text())
        made_by = {"config_sha256": run_dir_lib.config_hash(saved)}  # what a checkpoint of that run records
        run_dir_lib.check_experiment(config_file.parent, made_by)
        config = run_dir_lib.read_config(config_file.parent)
        assert config.environment.module is None and run_dir_lib.config_hash(config) != made_by["config_sha256"]


def test_a_file_in_the_current_directory_is_found_by_the_command(envs, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    (here / "hereenvs.py").write_text(TINY_ENVS + '\nregister("Here-v0", Tiny)\n')
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(here))])  # as the `popeval` script
    monkeypatch.delitem(sys.modules, "hereenvs", raising=False)
    cli._search_working_directory()
    assert sys.path[-1] == str(here)  # last: it never hides an installed package
    cli._search_working_directory()
    assert sys.path.count(str(here)) == 1
    importlib.invalidate_caches()
    assert registry_lib.import_env_module("hereenvs") == ["Here-v0"]
    sys.modules.pop("hereenvs", None)


# ------------------------------------------------------------------ entry points
def test_an_installed_package_s_entry_point_registers_its_ids_when_an_unknown_id_is_asked_for(envs, tmp_path,
                                                                                              monkeypatch):
    calls = _entry_points(monkeypatch, ("tiny-envs", "tiny", "tinyenvs"),
                          ("tiny-envs", "tiny_fn", "tinyenvs_fn:register_all"))
    make("CartPole-v1")
    assert calls == []  # a known id loads nothing
    env, params = make("Tiny-v0")
    assert calls == [registry_lib.ENTRY_POINT_GROUP] and params.max_steps_in_episode == 5
    assert "TinyFn-v0" in registry_lib.REGISTRY  # a function named by the entry point is called
    with pytest.raises(ValueError, match="Unknown environment id 'Tiny-v9'"):
        make("Tiny-v9")
    assert registry_lib.load_entry_points() == []  # each entry point is loaded once
    run = tmp_path / "run"
    for argv in (["evolve", "--env_name", "Tiny-v0", "--run_dir", str(run), *TINY, *RUN_OPTIONS],
                 ["eval", str(run), "--episodes", "2"]):
        _as_a_new_process("Tiny-v0", "TinyFn-v0")
        registry_lib._loaded_entry_points.clear()
        assert cli.main(argv) == 0
        assert "Tiny-v0" in registry_lib.REGISTRY
    assert json.loads((run / "config.json").read_text())["env_module"] is None  # no module to record
    _entry_points(monkeypatch)  # the package gone: eval can name the module itself
    _as_a_new_process("Tiny-v0", "TinyFn-v0")
    assert cli.main(["eval", str(run), "--episodes", "2", "--env_module", "tinyenvs"]) == 0


def test_an_entry_point_that_fails_is_a_warning_and_the_others_still_work(envs, monkeypatch, caplog):
    _entry_points(monkeypatch, ("broken-envs", "broken", "no_such_module_xyz"), ("tiny-envs", "tiny", "tinyenvs"))
    with caplog.at_level(logging.WARNING, logger="popeval"):
        env, _ = make("Tiny-v0")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert ("broken-envs's popeval.environments entry point broken = no_such_module_xyz failed" in warnings[0]
            and "ModuleNotFoundError: No module named 'no_such_module_xyz'" in warnings[0])


# ------------------------------------------------------------------ bad input, one line each
def test_a_module_that_does_not_import_is_one_line(envs, tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["evolve", "--env_module", "my_pkg.envs", "--env_name", "MyEnv-v0", "--run_dir", str(run),
                     *TINY, *RUN_OPTIONS]) == 2
    assert _error_line(capsys).startswith(
        "popeval evolve: error: env_module my_pkg.envs: ModuleNotFoundError: No module named 'my_pkg'; install the "
        "package that holds it, or run popeval in the directory that holds it")
    assert not run.exists()  # refused before anything is written
    assert cli.main(["evolve", "--env_module", "halfenvs", "--env_name", "Half-v0", "--run_dir", str(run),
                     *TINY, *RUN_OPTIONS]) == 2
    assert _error_line(capsys) == ("popeval evolve: error: env_module halfenvs: RuntimeError: the second half is "
                                   "broken")
    assert "Half-v0" not in registry_lib.REGISTRY  # what it registered before failing is forgotten


def test_a_module_that_registers_nothing_is_one_line(envs, tmp_path, capsys):
    assert cli.main(["evolve", "--env_module", "emptyenvs", "--env_name", "Tiny-v0", "--run_dir", str(tmp_path / "run"),
                     *TINY, *RUN_OPTIONS]) == 2
    assert _error_line(capsys) == ("popeval evolve: error: env_module emptyenvs: registered no environment; "
                                   "importing it must call popeval.environments.register(env_id, factory)")


def test_a_file_name_for_env_module_is_refused_with_the_module_name():
    with pytest.raises(ValueError, match=r"env_module must name a module .*got 'my_envs.py'; for the file "
                                         r"my_envs.py write my_envs$"):
        EvolveConfig.from_flat(env_module="my_envs.py")
    with pytest.raises(ValueError, match="write my_pkg.envs$"):
        EvolveConfig.from_flat(env_module="my_pkg/envs.py")


def test_an_unknown_id_names_the_close_ones_and_the_ways_to_register_one(envs, monkeypatch):
    _entry_points(monkeypatch)
    registry_lib.import_env_module("tinyenvs")
    with pytest.raises(ValueError) as unknown:
        make("Tiny-v1")
    text = str(unknown.value)
    assert "\n" not in text and text.startswith("Unknown environment id 'Tiny-v1' (not in registered_envs).")
    assert "Did you mean 'Tiny-v0'" in text
    for way in ("--env_module my_pkg.envs", "env_module: in the config", "'popeval.environments' entry point",
                "popeval.environments.register(env_id, factory)"):
        assert way in text


def test_an_id_registered_twice_names_both_factories(envs):
    registry_lib.import_env_module("tinyenvs")

    def other(**kwargs):
        raise AssertionError("never called")

    with pytest.raises(ValueError) as twice:
        register("Tiny-v0", other)
    assert str(twice.value) == (f"register('Tiny-v0', {__name__}.{other.__qualname__}): 'Tiny-v0' is already "
                                "registered to tinyenvs.Tiny; ids are never replaced, pick another id")


def _divides_by_zero(**kwargs):
    return 1 / 0


def _looks_up_a_missing_key(**kwargs):
    return {}["size"]


def test_a_factory_that_raises_is_one_line_naming_the_id(envs, tmp_path, capsys):
    register("Zero-v0", _divides_by_zero)
    register("Missing-v0", _looks_up_a_missing_key)
    with pytest.raises(ZeroDivisionError) as raised:  # the factory's own error type, where it takes a message
        make("Zero-v0")
    assert str(raised.value) == f"make('Zero-v0'): its factory {__name__}._divides_by_zero failed: division by zero"
    with pytest.raises(RuntimeError) as raised:
        make("Missing-v0")
    assert str(raised.value) == (f"make('Missing-v0'): its factory {__name__}._looks_up_a_missing_key raised "
                                 "KeyError: 'size'")
    assert cli.main(["evolve", "--env_name", "Zero-v0", "--run_dir", str(tmp_path / "run"), *TINY, *RUN_OPTIONS]) == 2
    assert _error_line(capsys).startswith("popeval evolve: error: ZeroDivisionError: make('Zero-v0'): its factory")
