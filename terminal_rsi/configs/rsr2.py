"""RSR-2 (paper §2.1, Eq. 4): the second rewrite, from the retained RPR-1 actor; the RPR-1
critic passes through unchanged (re-exported, checked bit-identical).

    python experiments/run.py --config=configs/rsr2.py --workdir=/tmp/rsr2 \
        --config.init.actor_weights=/tmp/rpr1/export --config.init.critic_weights=/tmp/rpr1/export

Same as configs/rsr1.py, with the actor's own discovery given more room (more hot samples
and the longer-budget harness) since the retained actor is stronger.
"""

import ml_collections

from terminal_rsi.configs.rsr1 import get_config as rsr1_config


def get_config() -> ml_collections.ConfigDict:
    c = rsr1_config()
    c.seed = 1
    c.discovery.harnesses = ("hot", "long", "external")
    c.discovery.hot_samples = 3
    return c
