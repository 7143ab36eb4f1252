"""Check tasks as a task author would: run each reference solution, verify, print a table.

    python experiments/run.py --config=configs/verify_tasks.py --workdir=/tmp/verify_tasks
    python experiments/run.py --config=configs/verify_tasks.py \
        --config.tasks.source=path/to/task_dirs --config.tasks.split=all
    python experiments/run.py --config=configs/verify_tasks.py --config.tasks.backend=docker

`tasks.source` is 'builtin' (the procedural suite) or a directory holding Terminal-Bench
(task.yaml) and/or Harbor (task.toml) task directories, or one such directory. Every setting,
its default and what it allows: terminal_rsi/experiments/verify_tasks.py (VerifyTasksConfig).
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.experiments.verify_tasks import VerifyTasksConfig


def get_config() -> ml_collections.ConfigDict:
    return config_dict(VerifyTasksConfig, "verify_tasks")
