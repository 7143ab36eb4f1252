"""TB-GAE component diagnostic (paper/component_review.md): CPU, seconds.

python experiments/run.py --config=configs/credit_diagnostic.py --workdir=runs/credit_diagnostic
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.experiment = "credit_diagnostic"
    config.seed = 0
    config.seeds = (42, 43, 44)
    config.num_generated = 20
    config.num_turns = 5
    config.num_observations = 40
    config.split_at = 11
    config.gamma_turn = 0.95
    config.lambda_turn = 0.95
    config.terminal_reward = 1.0
    config.methods = ("scan", "associative", "blocked")
    config.dtype = "float64"
    return config
