"""Collect one batch of agent episodes (terminal_rsi.agent) and write a trajectory shard.

    python experiments/run.py --config=configs/rollouts.py --workdir=/tmp/rollouts
    python experiments/run.py --config=configs/rollouts.py --config.policy.kind=tiny
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "rollouts"
    c.seed = 0
    c.policy = ml_collections.ConfigDict({"kind": "reference", "temperature": 1.0})
    c.tasks = ml_collections.ConfigDict({
        "suite": "builtin", "split": "train", "n_per_family": 1, "families": (),
        "backend": "local", "allow_plain_sandbox": "builtin"})
    c.harness = ml_collections.ConfigDict({
        "name": "json-linear", "max_turns": 8, "max_output_tokens": 2048,
        "max_input_tokens": 16384, "summarize_threshold": 8192, "agent_timeout_s": None,
        "max_observation_chars": 8000, "max_parse_errors": config_dict.placeholder(int),
        "reward_fn": "fdr"})
    c.rollout = ml_collections.ConfigDict({
        "batch_size": 8, "concurrency": 8, "oversample": 0.125, "keep_stragglers": False,
        "progress": True})
    return c
