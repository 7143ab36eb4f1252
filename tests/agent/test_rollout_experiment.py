"""The "rollouts" experiment: config validation, a shard and stats in the workdir."""

import json

import pytest

from terminal_rsi.agent import HarnessConfig, read_shard
from terminal_rsi.config.configuration import ConfigError, validate_config
from terminal_rsi.config.registry import get_experiment


def _config():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rollouts_cfg", "configs/rollouts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


def test_rollouts_experiment_writes_shard_and_stats(tmp_path):
    config = _config()
    config.tasks.families = ("create_file", "count_lines")
    config.rollout.batch_size = 2
    config.rollout.progress = False
    exp = get_experiment("rollouts")
    validate_config(config, exp.SCHEMA)
    stats = exp.run(config, str(tmp_path))  # builds the typed RolloutsConfig first
    assert stats["kept"] == 2 and stats["success_rate"] == 1.0
    trajs = read_shard(tmp_path / "trajectories" / "shard-00000.jsonl")
    assert len(trajs) >= 2 and all(t.S == 1 for t in trajs)
    assert json.loads((tmp_path / "rollout_stats.json").read_text())["kept"] == 2


def test_rollouts_config_is_validated():
    config = _config()
    config.policy.kind = "gpt"
    with pytest.raises(ConfigError, match="policy.kind"):
        validate_config(config, get_experiment("rollouts").SCHEMA)


def test_rollouts_sample_at_the_harness_temperature():
    config = _config()
    config.harness.temperature = 0.5
    cfg = get_experiment("rollouts").check(config)
    assert HarnessConfig.from_config(cfg.harness).sampling.temperature == 0.5
