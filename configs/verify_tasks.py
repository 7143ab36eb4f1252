"""Check tasks as a task author would: run each reference solution, verify, print a table.

    python experiments/run.py --config=configs/verify_tasks.py --workdir=/tmp/verify_tasks
    python experiments/run.py --config=configs/verify_tasks.py \
        --config.tasks.source=path/to/task_dirs --config.tasks.split=all
    python experiments/run.py --config=configs/verify_tasks.py --config.tasks.backend=docker

`tasks.source` is 'builtin' (the procedural suite) or a directory holding Terminal-Bench
(task.yaml) and/or Harbor (task.toml) task directories, or one such directory.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.experiment = "verify_tasks"
    config.seed = 0
    config.tasks = ml_collections.ConfigDict()
    config.tasks.source = "builtin"
    config.tasks.split = "all"
    config.tasks.n_per_family = 1
    config.tasks.families = ()
    config.tasks.backend = "local"
    # task directories from disk are untrusted: no plain-subprocess fallback unless asked for
    config.tasks.allow_plain_sandbox = "never"
    config.tasks.mode = ""
    config.tasks.pytest_runtime = "auto"
    config.tasks.show_reports = False
    config.tasks.fail_on_error = True
    return config
