"""The base stage of the tiny default (terminal_rsi.rsr.base_sft): supervised training of a
small byte-level model on reference demonstrations rendered through a short-prompt harness.

    python experiments/run.py --config=configs/base_sft.py --workdir=/tmp/base
    python experiments/run.py --config=configs/base_sft.py --config.sft.steps=50  # quicker

Families: single-turn built-ins whose solutions a small model can learn to write: four have
a constant solution (count_lines, permissions, batch_rename, log_pipeline), four copy words
of the instruction into a fixed command shape (create_file, edit_replace, find_tree,
csv_filter). Longer or multi-turn families (sort_uniq, hint_lookup, ...) can be added with
--config.tasks.families; they make every CPU step costlier. The harness has a short system
prompt and small budgets so a byte-level model sees short contexts. Every setting, its default
and what it allows: terminal_rsi/rsr/config.py (BaseSFTConfig); this file sets what differs.
"""

import ml_collections

from terminal_rsi.agent.formats import SHORT_SYSTEM_PROMPT
from terminal_rsi.config.configuration import config_dict
from terminal_rsi.rsr.config import BaseSFTConfig

TINY_FAMILIES = ("count_lines", "permissions", "batch_rename", "log_pipeline", "create_file",
                 "edit_replace", "find_tree", "csv_filter")


def get_config() -> ml_collections.ConfigDict:
    c = config_dict(BaseSFTConfig, "base_sft")  # the defaults, terminal_rsi/rsr/config.py
    c.model.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384,
                   max_seq_len=2048)
    c.tasks.update(n_per_family=16, eval_n_per_family=3, families=TINY_FAMILIES)
    # a short prompt and small budgets, so a byte-level model sees short contexts
    c.harness.update(system_prompt=SHORT_SYSTEM_PROMPT, max_turns=3, max_output_tokens=256,
                     max_input_tokens=2048, max_observation_chars=300)
    c.rollout.update(concurrency=8, cache_multiple=128, prefill_chunk=128, decode_block=16)
    return c
