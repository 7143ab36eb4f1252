"""Static HTML report of a run (docs/report.md):

    python experiments/run.py --config=configs/report.py --config.run=runs/main

writes runs/main/report/index.html; open it from disk (no server, no network).
`config.run` may also be a single stage dir (e.g. a rpr_phase workdir). Every setting, its
default and what it allows: terminal_rsi/experiments/report.py (ReportConfig).
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.experiments.report import ReportConfig


def get_config() -> ml_collections.ConfigDict:
    return config_dict(ReportConfig, "report")
