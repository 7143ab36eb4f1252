"""Collect one batch of agent episodes (terminal_rsi.agent) and write a trajectory shard.

    python experiments/run.py --config=configs/rollouts.py --workdir=/tmp/rollouts
    python experiments/run.py --config=configs/rollouts.py --config.policy.kind=tiny

Every setting, its default and what it allows: terminal_rsi/experiments/rollouts.py
(RolloutsConfig).
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.experiments.rollouts import RolloutsConfig


def get_config() -> ml_collections.ConfigDict:
    return config_dict(RolloutsConfig, "rollouts")
