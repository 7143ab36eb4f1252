"""The main job: Terminal-RSI end to end up to the retained RPR-2 (SPR) stage (issue 11).

    python experiments/run.py --config=configs/rpr2_spr.py --workdir=runs/rsi
    python experiments/run.py --config=configs/rpr2_spr.py --workdir=runs/rsi_ci \
        --config.scale=ci                                      # the CI-sized job
    python experiments/run.py --config=configs/rpr2_spr.py --config.seed=1 --workdir=runs/rsi_s1
    python experiments/run.py --config=configs/rpr2_spr.py --config.model=smollm2_135m \
        --workdir=runs/rsi_smollm2                             # pretrained base (much slower)

Stages (terminal_rsi/pipeline/graph.py): base → rsr1 → warmup_critic → rpr1_fdr → rsr2 →
rpr2_spr; each is evaluated (k = 3, held-out instances and held-out families); the ledger is
`<workdir>/ledger.json`, plots in `<workdir>/plots/`. Rerunning reuses finished stages.
Per-stage overrides: `--config.stages.<stage>.<field>=value` (fields of the stage config,
e.g. `--config.stages.rpr1_fdr.num_steps=16`). Sizes: `--config.scale=default|ci|test`.
"""

import ml_collections
from ml_collections.config_dict import placeholder

from terminal_rsi.pipeline.runner import stage_override_template

STAGE_NAMES = ("base", "rsr1", "warmup_critic", "rpr1_fdr", "rsr2", "rpr2_fdr", "rpr2_spr")


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "pipeline"
    c.seed = 0
    c.model = "tiny"
    c.model_dims = ml_collections.ConfigDict()
    for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
              "max_seq_len"):
        c.model_dims[k] = placeholder(int)
    c.scale = "default"
    c.tasks = ml_collections.ConfigDict({
        "suite": "builtin", "families": placeholder(tuple), "n_per_family": placeholder(int),
        "backend": "local", "allow_plain_sandbox": "builtin"})
    c.harness = ml_collections.ConfigDict({
        "max_turns": placeholder(int), "max_output_tokens": placeholder(int),
        "max_input_tokens": placeholder(int), "max_parse_errors": placeholder(int)})
    c.eval = ml_collections.ConfigDict({
        "k": 3, "n_per_family": placeholder(int), "heldout_families": placeholder(tuple),
        "concurrency": placeholder(int), "temperature": 0.6, "top_p": 0.95})
    c.pipeline = ml_collections.ConfigDict({
        "targets": ("rpr2_spr",), "base": "auto", "bypass": (), "rpr2_lr_divisor": 5.0,
        "critic_warmup_steps": 4, "divisor_samples": 32})
    # per-stage overrides: every field of every stage config, None (the stage config / scale
    # decides) until set, e.g. --config.stages.rsr1.sft.steps=10
    c.stages = stage_override_template(STAGE_NAMES)
    return c
