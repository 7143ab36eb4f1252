"""Stage warmup_critic (paper §2.1): one critic-only pass over the training tasks with the
RSR-1 actor frozen prepares the Warm-up Critic for RPR-1 (rpr_phase, mode warmup_critic).

    python experiments/run.py --config=configs/warmup_critic.py --workdir=/tmp/warm \
        --config.init.actor_weights=/tmp/run/rsr1/export \
        --config.init.critic_weights=/tmp/run/rsr1/export

In the pipeline (configs/rpr2_spr.py) the inputs are set from the graph.
"""

from terminal_rsi.configs.rpr_phase import get_config as _phase


def get_config():
    c = _phase()
    c.mode = "warmup_critic"
    c.rewards.fn = "fdr"
    c.eval.every = 0
    return c
