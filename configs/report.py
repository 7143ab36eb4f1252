"""Static HTML report of a run (docs/report.md):

    python experiments/run.py --config=configs/report.py --config.run=runs/main

writes runs/main/report/index.html; open it from disk (no server, no network).
`config.run` may also be a single stage dir (e.g. a rpr_phase workdir).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.experiment = "report"
    config.seed = 0
    config.run = ""  # required: run dir (ledger.json) or stage dir
    config.output = ""  # '' = <run>/report
    config.title = ""
    config.max_episodes_per_shard = 32
    config.max_train_shards = 8
    return config
