"""Stage rpr1_fdr (paper §2.4, §3.1): the first RPR phase, FDR reward, 4 critic-only
calibration updates (rpr_phase's default `ppo.critic_warmup_steps`; the pipeline's
`pipeline.critic_warmup_steps`), then joint PPO. Actor ← rsr1, critic ← warmup_critic.

    python experiments/run.py --config=configs/rpr1_fdr.py --workdir=/tmp/rpr1 \
        --config.init.actor_weights=/tmp/run/rsr1/export \
        --config.init.critic_weights=/tmp/run/warmup_critic/export

Learning rates are rpr_phase's, raised for the tiny model (actor 1e-4, critic 1e-3; paper:
5e-7 and 1.5e-5, the pipeline's `--config.scale=paper`); RPR-2's actor rate is derived from
this one (configs/rpr2_fdr.py; in the pipeline, `pipeline.rpr2_lr_divisor`).
"""

from terminal_rsi.configs.rpr_phase import get_config as _phase


def get_config():
    c = _phase()
    c.mode = "phase"
    c.rewards.fn = "fdr"
    c.num_steps = 8
    return c
