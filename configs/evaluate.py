"""Evaluate exported weights on held-out instances and held-out families, Mean@3
(terminal_rsi.evaluation.evaluate; docs/evaluation.md).

    python experiments/run.py --config=configs/evaluate.py --workdir=/tmp/ev \
        --config.init.actor_weights=/tmp/run/rpr2_spr/export \
        --config.init.critic_weights=/tmp/run/rpr2_spr/export

Model shape (model.*) must match the one the weights were trained with (the pipeline's
`configs/rpr2_spr.py` passes its own). Sampling follows the paper (temperature 0.6, top-p 0.95).
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "evaluate"
    c.seed = 0
    c.model = ml_collections.ConfigDict({"preset": "tiny", "gguf": placeholder(str)})
    for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
              "max_seq_len"):
        c.model[k] = placeholder(int)  # None: the preset's value
    c.init = ml_collections.ConfigDict({"actor_weights": placeholder(str),
                                        "critic_weights": placeholder(str)})
    c.tasks = ml_collections.ConfigDict({
        "suite": "builtin", "suites": ("heldout_instances", "heldout_families"),
        "n_per_family": 2, "families": (), "heldout_families": (), "backend": "local",
        "allow_plain_sandbox": "builtin"})
    c.harness = ml_collections.ConfigDict({
        "max_turns": 4, "max_output_tokens": 256, "max_input_tokens": 4096,
        "summarize_threshold": placeholder(int), "agent_timeout_s": placeholder(float), "temperature": 0.6,
        "top_p": 0.95, "system_prompt": placeholder(str), "max_observation_chars": 8000,
        "max_parse_errors": placeholder(int)})
    c.eval = ml_collections.ConfigDict({
        "k": 3, "concurrency": 8, "strata_path": placeholder(str),
        "divisors_path": placeholder(str),
        "reward_fn": "fdr"})
    c.rollout = ml_collections.ConfigDict({
        "cache_multiple": 512, "prefill_chunk": 256, "decode_block": 16})
    return c
