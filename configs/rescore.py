"""Offline fixed-trajectory rescoring (paper §3.4, Appendix B): FDR vs SPR, old vs
recalibrated family divisors, outcome labels unchanged.

    python experiments/run.py --config=configs/rescore.py --workdir=/tmp/rescore
    python experiments/run.py --config=configs/rescore.py \
        --config.rescore.trajectories=my_episodes.jsonl --config.rescore.divisors=''

The defaults rescore the small synthetic demo shipped in terminal_rsi/rewards/data/.
"""

import pathlib

import ml_collections

_DATA = pathlib.Path(__file__).resolve().parents[1] / "terminal_rsi" / "rewards" / "data"


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.experiment = "rescore"
    config.seed = 0

    config.rescore = ml_collections.ConfigDict()
    config.rescore.trajectories = str(_DATA / "demo_episodes.jsonl")
    config.rescore.divisors = str(_DATA / "demo_divisors.json")  # '' = calibrate from episodes
    config.rescore.recalibrated_divisors = ""  # '' = recalibrate with the rules below
    config.rescore.calibration_quantile = 0.90
    config.rescore.fallback_divisor = 82.0
    config.rescore.hygiene = "default"
    config.rescore.early_declaration_turns = 10
    config.rescore.figure = True

    # Appendix B recalibration rules, in priority order (see RecalibrationRules).
    rules = config.rescore.rules = ml_collections.ConfigDict()
    rules.reward = "fdr"
    rules.high_reward_failure_threshold = 1.0
    rules.min_high_reward_failures = 1
    rules.failure_factor = 2.0
    rules.long_mean_turns = 50.0
    rules.low_mean_reward = 0.35
    rules.long_factor = 0.25
    rules.min_family_episodes = 1
    rules.new_family_quantile = 0.90
    rules.min_new_family_reports = 1
    return config
