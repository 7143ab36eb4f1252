"""One RPR phase (§2.4) on built-in tasks with a tiny CPU model (terminal_rsi.rpr.phase).

    python experiments/run.py --config=configs/rpr_phase.py --workdir=/tmp/rpr
    python experiments/run.py --config=configs/rpr_phase.py --workdir=/tmp/rpr \
        --config.rewards.fn=spr --config.advantage.estimator=gae
    python experiments/run.py --config=configs/rpr_phase.py --config.mode=warmup_critic \
        --workdir=/tmp/warmup

Every setting, its default and its allowed values: terminal_rsi/rpr/config.py (PhaseConfig);
this file sets only what differs. Paper values are the defaults of ppo.* and
*_opt.b1/b2/weight_decay/grad_clip; learning rates are raised for the tiny model (paper: actor
5e-7 RPR-1 / 1e-7 RPR-2, critic 1.5e-5; the pipeline's `--config.scale=paper`).
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.rpr.config import PhaseConfig


def get_config() -> ml_collections.ConfigDict:
    c = config_dict(PhaseConfig, "rpr_phase")  # the defaults, terminal_rsi/rpr/config.py
    c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                   max_seq_len=4096)
    c.tasks.families = ("create_file", "count_lines", "sort_uniq", "edit_replace")
    return c
