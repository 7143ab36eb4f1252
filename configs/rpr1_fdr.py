"""Stage rpr1_fdr (paper §2.4, §3.1): the first RPR phase, FDR reward, 4 critic-only
calibration updates, then joint PPO. Actor ← rsr1, critic ← warmup_critic.

    python experiments/run.py --config=configs/rpr1_fdr.py --workdir=/tmp/rpr1 \
        --config.init.actor_weights=/tmp/run/rsr1/export \
        --config.init.critic_weights=/tmp/run/warmup_critic/export

Learning rates are raised for the tiny model (paper: actor 5e-7, critic 1.5e-5); RPR-2 uses
a fivefold smaller actor rate (configs/rpr2_fdr.py; the pipeline derives it from this one).
"""

from configs.rpr_phase import get_config as _phase


def get_config():
    c = _phase()
    c.mode = "phase"
    c.rewards.fn = "fdr"
    c.ppo.critic_warmup_steps = 4
    c.num_steps = 8
    c.actor_opt.learning_rate = 1e-4
    return c
