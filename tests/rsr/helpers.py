"""Shared pieces of the RSR tests: a tiny stage config, and a runbook-following policy."""

import json

from terminal_rsi.agent import ScriptedPolicy
from terminal_rsi.config import registry
from terminal_rsi.rsr.runbook import Runbook, RunbookError

TINY_MODEL = {"preset": "tiny", "vocab_size": None, "d_model": 64, "n_layers": 1,
              "n_heads": 2, "n_kv_heads": 1, "head_dim": 32, "d_ff": 128, "max_seq_len": 1024}


def follower_policy(tokenizer):
    """Reads the runbook from its prompt and emits all its commands as one compact action
    (a policy that follows private guidance perfectly; without a runbook it does nothing)."""

    def script(r):
        text = tokenizer.decode(r.prompt_ids, skip_special=True)
        try:
            cmds = Runbook.parse(text).commands()
        except RunbookError:
            cmds = []
        return json.dumps({"commands": cmds, "task_complete": True}, separators=(",", ":"))

    return ScriptedPolicy(tokenizer, script)


def tiny_stage_config(**over):
    """The typed RSRConfig of configs/rsr1.py at the tiny test shapes, with `over` (dotted
    paths) applied."""
    from configs.rsr1 import get_config

    c = get_config()
    c.model.update(TINY_MODEL)
    c.tasks.families = ("count_lines",)
    c.tasks.n_per_family = 2
    c.harness.max_turns = 1
    c.harness.max_output_tokens = 128
    c.harness.max_input_tokens = 1024
    c.rollout.concurrency = 4
    c.rollout.decode_block = 32
    c.discovery.harnesses = ("hot", "external")
    c.discovery.hot_samples = 1
    c.execution.m = 2
    c.sft.steps = 2
    c.sft.batch_size = 4
    for k, v in over.items():
        node = c
        *path, leaf = k.split(".")
        for p in path:
            node = node[p]
        node[leaf] = v
    return registry.get_experiment("rsr").check(c)
