"""Offline fixed-trajectory rescoring (paper §3.4, Appendix B): FDR vs SPR, old vs
recalibrated family divisors, outcome labels unchanged.

    python experiments/run.py --config=configs/rescore.py --workdir=/tmp/rescore
    python experiments/run.py --config=configs/rescore.py \
        --config.rescore.trajectories=my_episodes.jsonl --config.rescore.divisors=''

The defaults rescore the small synthetic demo shipped in terminal_rsi/rewards/data/. Every
setting, its default and what it allows: terminal_rsi/experiments/rescore.py (RescoreConfig).
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.experiments.rescore import RescoreConfig


def get_config() -> ml_collections.ConfigDict:
    return config_dict(RescoreConfig, "rescore")
