"""The RL agents' shared pieces (`experiments/agents/common.py`): typed configs and run logging."""

from __future__ import annotations

import dataclasses
import json

import pytest

from experiments.agents.common import RunLogger, load_config
from popeval.sinks import read_metrics
from popeval.typed_config import check_types


@dataclasses.dataclass(frozen=True)
class _Config:
    env_name: str = "CartPole-v1"
    step_size: float = 1e-3
    batch_size: int = 8
    hidden_sizes: tuple = (64,)
    target: float | None = None

    def __post_init__(self):
        check_types(self)


def test_config_from_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("step_size: 1\nhidden_sizes: [16, 16]\n")
    config = load_config(_Config, path, ["--batch-size=4", "target=0.9"])
    assert config == _Config(step_size=1.0, batch_size=4, hidden_sizes=(16, 16), target=0.9)
    assert isinstance(config.step_size, float)
    assert load_config(_Config, None, ["step_size=1e-4"]).step_size == 1e-4  # a string in YAML 1.1
    with pytest.raises(TypeError, match="'step_size': expected float"):
        load_config(_Config, None, ["step_size=fast"])
    with pytest.raises(ValueError, match="unknown config key 'batch_sise'.*batch_size"):
        load_config(_Config, path, ["batch_sise=4"])
    with pytest.raises(TypeError, match="'batch_size': expected int"):
        load_config(_Config, path, ["batch_size=4.5"])
    with pytest.raises(TypeError, match="'batch_size'"):
        _Config(batch_size=True)  # a bool is not an int, from Python as from YAML
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(_Config, path)


def test_run_logger_writes_csv_curve_and_config(tmp_path):
    run = tmp_path / "run"
    with RunLogger(run, "test", {"a": 1}, x="frames", y=("return/mean",), target=1.0, wandb="disabled") as logger:
        for i in range(4):
            logger.log(i, {"frames": 100 * i, "return/mean": i / 4})
    rows = read_metrics(run / "metrics.csv")
    assert [float(r["return/mean"]) for r in rows] == [0.0, 0.25, 0.5, 0.75]
    assert [int(r["frames"]) for r in rows] == [0, 100, 200, 300]
    assert (run / "curve.png").stat().st_size > 1000
    assert json.loads((run / "config.json").read_text()) == {"a": 1}
    with pytest.raises(FileExistsError, match="not empty"):
        RunLogger(run, "again", {}, wandb="disabled")


def test_run_logger_keeps_the_rows_and_draws_the_curve_after_an_error(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with RunLogger(run, "crash", {}, x="frames", y=("loss",), wandb="disabled") as logger:
            logger.log(0, {"frames": 1, "loss": 2.0})
            logger.log(1, {"frames": 2, "loss": 1.0})
            raise RuntimeError("diverged")
    assert len(read_metrics(run / "metrics.csv")) == 2
    assert (run / "curve.png").exists()
