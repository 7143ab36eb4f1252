"""Evaluate exported weights on held-out instances and held-out families, Mean@3
(terminal_rsi.evaluation.evaluate; docs/evaluation.md).

    python experiments/run.py --config=configs/evaluate.py --workdir=/tmp/ev \
        --config.init.actor_weights=/tmp/run/rpr2_spr/export \
        --config.init.critic_weights=/tmp/run/rpr2_spr/export

Model shape (model.*) must match the one the weights were trained with (the pipeline's
`configs/rpr2_spr.py` passes its own). Sampling follows the paper (temperature 0.6, top-p 0.95).
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.evaluation.config import EvalConfig


def get_config() -> ml_collections.ConfigDict:
    return config_dict(EvalConfig, "evaluate")  # the defaults, terminal_rsi/evaluation/config.py
