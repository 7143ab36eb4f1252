"""The main job: Terminal-RSI end to end up to the retained RPR-2 (SPR) stage (issue 11).

    python experiments/run.py --config=configs/rpr2_spr.py --workdir=runs/rsi
    python experiments/run.py --config=configs/rpr2_spr.py --workdir=runs/rsi_ci \
        --config.scale=ci                                      # the CI-sized job
    python experiments/run.py --config=configs/rpr2_spr.py --config.seed=1 --workdir=runs/rsi_s1
    python experiments/run.py --config=configs/rpr2_spr.py --config.model=smollm2_135m \
        --workdir=runs/rsi_smollm2                             # pretrained base (much slower)

Stages (terminal_rsi/pipeline/graph.py): base → rsr1 → warmup_critic → rpr1_fdr → rsr2 →
rpr2_spr; each is evaluated (k = 3, held-out instances and held-out families); the ledger is
`<workdir>/ledger.json`, plots in `<workdir>/plots/`. Rerunning reuses finished stages.
Per-stage overrides: `--config.stages.<stage>.<field>=value` (fields of the stage config,
e.g. `--config.stages.rpr1_fdr.num_steps=16`). Sizes: `--config.scale=default|ci|test`.
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.pipeline.config import STAGE_NAMES, PipelineConfig
from terminal_rsi.pipeline.resolve import stage_override_template


def get_config() -> ml_collections.ConfigDict:
    c = config_dict(PipelineConfig, "pipeline")  # the defaults, terminal_rsi/pipeline/config.py
    # per-stage overrides: every field of every stage config, None (the stage config / scale
    # decides) until set, e.g. --config.stages.rsr1.sft.steps=10
    c.stages = stage_override_template(STAGE_NAMES)
    return c
