"""The base_sft stage end to end with a tiny model (demonstrations, SFT, exports, summary)."""

import json
import os

import jax
import numpy as np

from configs.base_sft import get_config
from terminal_rsi.agent import read_shard
from terminal_rsi.config import registry
from terminal_rsi.models.transformer import critic_params_from_actor
from terminal_rsi.rsr.base_sft import run
from terminal_rsi.rsr.guidance import GUIDED_SUFFIX
from terminal_rsi.runtime.exports import import_weights
from tests.rsr.helpers import TINY_MODEL


def test_base_sft_end_to_end(tmp_path):
    c = get_config()
    for k, v in TINY_MODEL.items():
        c.model[k] = v
    c.tasks.families = ("count_lines", "hint_lookup")
    c.tasks.n_per_family = 2
    c.demos.runbook_fraction = 0.5
    c.harness.max_output_tokens = 128
    c.sft.steps = 3
    c.sft.batch_size = 4
    c.eval.num_tasks = 2
    c.eval.every = 2
    c.rollout.decode_block = 32
    wd = str(tmp_path / "base")
    s = run(registry.get_experiment("base_sft").check(c), wd)
    demos = read_shard(os.path.join(wd, "trajectories", "demos.jsonl"))
    # every task demonstrated under H0, half of them also with runbook guidance (kept)
    assert s["demos_plain"] == 4 and s["demos_guided"] == 2 and len(demos) == 6
    guided = [t for t in demos if t.meta["demo"] == "runbook"]
    assert all(t.harness.endswith(GUIDED_SUFFIX) and t.S == 1 for t in guided)
    assert all("Runbook:" in "".join(chr(i) for i in t.turns[0].prompt_ids if i < 256)
               for t in guided)
    rows = [json.loads(x) for x in open(os.path.join(wd, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "eval/success" in rows[1] and "eval/guided_success" in rows[2]
    assert s["heldout_tasks"] == 2 and 0.0 <= s["heldout_success"] <= 1.0
    assert s["families"] == ["count_lines", "hint_lookup"]
    assert len(read_shard(os.path.join(wd, "trajectories", "eval.jsonl"))) == 2
    # exports: actor, and the critic built from it (C2)
    from terminal_rsi.models.loading import model_config
    from terminal_rsi.rsr.common import create_actor

    c.init.actor_weights = os.path.join(wd, "export")
    c = registry.get_experiment("base_sft").check(c)  # the typed config a stage runs on
    actor = create_actor(c, model_config(c), c.actor_opt, 0)
    critic = import_weights(os.path.join(wd, "export"), "critic",
                            critic_params_from_actor(actor.params))
    want = critic_params_from_actor(actor.params)
    for a, b in zip(jax.tree.leaves(critic), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_base_sft_with_lora_trains_the_adapters_alone(tmp_path):
    """model.lora_rank > 0: SFT moves the adapters; every other weight of the exported actor
    is the stage's initial one, bit for bit; the critic export copies the adapted actor."""
    from terminal_rsi.models import trainable
    from terminal_rsi.models.loading import model_config
    from terminal_rsi.rsr.common import create_actor

    c = get_config()
    for k, v in TINY_MODEL.items():
        c.model[k] = v
    c.model.lora_rank, c.model.lora_alpha = 4, 8.0
    c.tasks.families, c.tasks.n_per_family = ("count_lines",), 2
    c.harness.max_output_tokens = 128
    c.sft.steps, c.sft.batch_size, c.actor_opt.learning_rate = 2, 2, 1e-2
    c.eval.num_tasks, c.eval.every, c.rollout.decode_block = 1, 0, 32
    typed = registry.get_experiment("base_sft").check(c)
    start = jax.device_get(create_actor(typed, model_config(typed), typed.actor_opt,
                                        typed.seed).params)  # the stage's initial actor
    run(typed, str(tmp_path / "base"))
    end = import_weights(str(tmp_path / "base" / "export"), "actor", start)
    moving, frozen = trainable.split_trainable(start)
    moved, kept = trainable.split_trainable(jax.device_get(end))
    for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(kept), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(moving), jax.tree.leaves(moved), strict=True))
    critic = import_weights(str(tmp_path / "base" / "export"), "critic",
                            critic_params_from_actor(start))
    assert trainable.has_adapters(critic)
