"""What is evolved (`EvolveConfig`, saved with the run) and how a run is run (`RunOptions`).

    config = load_config("experiments/configs/cartpole.yaml", ["--pop_size=128"])
    evolve(config, RunOptions(run_dir="runs/cartpole", wandb="disabled"))

`EvolveConfig` is the experiment: environment, policy, strategy, budget in generations and
target. It is what `config.json` of a run holds, and all a resumed run or a saved policy
needs. `RunOptions` is this run: where it writes, whether it resumes, W&B, progress output.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from typing import Any

from popeval import typed_config
from popeval.environments.registry import did_you_mean
from popeval.policies import HEADS, POOLS
from popeval.typed_config import parse_overrides

__all__ = ["EvolveConfig", "EnvironmentConfig", "PolicyConfig", "StrategyConfig", "RunConfig", "RunOptions",
           "load_config", "parse_overrides", "config_from_dict", "FLAT_KEYS", "SECTIONS"]

#: The MLP's hidden activations (`popeval.policies`).
_ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "sigmoid", "silu", "leaky_relu")
POLICIES = ("mlp", "cnn", "lstm")

#: Keys that configs saved by popeval 0.1 carry but that describe a run, not the experiment;
#: loading a saved run ignores them.
LEGACY_RUN_KEYS = frozenset({"run_dir", "resume", "wandb", "wandb_project", "quiet", "budget"})


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}" + did_you_mean(value, choices))


def _check_module_name(name: str | None) -> None:
    """Refuses an `env_module` that is no dotted module name: a path, or a file name (`my_envs.py`
    is refused even though a package `my_envs` could hold a module `py`)."""
    if name is None or (all(part.isidentifier() for part in name.split(".")) and not name.endswith(".py")):
        return
    stem = name.removesuffix(".py").replace("/", ".").replace("\\", ".").strip(".")
    hint = f"; for the file {name} write {stem}" if all(p.isidentifier() for p in stem.split(".")) else ""
    raise ValueError(f"env_module must name a module as Python imports it (my_pkg.envs), got {name!r}{hint}")


def _field(default: Any, help_text: str, **kwargs: Any) -> Any:
    """A config field with its one line of `--help` (the only place the line is written)."""
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help_text}, **kwargs)
    return dataclasses.field(default=default, metadata={"help": help_text}, **kwargs)


def _check_sizes(name: str, sizes: tuple) -> None:
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise ValueError(f"{name} must be positive integers, got {list(sizes)}")


@dataclasses.dataclass(frozen=True)
class EnvironmentConfig:
    """What the policies play: the environment and its episodes."""

    name: str = _field("CartPole-v1", "a registered environment id (popeval list-envs)")
    module: str | None = _field(None, "a module to import first, which registers env_name (my_pkg.envs: installed, "
                                      "on PYTHONPATH or in the current directory); the run records it, so eval, "
                                      "render, export and --resume import it too")
    kwargs: dict = _field({}, "environment constructor arguments or EnvParams fields, e.g. {max_steps_in_episode: 200}")
    num_env_steps: int | None = _field(None, "steps per episode (null: the environment's episode limit)")

    def __post_init__(self):
        typed_config.check_types(self)
        _check_module_name(self.module)
        if self.num_env_steps is not None and self.num_env_steps < 1:
            raise ValueError(f"num_env_steps must be >= 1 or null, got {self.num_env_steps}")


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """The policy: its kind, its layers and its action head."""

    kind: str = _field("mlp", "mlp, cnn (convolutions on image observations, then an MLP) or lstm")
    hidden_sizes: tuple = _field((32, 32), "hidden layer sizes of the MLP (a CNN's after its convolutions), or [n] "
                                           "for an LSTM of n units")
    activation: str = _field("tanh", "the MLP's hidden activation (tanh, relu, elu, gelu, sigmoid, silu, leaky_relu)")
    conv_channels: tuple = _field((16,), "a CNN policy's convolution channels, one entry per layer")
    conv_kernel: tuple = _field((3, 3), "a CNN policy's kernel (height, width), e.g. [3, 10] for whole rows of a "
                                        "10-wide image")
    conv_pool: str = _field("none", "none (flatten the convolutions' output) or max (each channel's maximum over "
                                    "the image; policy: cnn)")
    head: str = _field("greedy", "greedy (argmax of logits; tanh to a Box's bounds) or sampled (categorical; "
                                 "Gaussian around the tanh mean), drawn from the episode's policy keys")
    action_std: float | None = _field(None, "a sampled Box head's scale in half-widths of the bounds (null: a "
                                            "learned parameter)")
    obs_normalization: bool = _field(False, "normalise observations with running statistics")

    def __post_init__(self):
        typed_config.check_types(self)
        for name in ("hidden_sizes", "conv_channels", "conv_kernel"):
            _check_sizes(name, getattr(self, name))
        if len(self.conv_kernel) != 2:
            raise ValueError(f"conv_kernel must be [height, width], got {list(self.conv_kernel)}")
        _check_choice("activation", self.activation, _ACTIVATIONS)
        _check_choice("policy", self.kind, POLICIES)
        _check_choice("head", self.head, HEADS)
        _check_choice("conv_pool", self.conv_pool, POOLS)
        if self.kind == "lstm" and len(self.hidden_sizes) != 1:
            raise ValueError(f"an LSTM policy has one hidden size (hidden_sizes: [n]), got {list(self.hidden_sizes)}")
        if self.conv_pool != "none" and self.kind != "cnn":
            raise ValueError(f"conv_pool: {self.conv_pool} pools a CNN's convolutions, and policy is {self.kind!r} "
                             "(set policy: cnn, or leave conv_pool out)")
        if self.action_std is not None and not self.action_std > 0:
            raise ValueError(f"action_std must be > 0 or null (learned), got {self.action_std}")


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    """The evolution strategy and its population."""

    name: str = _field("openai_es", "an evosax algorithm or alias (openai_es, cma_es, snes, pgpe, simple_ga, ...), "
                                    "or eggroll (low-rank perturbations, popeval.low_rank)")
    kwargs: dict = _field({}, "strategy settings, e.g. {learning_rate: 0.05, std_init: 0.1}; eggroll: rank (1), "
                              "sigma (0.1), learning_rate (0.05), optimizer (adam), lr_decay, lr_min, member_chunk")
    fitness_shaping: str = _field("centered_rank", "centered_rank, z_score or none")
    pop_size: int = _field(256, "population size")
    sharded_sampling: bool = _field(False, "each device samples only its own members and the update regenerates "
                                           "them from the key: memory per device O(pop_size / devices x params), "
                                           "not O(pop_size x params) (openai_es, snes, pgpe; other random numbers "
                                           "than evosax's ask; eggroll always does)")

    def __post_init__(self):
        typed_config.check_types(self)
        if self.pop_size < 2:
            raise ValueError(f"pop_size must be >= 2, got {self.pop_size}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The run: its budget, its episodes per member, its seed, target, evaluations and checkpoints."""

    num_generations: int = _field(100, "generations to run (raise it to extend a finished run)")
    num_rollouts: int = _field(8, "episodes per member per generation")
    common_random_numbers: bool = _field(True, "all members play the same episodes in a generation")
    compaction: bool = _field(True, "gather members with running episodes into fewer chunks as others end "
                                    "(same results)")
    seed: int = _field(0, "the run's seed (int32)")
    target: float | None = _field(None, "population mean fitness that counts as solved (null: none)")
    stop_at_target: bool = _field(False, "stop at the first generation that reaches the target")
    eval_every: int = _field(10, "evaluate the mean and best policy every N generations")
    eval_episodes: int = _field(64, "episodes of each evaluation")
    checkpoint_every: int = _field(10, "checkpoint every N generations (and when the run stops)")

    def __post_init__(self):
        typed_config.check_types(self)
        if not -(2**31) <= self.seed < 2**31:
            raise ValueError(f"seed must fit in int32 ([-2**31, 2**31)), got {self.seed}")
        if self.num_rollouts < 1 or self.num_generations < 1:
            raise ValueError("num_rollouts and num_generations must be >= 1")
        if self.target is not None and not math.isfinite(self.target):
            raise ValueError(f"target must be a finite number or null, got {self.target}")
        if self.eval_every < 1 or self.checkpoint_every < 1 or self.eval_episodes < 1:
            raise ValueError("eval_every, checkpoint_every and eval_episodes must be >= 1")


#: The sections of an `EvolveConfig`, by name.
SECTIONS = {"environment": EnvironmentConfig, "policy": PolicyConfig, "strategy": StrategyConfig, "run": RunConfig}
#: The flat keys (configs, `config.json`, `--key=value`): `{key: (section, field)}`.
FLAT_KEYS = {
    "env_name": ("environment", "name"), "env_module": ("environment", "module"),
    "env_kwargs": ("environment", "kwargs"), "num_env_steps": ("environment", "num_env_steps"),
    "policy": ("policy", "kind"), "hidden_sizes": ("policy", "hidden_sizes"), "activation": ("policy", "activation"),
    "conv_channels": ("policy", "conv_channels"), "conv_kernel": ("policy", "conv_kernel"),
    "conv_pool": ("policy", "conv_pool"), "head": ("policy", "head"), "action_std": ("policy", "action_std"),
    "strategy": ("strategy", "name"), "strategy_kwargs": ("strategy", "kwargs"),
    "fitness_shaping": ("strategy", "fitness_shaping"), "pop_size": ("strategy", "pop_size"),
    "num_rollouts": ("run", "num_rollouts"), "num_generations": ("run", "num_generations"),
    "common_random_numbers": ("run", "common_random_numbers"), "obs_normalization": ("policy", "obs_normalization"),
    "compaction": ("run", "compaction"), "sharded_sampling": ("strategy", "sharded_sampling"), "seed": ("run", "seed"),
    "target": ("run", "target"), "stop_at_target": ("run", "stop_at_target"), "eval_every": ("run", "eval_every"),
    "eval_episodes": ("run", "eval_episodes"), "checkpoint_every": ("run", "checkpoint_every"),
}


@dataclasses.dataclass(frozen=True)
class EvolveConfig:
    """One experiment: what is evolved (`environment`, `policy`), how (`strategy`), for how long
    and to what target (`run`). Each section checks its own fields.

    A config is written with flat keys (`env_name`, `pop_size`, ...: `FLAT_KEYS`, what YAML files,
    `--key=value` and a run's `config.json` hold) or with one mapping per section
    (`{strategy: {name: snes, pop_size: 64}}`); `from_flat` and `config_from_dict` read both.
    """

    environment: EnvironmentConfig = dataclasses.field(default_factory=EnvironmentConfig)
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    strategy: StrategyConfig = dataclasses.field(default_factory=StrategyConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def __post_init__(self):
        for name, cls in SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"config section {name!r}: expected {cls.__name__}, got {getattr(self, name)!r:.80}")

    @classmethod
    def from_flat(cls, **keys: Any) -> EvolveConfig:
        """An `EvolveConfig` from flat keys (`EvolveConfig.from_flat(env_name="Pendulum-v1", pop_size=64)`)."""
        return config_from_dict(keys)

    def to_dict(self) -> dict:
        """The flat, JSON-able form saved as a run's `config.json` (`FLAT_KEYS`' order)."""
        d = {key: getattr(getattr(self, section), name) for key, (section, name) in FLAT_KEYS.items()}
        return {k: list(v) if isinstance(v, tuple) else (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}


def _help(key: str) -> str:
    section, name = FLAT_KEYS[key]
    return next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == name).metadata["help"]


#: One line per flat config key (`popeval evolve --help` lists them), from the sections' fields.
FIELD_HELP = {key: _help(key) for key in FLAT_KEYS}


def describe_fields() -> str:
    """Every flat config key with its type, default and one line."""
    lines = []
    for key, (section, name) in FLAT_KEYS.items():
        cls = SECTIONS[section]
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        hint = typing.get_type_hints(cls)[name]
        args = typing.get_args(hint) or (hint,)
        kind = " or ".join("null" if a is type(None) else a.__name__ for a in args)
        lines.append(f"  {key} ({kind}, default {default!r}): {FIELD_HELP[key]}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How one run is run; none of it changes the results.

    Args:
        run_dir: the run directory (default `runs/<env>-<strategy>-seed<seed>-<time>`, an id's
            `/` written as `-`); must be empty or absent.
        resume: a run directory to continue from its last checkpoint (its saved config is
            the experiment; `num_generations` may be raised to extend it).
        wandb: `auto` (online with an API key configured, else offline), `offline`,
            `online` or `disabled`.
        wandb_project: the W&B project.
        progress: a progress bar on stderr; `None`: when stderr is a terminal.
        coordinator_address: for a run over several processes (one per host, say), process
            0's `host:port`, the same on every process (`popeval.distributed.initialize`).
            `coordinator_address`, `num_processes` and `process_id` all `None`: one process,
            unless a cluster scheduler (SLURM, Open MPI) started several. Only process 0
            writes the run directory, logs and W&B.
        num_processes: the process count of a run over several processes.
        process_id: this process's index in a run over several processes.
        distributed_timeout: seconds a process waits for the coordinator and the others to
            join before it fails.
        distributed_heartbeat: seconds after which a process that stopped answering is
            declared dead and JAX ends the run's other processes (`distributed.initialize`).
    """

    run_dir: str | None = None
    resume: str | None = None
    wandb: str = "auto"
    wandb_project: str = "popeval"
    progress: bool | None = None
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    distributed_timeout: float = 300.0
    distributed_heartbeat: float = 100.0

    def __post_init__(self):
        if self.wandb not in ("auto", "disabled", "offline", "online"):
            raise ValueError(f"wandb must be auto, disabled, offline or online, got {self.wandb!r}")
        if self.run_dir is not None and self.resume is not None:
            raise ValueError("pass either run_dir (a new run) or resume (an existing one), not both")
        if not self.distributed_timeout > 0:
            raise ValueError(f"distributed_timeout must be > 0 seconds, got {self.distributed_timeout!r}")
        if not self.distributed_heartbeat >= 1:
            raise ValueError(f"distributed_heartbeat must be >= 1 second, got {self.distributed_heartbeat!r}")


def config_from_dict(data: dict) -> EvolveConfig:
    """An `EvolveConfig` from a mapping of flat keys (`FLAT_KEYS`), of sections (`{policy: {kind:
    cnn}}`), or both, every key checked and typed.

    Raises:
        ValueError: naming an unknown or repeated key, or a value out of range.
        TypeError: naming a mistyped key.
    """
    sections: dict[str, dict] = {name: {} for name in SECTIONS}
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            for name, v in value.items():
                fields = [f.name for f in dataclasses.fields(SECTIONS[key])]
                if name not in fields:
                    raise ValueError(f"unknown config key {f'{key}.{name}'!r}" + did_you_mean(name, fields))
                _put(sections, key, name, v, f"{key}.{name}")
        elif key in FLAT_KEYS:
            _put(sections, *FLAT_KEYS[key], value, key)
        else:
            section, _, name = key.partition(".")
            if section in SECTIONS and name:  # a section's unknown field, as `flat` writes it
                fields = [f.name for f in dataclasses.fields(SECTIONS[section])]
                raise ValueError(f"unknown config key {key!r}" + did_you_mean(name, fields))
            raise ValueError(f"unknown config key {key!r}" + did_you_mean(key, [*FLAT_KEYS, *SECTIONS]))
    return EvolveConfig(**{name: _section(name, fields) for name, fields in sections.items()})


def _section(name: str, fields: dict) -> Any:
    """The section `name` from `{field: (value, the key it was given as)}`; a type error names the key."""
    try:
        return SECTIONS[name](**{k: v for k, (v, _) in fields.items()})
    except TypeError as e:
        message = str(e)
        for field, (_, key) in fields.items():
            message = message.replace(f"config key {field!r}", f"config key {key!r}")
        raise TypeError(message) from None


def _put(sections: dict, section: str, name: str, value: Any, key: str) -> None:
    """Sets a section's field once (a flat key and its section's spelling may not both be given)."""
    if name in sections[section]:
        raise ValueError(f"config key {key!r} given twice (as {sections[section][name][1]!r} too)")
    sections[section][name] = (value, key)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None) -> EvolveConfig:
    """Builds an `EvolveConfig` from a YAML file and overrides (`["--key=value", "--key", "value"]`,
    values in YAML syntax, or a dict).

    Raises:
        ValueError / TypeError naming an unknown or mistyped key.
    """
    given = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    return config_from_dict({**flat(typed_config.read(path)), **flat(given)})


def flat(data: dict) -> dict:
    """`data` with its sections' fields as flat keys (`{strategy: {pop_size: 64}}` -> `{pop_size:
    64}`); unknown keys are kept, for `config_from_dict` to name."""
    keys = {v: k for k, v in FLAT_KEYS.items()}
    out = {}
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            out.update({keys.get((key, name), f"{key}.{name}"): v for name, v in value.items()})
        else:
            out[key] = value
    return out
