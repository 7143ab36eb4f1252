"""Stage rpr2_fdr (paper §3.1): the second RPR phase, ordinary FDR branch. Actor ← rsr2,
critic ← rsr2's (the RPR-1 critic, unchanged through RSR-2); 4 critic-only calibration
updates; actor rate RPR-1's / `pipeline.rpr2_lr_divisor` (5: fivefold smaller; the pipeline
derives it from rpr1_fdr's resolved rate by the same rule). The retained Long-Reward branch
rpr2_spr is this config with `rewards.fn = "spr"` (the pipeline's main job is
configs/rpr2_spr.py).

    python experiments/run.py --config=configs/rpr2_fdr.py --workdir=/tmp/rpr2 \
        --config.init.actor_weights=/tmp/run/rsr2/export \
        --config.init.critic_weights=/tmp/run/rsr2/export
"""

from terminal_rsi.configs.rpr1_fdr import get_config as _rpr1
from terminal_rsi.pipeline.resolve import rpr2_learning_rate


def get_config():
    c = _rpr1()
    c.actor_opt.learning_rate = rpr2_learning_rate(c.actor_opt.learning_rate)
    return c
