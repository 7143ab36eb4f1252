"""RSR-1 (paper §2.1, Fig. 2): the first Recursive Self-Rewrite stage (terminal_rsi.rsr.stage).

    python experiments/run.py --config=configs/base_sft.py --workdir=/tmp/base
    python experiments/run.py --config=configs/rsr1.py --workdir=/tmp/rsr1 \
        --config.init.actor_weights=/tmp/base/export

Tiny default: discovery under the `hot` harness (the actor at a higher temperature, several
samples) and the `external` harness, whose policy is the tasks' reference-solution policy
(an external policy given as a callable; for built-in tasks it is the only source of
successes the tiny actor cannot find itself); the digest planner (the tiny model cannot
plan); K = 1 digest runbook per success (the policy planner uses planner.k = 4), M = 4
fresh executions per runbook. Model, harness and tasks match configs/base_sft.py.
"""

import ml_collections
from ml_collections import config_dict

from configs.base_sft import get_config as base_config


def get_config() -> ml_collections.ConfigDict:
    b = base_config()
    c = ml_collections.ConfigDict()
    c.experiment = "rsr"
    c.seed = 0
    c.model = b.model
    c.init = ml_collections.ConfigDict({  # placeholders: settable from the command line
        "actor_weights": config_dict.placeholder(str),
        "critic_weights": config_dict.placeholder(str)})
    c.tasks = b.tasks
    c.tasks.n_per_family = 4
    del c.tasks["eval_split"], c.tasks["eval_n_per_family"]  # the pipeline evaluates stages
    c.harness = b.harness
    c.rollout = b.rollout
    c.discovery = ml_collections.ConfigDict({
        "harnesses": ("hot", "external"),
        "hints": ("Read the files the task names before you act.",
                  "Write outputs exactly where the task asks."),
        "hot_temperature": 1.3, "hot_samples": 2, "long_factor": 2, "max_per_task": 1})
    c.planner = ml_collections.ConfigDict({
        "kind": "digest", "k": 4, "max_tokens": 384, "temperature": 1.0})
    c.execution = ml_collections.ConfigDict({"m": 4, "instruction": config_dict.placeholder(str)})
    c.sft = ml_collections.ConfigDict({
        "steps": 60, "epochs": config_dict.placeholder(float), "batch_size": 8,
        "num_microbatches": 1, "aggregation": "sequence_sum", "rehearsal_samples": 0})
    c.actor_opt = ml_collections.ConfigDict({
        "learning_rate": 5e-4, "weight_decay": 0.0, "grad_clip": 1.0, "warmup_steps": 0,
        "schedule": "constant", "end_lr_ratio": 0.1})
    c.eval = ml_collections.ConfigDict({"rewritten": True, "temperature": 0.0})
    return c
