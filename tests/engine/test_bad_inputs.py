"""Bad inputs get one-line errors naming the file, key or argument and what is allowed
(issue 49 rows 10, 12 and 14; the new user's items of issue 50). Everything here fails
before any program is compiled, in this process."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
from flax import serialization

from popeval import MLPPolicy, ParamReshaper, RolloutWrapper, checkpoint, cli, make, normalization
from popeval.policies import CNNPolicy, LSTMPolicy
from popeval.strategies import EvolveConfig, load_config, make_strategy, parse_overrides
from tests.helpers import REPO

CARTPOLE = REPO / "experiments" / "configs" / "cartpole.yaml"
TINY = ["--config", str(CARTPOLE), "--pop_size=8", "--num_rollouts=1", "--num_generations=2",
        "--num_env_steps=20", "--wandb=disabled", "--quiet"]


def cli_error(capsys, argv: list[str]) -> str:
    """`popeval ARGV`'s error line (exit code 2, one line on stderr)."""
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(f"popeval {argv[0]}: error: "), err
    assert "Traceback" not in "\n".join(err) and "--debug" not in err[-1], err
    return err[-1]


# ------------------------------------------------------------------ run directories (row 10)
def _saved(run_dir: Path, generation: int = 3) -> Path:
    """A checkpoint of a small state at `generation`, and a valid `config.json`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(EvolveConfig.from_flat(pop_size=8).to_dict()))
    checkpoint.save(run_dir, {"a": np.zeros(2, np.float32)},
                    {"generation": generation, "env_steps": 10, "elapsed_seconds": 1.0, "wandb_id": None,
                     "solved_at": None})
    return run_dir


@pytest.mark.parametrize("meta, words", [
    ([1, 2], "checkpoint metadata must be a JSON object, got list"),
    ({"generation": 3, "env_steps": 10, "elapsed_seconds": "x"}, "elapsed_seconds must be a number or null"),
    ({"generation": 3, "env_steps": 10, "solved_at": 7}, "solved_at must be an object or null"),
])
def test_checkpoint_metadata_of_the_wrong_types_is_named(tmp_path, meta, words):
    run_dir = _saved(tmp_path / "run")
    (run_dir / checkpoint.META).write_text(json.dumps(meta))
    with pytest.raises(checkpoint.CheckpointError, match=f"checkpoint.json: {words}"):
        checkpoint.load_meta(run_dir)


def test_checkpoint_metadata_error_is_one_cli_line(tmp_path, capsys):
    run_dir = _saved(tmp_path / "run")
    (run_dir / checkpoint.META).write_text("[1, 2]")
    line = cli_error(capsys, ["eval", str(run_dir)])
    assert f"{run_dir / checkpoint.META}: checkpoint metadata must be a JSON object" in line


@pytest.mark.parametrize("text", ["garbage{", "[1, 2]", '{"pop_size": "x"}'])
def test_garbage_config_json_is_named(tmp_path, capsys, text):
    run_dir = _saved(tmp_path / "run")
    (run_dir / "config.json").write_text(text)
    for argv in (["eval", str(run_dir)], ["evolve", "--resume", str(run_dir), "--wandb=disabled"]):
        assert f"{run_dir / 'config.json'}: " in cli_error(capsys, argv)


def test_checksummed_checkpoint_with_an_object_array_is_refused(tmp_path):
    run_dir = _saved(tmp_path / "run")
    objects = msgpack.ExtType(1, msgpack.packb(((1,), "object", b"\0" * 8)))  # flax's ndarray encoding
    payload = msgpack.packb({"state": {"a": objects}, "progress": {"generation": 3, "env_steps": 10}})
    wrapped = {"format": 3, "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}
    (run_dir / checkpoint.CHECKPOINT).write_bytes(serialization.msgpack_serialize(wrapped))
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint.msgpack: not a loadable checkpoint"):
        checkpoint.load_meta(run_dir)


def test_a_full_disk_names_the_file_and_the_saved_generation(tmp_path, monkeypatch):
    run_dir = _saved(tmp_path / "run", generation=3)

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", no_space)
    with pytest.raises(OSError) as failed:
        checkpoint.save(run_dir, {"a": np.ones(2, np.float32)}, {"generation": 4, "env_steps": 20})
    with pytest.raises(OSError) as other:  # any other file popeval writes is named too
        checkpoint.atomic_write(run_dir / "result.json", b"{}")
    monkeypatch.undo()
    line = cli._one_line(failed.value)
    assert line == (f"No space left on device while writing {run_dir / checkpoint.CHECKPOINT}; "
                    f"{run_dir} keeps the checkpoint of generation 3")
    assert cli._one_line(other.value) == f"No space left on device: {run_dir / 'result.json'}"
    assert checkpoint.load_meta(run_dir)["generation"] == 3
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint.json", "checkpoint.msgpack", "config.json"]


def test_new_run_over_a_run_says_resume_in_each_interface_s_words(tmp_path, capsys):
    run_dir = _saved(tmp_path / "run")
    line = cli_error(capsys, ["evolve", *TINY, "--run_dir", str(run_dir)])
    assert f"--resume {run_dir}" in line and "pass resume=" not in line
    assert f"RunOptions(resume='{run_dir}')" in line  # the Python API's spelling, named as such


@pytest.mark.parametrize("out", ["dir", "x.png", "x"])
def test_render_refuses_an_output_that_is_not_a_gif_before_playing(tmp_path, capsys, out):
    (tmp_path / "dir").mkdir()
    # No run directory at all: the output is checked first, before any episode is computed.
    line = cli_error(capsys, ["render", str(tmp_path / "no-run"), "--out", str(tmp_path / out)])
    assert f"--out {tmp_path / out}: " in line and ".gif" in line


# ------------------------------------------------------------------ configs (rows 10, 12; issue 50)
def test_env_params_beyond_int32_name_the_range(tmp_path, capsys):
    line = cli_error(capsys, ["evolve", *TINY, "--run_dir", str(tmp_path / "r"),
                              "--env_kwargs={max_steps_in_episode: 1000000000000}"])
    assert "max_steps_in_episode=1000000000000 is out of range, expected an integer in [1, 2147483647]" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", [1.5, 2.0**40])
def test_integer_env_params_refuse_fractions(value):
    with pytest.raises(ValueError, match="max_steps_in_episode=.* an integer in \\[1, 2147483647\\]"):
        make("CartPole-v1", max_steps_in_episode=value)
    assert make("CartPole-v1", max_steps_in_episode=200.0)[1].max_steps_in_episode == 200  # whole: fine


def test_env_kwargs_fraction_is_refused_by_the_cli(tmp_path, capsys):
    line = cli_error(capsys, ["evolve", *TINY, "--run_dir", str(tmp_path / "r"),
                              "--env_kwargs={max_steps_in_episode: 1.5}"])
    assert "max_steps_in_episode=1.5 must be an integer" in line


def test_unknown_optimizer_lists_optax_names(tmp_path, capsys):
    line = cli_error(capsys, ["evolve", *TINY, "--run_dir", str(tmp_path / "r"),
                              "--strategy_kwargs={optimizer: adamx}"])
    assert "optimizer must be an optax optimizer name, got 'adamx' (did you mean 'adamax'?)" in line
    assert "adam, " in line and "sgd" in line
    with pytest.raises(ValueError, match="got 'chain'"):  # an optax function, not an optimizer
        make_strategy("openai_es", 4, {"w": jnp.zeros(3)}, optimizer="chain")


@pytest.mark.parametrize("target", [".nan", ".inf"])
def test_non_finite_target_is_refused(target):
    with pytest.raises(ValueError, match="target must be a finite number or null"):
        load_config(CARTPOLE, [f"--target={target}"])
    with pytest.raises(ValueError, match="target must be a finite number"):
        EvolveConfig.from_flat(target=math.nan)


def test_duplicate_yaml_keys_are_refused(tmp_path):
    config = tmp_path / "dup.yaml"
    config.write_text("pop_size: 8\nseed: 1\npop_size: 16\n")
    with pytest.raises(ValueError, match=f"{config}: key 'pop_size' appears twice \\(line 3\\)"):
        load_config(config)
    with pytest.raises(ValueError, match="override 'strategy_kwargs=.*': key 'std_init' appears twice"):
        parse_overrides(["--strategy_kwargs={std_init: 0.1, std_init: 0.2}"])
    merged = tmp_path / "merge.yaml"  # a merge key's keys may be overridden: no duplicate
    merged.write_text("base: &b {x: 1}\nenv_kwargs:\n  <<: *b\n  x: 2\n")
    assert parse_overrides([f"--a={merged.read_text()}"])["a"]["env_kwargs"] == {"x": 2}


def test_flow_mapping_without_a_space_gets_a_hint(capsys):
    line = cli_error(capsys, ["evolve", *TINY, "--strategy_kwargs={learning_rate:0.1}"])
    assert "key 'learning_rate:0.1' has no value; YAML needs a space after the colon ({learning_rate: 0.1}" in line


def test_numbers_in_exponent_notation_are_numbers_at_any_depth(tmp_path):
    """Issue 61 N10: YAML 1.1 read `1e-3` as a string inside mappings; YAML 1.2's rule, everywhere."""
    config = tmp_path / "x.yaml"
    config.write_text("target: 1e2\nstrategy_kwargs:\n  learning_rate: 3e-2\n  std_init: 1.0e-1\n")
    loaded = load_config(config)
    assert loaded.run.target == 100.0 and loaded.strategy.kwargs == {"learning_rate": 0.03, "std_init": 0.1}
    assert all(isinstance(v, float) for v in loaded.strategy.kwargs.values())
    overridden = load_config(config, ["--strategy_kwargs={learning_rate: 1e-3}", "--env_kwargs={gravity: 1e1}",
                                      "--target", "-5E-1"])
    assert overridden.strategy.kwargs == {"learning_rate": 1e-3} and overridden.environment.kwargs == {"gravity": 10.0}
    assert overridden.run.target == -0.5
    assert parse_overrides(["--x=[1e3, .5e1, '1e3', 1e, 7]"])["x"] == [1000.0, 5.0, "1e3", "1e", 7]


def test_policy_and_env_params_that_make_no_sense_are_refused(tmp_path, capsys):
    """Issue 61 N13: `conv_pool: max` without a CNN, and an infinite physical constant."""
    with pytest.raises(ValueError, match="conv_pool: max pools a CNN's convolutions, and policy is 'mlp'"):
        EvolveConfig.from_flat(conv_pool="max")
    line = cli_error(capsys, ["evolve", *TINY, "--run_dir", str(tmp_path / "r"), "--env_kwargs={length: .inf}"])
    assert "CartPole-v1 (cartpole.EnvParams): length=inf is infinite, expected finite values in (0, inf)" in line
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="gravity=-inf is infinite"):
        make("CartPole-v1", gravity=-math.inf)


# ------------------------------------------------------------------ the Python API (row 14; issue 50)
@pytest.fixture(scope="module")
def cartpole():
    """`(env, params, policy, one policy's params, population of 3, wrapper)` on CartPole."""
    env, env_params = make("CartPole-v1")
    policy = MLPPolicy.for_env(env, env_params, hidden_sizes=(8,))
    params = policy.init_params(jax.random.key(0), env, env_params)
    pop = jax.tree.map(lambda x: jnp.stack([x] * 3), params)
    return env, env_params, policy, params, pop, RolloutWrapper(policy.apply, env_name="CartPole-v1",
                                                                  num_env_steps=20)


def test_no_members_or_no_episodes_is_refused(cartpole):
    *_, pop, wrapper = cartpole
    keys = jax.random.split(jax.random.key(1), 2)
    with pytest.raises(ValueError, match="P=0 members"):
        wrapper.population_fitness(keys, jax.tree.map(lambda x: x[:0], pop))
    with pytest.raises(ValueError, match=r"keys have shape \(0,\).*P and B must be >= 1"):
        wrapper.population_fitness(keys[:0], pop)


@pytest.mark.parametrize("build, words", [
    (lambda: MLPPolicy(2, hidden_sizes=(0,)), "MLPPolicy: hidden_sizes must be positive integers, got (0,)"),
    (lambda: MLPPolicy(0), "MLPPolicy: num_outputs must be an integer >= 1"),
    (lambda: LSTMPolicy(2, hidden_size=0), "LSTMPolicy: hidden_size must be an integer >= 1"),
    (lambda: CNNPolicy(2, conv_channels=(16, -1)), "CNNPolicy: conv_channels must be positive integers"),
    (lambda: CNNPolicy(2, kernel_size=(3, 0)), "CNNPolicy: kernel_size must be positive integers"),
    (lambda: CNNPolicy(2, kernel_size=(3,)), "CNNPolicy: kernel_size must be (height, width), got (3,)"),
    (lambda: MLPPolicy(2, activation="tanhh"), "MLPPolicy: activation must name a flax.linen activation"),
])
def test_policy_settings_are_checked_when_built(build, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_parameters_of_another_shape_name_expected_and_given(cartpole):
    env, env_params, policy, params, pop, wrapper = cartpole
    keys = jax.random.split(jax.random.key(1), 2)
    flat = ParamReshaper(params).flatten_population(pop)
    with pytest.raises(ValueError, match=r"pop_params do not fit this policy on CartPole-v1 \(shapes per member\): "
                                         r"expected \{params.Dense_0.bias: \(8,\), .*got an array of shape \(58,\)"):
        wrapper.population_fitness(keys, flat)
    pendulum, pendulum_params = make("Pendulum-v1")
    theirs = MLPPolicy.for_env(pendulum, pendulum_params, hidden_sizes=(8,)).init_params(
        jax.random.key(0), pendulum, pendulum_params)
    with pytest.raises(ValueError, match=r"params.Dense_0.kernel has shape \(3, 8\), expected \(4, 8\)"):
        wrapper.population_fitness(keys, jax.tree.map(lambda x: jnp.stack([x] * 3), theirs))
    with pytest.raises(ValueError, match=r"policy_params do not fit .*got an array of shape \(58,\)"):
        wrapper.single_rollout(keys[0], ParamReshaper(params).flatten(params))


@pytest.fixture(scope="module")
def normalising(cartpole):
    _, _, policy, *_ = cartpole
    return RolloutWrapper(policy.apply, env_name="CartPole-v1", num_env_steps=20, obs_normalization=True)


@pytest.mark.parametrize("stats, words", [
    (normalization.init((3,)), r"expected ObsStats\(count \(\), mean \(4,\), m2 \(4,\)\).*got shapes count \(\), "
                               r"mean \(3,\)"),
    ({}, r"expected ObsStats\(count \(\), mean \(4,\).* got dict"),
    (1.0, r"expected ObsStats.* got float 1.0"),
    (normalization.init((4,)).replace(count=jnp.float32(jnp.nan)), "count nan; count and m2 must be finite"),
    (normalization.init((4,)).replace(count=jnp.float32(-2)), "count -2; count and m2 must be finite and >= 0"),
    (normalization.init((4,)).replace(m2=jnp.full(4, -1.0)), "a non-finite or negative m2"),
])
def test_bad_obs_stats_are_refused(cartpole, normalising, stats, words):
    *_, pop, _ = cartpole
    with pytest.raises(ValueError, match="obs_stats: " + words):
        normalising.population_fitness(jax.random.split(jax.random.key(1), 2), pop, obs_stats=stats)


def test_obs_stats_values_are_checked_only_when_concrete():
    stats = normalization.init((4,)).replace(count=jnp.float32(-1))
    jax.make_jaxpr(lambda s: normalization.check(s, (4,)).count)(stats)  # traced: no values to check
    with pytest.raises(ValueError, match="count -1"):
        normalization.check(stats, (4,))


def test_obs_stats_for_a_wrapper_that_does_not_normalise(cartpole):
    *_, pop, wrapper = cartpole
    with pytest.raises(ValueError, match="obs_stats given, but this RolloutWrapper does not normalise"):
        wrapper.population_fitness(jax.random.split(jax.random.key(1), 2), pop, obs_stats=normalization.init((4,)))


def test_step_with_another_environment_s_state(cartpole):
    env, env_params, *_ = cartpole
    pendulum, pendulum_params = make("Pendulum-v1")
    _, theirs = pendulum.reset(jax.random.key(0), pendulum_params)
    cases = ((None, "state is None, expected a .*cartpole.EnvState"),
             (theirs, "state is a .*pendulum.EnvState, expected a .*cartpole.EnvState"),
             (theirs.replace(last_u=None), "state is a .*pendulum.EnvState, expected a .*cartpole.EnvState"))
    for state, words in cases:
        for step in (env.step, env.step_env, jax.jit(env.step)):
            with pytest.raises(TypeError, match=f"CartPole-v1: {words}; a state must have the structure of what "
                                                "this environment's reset or step returned"):
                step(jax.random.key(0), state, 0, env_params)


def test_a_state_with_a_field_of_the_wrong_structure_is_refused_by_name():
    env, params = make("Pendulum-v1")
    _, state = env.reset(jax.random.key(0), params)
    for step in (env.step, env.step_env, jax.jit(env.step)):
        with pytest.raises(TypeError, match=r"Pendulum-v1: state.last_u is None, expected an array;"):
            step(jax.random.key(1), state.replace(last_u=None), jnp.zeros(1), params)
        with pytest.raises(TypeError, match=r"Pendulum-v1: state.theta is a builtins.tuple, expected an array;"):
            step(jax.random.key(1), state.replace(theta=(state.theta, state.theta)), jnp.zeros(1), params)


def test_nan_env_params_built_directly_are_refused_by_the_wrapper(cartpole):
    env, env_params, policy, params, pop, wrapper = cartpole
    nan_gravity = type(env_params)(gravity=math.nan)  # not through `replace`: unchecked until used
    with pytest.raises(ValueError, match=r"CartPole-v1 \(cartpole.EnvParams\): gravity=nan is NaN"):
        RolloutWrapper(policy.apply, env_name="CartPole-v1", env_params=nan_gravity)
    with pytest.raises(ValueError, match="gravity=nan is NaN"):
        wrapper.population_fitness(jax.random.split(jax.random.key(1), 2), pop, env_params=nan_gravity)


def test_box_in_a_traced_error_shows_shape_and_dtype():
    env, env_params = make("Pendulum-v1")
    _, state = env.reset(jax.random.key(0), env_params)
    with pytest.raises(ValueError) as failed:
        jax.jit(env.step)(jax.random.key(0), state, jnp.zeros(3), env_params)
    assert str(failed.value) == "Pendulum-v1: action has shape (3,), expected Box(shape=(1,), dtype=float32)"


def test_suite_adapters_name_the_extra(monkeypatch):
    import popeval.environments.suites as suites

    monkeypatch.setitem(sys.modules, "navix", None)  # as if navix were not installed
    with pytest.raises(ModuleNotFoundError, match=r'navix_env needs the navix package.*"popeval\[suites\]"'):
        suites.navix_env  # noqa: B018 - the attribute access imports the adapter
