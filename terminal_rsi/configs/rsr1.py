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

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.configs.base_sft import get_config as base_config
from terminal_rsi.rsr.config import RSRConfig


def get_config() -> ml_collections.ConfigDict:
    b = base_config()  # the base's model, task pool, target harness and sampler
    c = config_dict(RSRConfig, "rsr")  # the defaults, terminal_rsi/rsr/config.py
    for section in ("model", "tasks", "harness", "rollout"):
        for k in c[section]:
            c[section][k] = b[section][k]
    c.tasks.n_per_family = 4
    return c
