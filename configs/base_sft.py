"""The base stage of the tiny default (terminal_rsi.rsr.base_sft): supervised training of a
small byte-level model on reference demonstrations rendered through a short-prompt harness.

    python experiments/run.py --config=configs/base_sft.py --workdir=/tmp/base
    python experiments/run.py --config=configs/base_sft.py --config.sft.steps=50  # quicker

Families: single-turn built-ins whose solutions a small model can learn to write (several
are constant commands, others copy words of the instruction) plus hint_lookup (read, then
act). The harness has a short system prompt and small budgets so a byte-level model sees
short contexts.
"""

import ml_collections

from terminal_rsi.rsr.common import SHORT_SYSTEM_PROMPT

TINY_FAMILIES = ("create_file", "edit_replace", "count_lines", "sort_uniq", "find_tree",
                 "csv_filter", "permissions", "batch_rename", "log_pipeline", "hint_lookup")


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "base_sft"
    c.seed = 0
    c.model = ml_collections.ConfigDict({
        "preset": "tiny", "vocab_size": None, "d_model": 128, "n_layers": 2, "n_heads": 4,
        "n_kv_heads": 2, "head_dim": 32, "d_ff": 384, "max_seq_len": 2048})
    c.init = ml_collections.ConfigDict({"actor_weights": None, "critic_weights": None})
    c.tasks = ml_collections.ConfigDict({
        "suite": "builtin", "train_split": "train", "eval_split": "test", "n_per_family": 24,
        "eval_n_per_family": 3, "families": TINY_FAMILIES, "backend": "local"})
    c.harness = ml_collections.ConfigDict({
        "system_prompt": SHORT_SYSTEM_PROMPT, "max_turns": 3, "max_output_tokens": 256,
        "max_input_tokens": 2048, "summarize_threshold": None, "agent_timeout_s": None,
        "temperature": 1.0, "max_observation_chars": 300, "action_style": "compact"})
    c.rollout = ml_collections.ConfigDict({
        "concurrency": 8, "cache_multiple": 64, "prefill_chunk": 128, "decode_block": 16})
    c.demos = ml_collections.ConfigDict({"runbook_fraction": 0.5, "curriculum": "none"})
    c.sft = ml_collections.ConfigDict({
        "steps": 300, "batch_size": 8, "num_microbatches": 1, "aggregation": "token_mean"})
    c.actor_opt = ml_collections.ConfigDict({
        "learning_rate": 3e-3, "weight_decay": 0.0, "grad_clip": 1.0, "warmup_steps": 20})
    c.eval = ml_collections.ConfigDict({
        "num_tasks": 30, "temperature": 0.0, "every": 100, "guided": True})
    return c
