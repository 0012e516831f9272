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

from popeval import typed_config
from popeval.environments.registry import did_you_mean
from popeval.policies import HEADS, POOLS
from popeval.typed_config import parse_overrides

__all__ = ["EvolveConfig", "RunOptions", "load_config", "parse_overrides", "config_from_dict"]

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


@dataclasses.dataclass(frozen=True)
class EvolveConfig:
    """One experiment: what is evolved, on what, for how long, and the target."""

    env_name: str = "CartPole-v1"
    env_module: str | None = None  # a module that registers env_name when imported (`my_pkg.envs`)
    env_kwargs: dict = dataclasses.field(default_factory=dict)
    num_env_steps: int | None = None
    policy: str = "mlp"  # "mlp" | "cnn" | "lstm" (an LSTM has one hidden size: `hidden_sizes: [n]`)
    hidden_sizes: tuple = (32, 32)
    activation: str = "tanh"
    conv_channels: tuple = (16,)  # a CNN policy's convolutions
    conv_kernel: tuple = (3, 3)  # their (height, width)
    conv_pool: str = "none"  # "none" | "max": flatten their output, or each channel's maximum
    head: str = "greedy"  # "greedy" | "sampled" (`popeval.policies`)
    action_std: float | None = None  # a sampled Box head's scale (half-widths); null: learned
    strategy: str = "openai_es"
    strategy_kwargs: dict = dataclasses.field(default_factory=dict)
    fitness_shaping: str = "centered_rank"
    pop_size: int = 256
    num_rollouts: int = 8
    num_generations: int = 100
    common_random_numbers: bool = True
    obs_normalization: bool = False
    compaction: bool = True  # RolloutWrapper(compaction=...): same results, faster when episodes end early
    sharded_sampling: bool = False  # each device samples only its members (Gaussian strategies)
    seed: int = 0
    target: float | None = None  # reached when the population mean fitness >= target
    stop_at_target: bool = False
    eval_every: int = 10
    eval_episodes: int = 64
    checkpoint_every: int = 10

    def __post_init__(self):
        typed_config.check_types(self)  # the Python API checks what YAML and the CLI check
        if not -(2**31) <= self.seed < 2**31:
            raise ValueError(f"seed must fit in int32 ([-2**31, 2**31)), got {self.seed}")
        for name in ("hidden_sizes", "conv_channels", "conv_kernel"):
            sizes = getattr(self, name)
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
                raise ValueError(f"{name} must be positive integers, got {list(sizes)}")
        if len(self.conv_kernel) != 2:
            raise ValueError(f"conv_kernel must be [height, width], got {list(self.conv_kernel)}")
        _check_choice("activation", self.activation, _ACTIVATIONS)
        _check_module_name(self.env_module)
        if self.num_env_steps is not None and self.num_env_steps < 1:
            raise ValueError(f"num_env_steps must be >= 1 or null, got {self.num_env_steps}")
        if self.pop_size < 2:
            raise ValueError(f"pop_size must be >= 2, got {self.pop_size}")
        if self.num_rollouts < 1 or self.num_generations < 1:
            raise ValueError("num_rollouts and num_generations must be >= 1")
        self._check_policy()
        if self.target is not None and not math.isfinite(self.target):
            raise ValueError(f"target must be a finite number or null, got {self.target}")
        if self.action_std is not None and not self.action_std > 0:
            raise ValueError(f"action_std must be > 0 or null (learned), got {self.action_std}")
        if self.eval_every < 1 or self.checkpoint_every < 1 or self.eval_episodes < 1:
            raise ValueError("eval_every, checkpoint_every and eval_episodes must be >= 1")

    def _check_policy(self) -> None:
        """The policy's settings: known names, and none that its kind does not use."""
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("head", self.head, HEADS)
        _check_choice("conv_pool", self.conv_pool, POOLS)
        if self.policy == "lstm" and len(self.hidden_sizes) != 1:
            raise ValueError(f"an LSTM policy has one hidden size (hidden_sizes: [n]), got {list(self.hidden_sizes)}")
        if self.conv_pool != "none" and self.policy != "cnn":
            raise ValueError(f"conv_pool: {self.conv_pool} pools a CNN's convolutions, and policy is {self.policy!r} "
                             "(set policy: cnn, or leave conv_pool out)")

    def to_dict(self) -> dict:
        """The JSON-able form saved as a run's `config.json`."""
        d = dataclasses.asdict(self)
        d["hidden_sizes"] = list(self.hidden_sizes)
        d["conv_channels"] = list(self.conv_channels)
        d["conv_kernel"] = list(self.conv_kernel)
        return d


#: One line per `EvolveConfig` key (`popeval evolve --help` lists them).
FIELD_HELP = {
    "env_name": "a registered environment id (popeval list-envs)",
    "env_module": ("a module to import first, which registers env_name (my_pkg.envs: installed, on PYTHONPATH or in "
                   "the current directory); the run records it, so eval, render, export and --resume import it too"),
    "env_kwargs": "environment constructor arguments or EnvParams fields, e.g. {max_steps_in_episode: 200}",
    "num_env_steps": "steps per episode (null: the environment's episode limit)",
    "policy": "mlp, cnn (convolutions on image observations, then an MLP) or lstm",
    "hidden_sizes": "hidden layer sizes of the MLP (a CNN's after its convolutions), or [n] for an LSTM of n units",
    "activation": "the MLP's hidden activation (tanh, relu, elu, gelu, sigmoid, silu, leaky_relu)",
    "conv_channels": "a CNN policy's convolution channels, one entry per layer",
    "conv_pool": "none (flatten the convolutions' output) or max (each channel's maximum over the image; policy: cnn)",
    "conv_kernel": "a CNN policy's kernel (height, width), e.g. [3, 10] for whole rows of a 10-wide image",
    "head": ("greedy (argmax of logits; tanh to a Box's bounds) or sampled (categorical; Gaussian around the "
             "tanh mean), drawn from the episode's policy keys"),
    "action_std": "a sampled Box head's scale in half-widths of the bounds (null: a learned parameter)",
    "strategy": ("an evosax algorithm or alias (openai_es, cma_es, snes, pgpe, simple_ga, ...), or eggroll "
                 "(low-rank perturbations, popeval.low_rank)"),
    "strategy_kwargs": ("strategy settings, e.g. {learning_rate: 0.05, std_init: 0.1}; eggroll: rank (1), "
                        "sigma (0.1), learning_rate (0.05), optimizer (adam), lr_decay, lr_min, member_chunk"),
    "fitness_shaping": "centered_rank, z_score or none",
    "pop_size": "population size",
    "num_rollouts": "episodes per member per generation",
    "num_generations": "generations to run (raise it to extend a finished run)",
    "common_random_numbers": "all members play the same episodes in a generation",
    "obs_normalization": "normalise observations with running statistics",
    "compaction": "gather members with running episodes into fewer chunks as others end (same results)",
    "sharded_sampling": ("each device samples only its own members and the update regenerates them from the key: "
                         "memory per device O(pop_size / devices x params), not O(pop_size x params) "
                         "(openai_es, snes, pgpe; other random numbers than evosax's ask; eggroll always does)"),
    "seed": "the run's seed (int32)",
    "target": "population mean fitness that counts as solved (null: none)",
    "stop_at_target": "stop at the first generation that reaches the target",
    "eval_every": "evaluate the mean and best policy every N generations",
    "eval_episodes": "episodes of each evaluation",
    "checkpoint_every": "checkpoint every N generations (and when the run stops)",
}


def describe_fields() -> str:
    """Every config key with its type, default and one line."""
    hints = typing.get_type_hints(EvolveConfig)
    lines = []
    for f in dataclasses.fields(EvolveConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        args = typing.get_args(hints[f.name]) or (hints[f.name],)
        kind = " or ".join("null" if a is type(None) else a.__name__ for a in args)
        lines.append(f"  {f.name} ({kind}, default {default!r}): {FIELD_HELP[f.name]}")
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
    """An `EvolveConfig` from a mapping, every key checked and typed.

    Raises:
        ValueError / TypeError naming an unknown or mistyped key.
    """
    return typed_config.from_mapping(EvolveConfig, data)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None) -> EvolveConfig:
    """Builds an `EvolveConfig` from a YAML file and overrides (`["--key=value", "--key", "value"]`,
    values in YAML syntax, or a dict).

    Raises:
        ValueError / TypeError naming an unknown or mistyped key.
    """
    return typed_config.load(EvolveConfig, path, overrides)
