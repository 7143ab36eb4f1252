"""Size presets of the pipeline (`config.scale`): one job, different budgets.

- `default`: the tiny CPU default that should learn (issue 11 §4): whole chain on 2 cores in
  about 20 minutes.
- `ci`: the same job, much smaller (a few minutes): fewer steps, fewer tasks.
- `test`: the smallest shapes that still run every stage (tests/pipeline).

Each preset gives `model_dims` (applied when config.model == "tiny"), shared `tasks` and
`harness` settings, evaluation settings (`eval`), per-experiment overrides (`experiments`,
keyed by registry name) and per-stage overrides (`stages`). Keys a stage config does not
have are skipped (so a preset can carry settings for every experiment); the user's
`config.stages.<stage>.*` and shared settings win over the preset.
"""

from __future__ import annotations

TRAIN_FAMILIES = ("create_file", "count_lines", "edit_replace", "sort_uniq")
HELDOUT_FAMILIES = ("column_sum", "archive", "dir_hunt")

SCALES: dict[str, dict] = {
    "default": {
        "model_dims": {"d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                       "head_dim": 32, "d_ff": 384, "max_seq_len": 2048},
        "tasks": {"families": TRAIN_FAMILIES, "n_per_family": 8, "eval_n_per_family": 2},
        "harness": {"max_turns": 2, "max_output_tokens": 160, "max_input_tokens": 2048},
        "eval": {"k": 3, "n_per_family": 3, "heldout_families": HELDOUT_FAMILIES,
                 "concurrency": 16},
        "experiments": {
            "rpr_phase": {"num_steps": 12, "rollout.batch_size": 16, "rollout.concurrency": 16,
                          "ppo.num_minibatches": 2, "eval.every": 4, "eval.num_tasks": 8,
                          "checkpoint.every": 4, "actor_opt.learning_rate": 3e-5,
                          "critic_opt.learning_rate": 1e-3},
        },
        "stages": {},
    },
    "ci": {
        "model_dims": {"d_model": 64, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
                       "head_dim": 32, "d_ff": 192, "max_seq_len": 2048},
        "tasks": {"families": ("create_file", "count_lines"), "n_per_family": 4,
                  "eval_n_per_family": 1},
        "harness": {"max_turns": 1, "max_output_tokens": 96, "max_input_tokens": 2048},
        "eval": {"k": 3, "n_per_family": 2, "heldout_families": ("column_sum",),
                 "concurrency": 8},
        "experiments": {
            "rpr_phase": {"num_steps": 5, "rollout.batch_size": 8, "rollout.concurrency": 8,
                          "ppo.num_minibatches": 2, "eval.every": 5, "eval.num_tasks": 2,
                          "checkpoint.every": 5, "actor_opt.learning_rate": 3e-5,
                          "critic_opt.learning_rate": 1e-3},
        },
        "stages": {},
    },
    "test": {
        "model_dims": {"d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
                       "head_dim": 8, "d_ff": 32, "max_seq_len": 2048},
        "tasks": {"families": ("create_file", "count_lines"), "n_per_family": 1,
                  "eval_n_per_family": 1},
        "harness": {"max_turns": 1, "max_output_tokens": 8, "max_input_tokens": 2048},
        "eval": {"k": 3, "n_per_family": 1, "heldout_families": ("column_sum",),
                 "concurrency": 4},
        "experiments": {
            "rpr_phase": {"num_steps": 5, "rollout.batch_size": 2, "rollout.concurrency": 2,
                          "ppo.num_minibatches": 2, "eval.every": 0, "eval.num_tasks": 1,
                          "checkpoint.every": 5},
        },
        "stages": {},
    },
}


def get_scale(name: str) -> dict:
    if name not in SCALES:
        from terminal_rsi.configuration import ConfigError

        raise ConfigError(f"config.scale = {name!r}; choose one of {', '.join(SCALES)}")
    return SCALES[name]
