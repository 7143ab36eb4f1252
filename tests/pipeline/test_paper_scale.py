"""`--config.scale=paper`: every stage config the pipeline resolves carries the paper's
numbers (App. A "Optimization and sampling", §3.1 "Sequence budgets" and "Evaluation
protocol", Table 3), checked here against the paper's text, not against scales.py."""

from __future__ import annotations

import math

import pytest

from terminal_rsi.configs.rpr2_spr import get_config
from terminal_rsi.pipeline.config import resolved
from terminal_rsi.pipeline.runner import Pipeline

# (stage, dotted field, the paper's value, where the paper says it)
PAPER = [
    ("rpr1_fdr", "actor_opt.learning_rate", 5e-7, "App. A: RPR-1 actor rate 5e-7"),
    ("rpr2_spr", "actor_opt.learning_rate", 1e-7, "App. A: RPR-2 actor rate 1e-7"),
    ("rpr2_fdr", "actor_opt.learning_rate", 1e-7, "App. A: RPR-2 actor rate 1e-7"),
    *[(s, "critic_opt.learning_rate", 1.5e-5, "App. A: critic rate 1.5e-5, retained")
      for s in ("rpr1_fdr", "rpr2_spr", "rpr2_fdr")],
    *[(s, f"{role}.{k}", v, "App. A: Adam β1 0.90, β2 0.98, weight decay 0.10")
      for s in ("rpr1_fdr", "rpr2_spr") for role in ("actor_opt", "critic_opt")
      for k, v in (("b1", 0.9), ("b2", 0.98), ("weight_decay", 0.1))],
    *[(s, "ppo.value_clip", 4.0, "App. A: value clipping at 4.00") for s in ("rpr1_fdr",
                                                                           "rpr2_spr")],
    *[(s, "critic_opt.grad_clip", 100.0, "App. A: critic-gradient clipping at 100.00")
      for s in ("rpr1_fdr", "rpr2_spr")],
    *[(s, "actor_opt.grad_clip", 1.0, "App. A: actor-gradient clipping at 1.00")
      for s in ("rpr1_fdr", "rpr2_spr")],
    *[(s, f"ppo.{k}", v, "App. A: policy clipping 0.30 and 5.00, KL and entropy 0.00")
      for s in ("rpr1_fdr", "rpr2_spr") for k, v in (("clip_low", 0.30), ("clip_high", 5.00),
                                                    ("kl_coef", 0.0), ("entropy_coef", 0.0))],
    *[(s, "rollout.batch_size", 256, "App. A: rollout and global batch sizes are 256")
      for s in ("rpr1_fdr", "rpr2_spr")],
    *[(s, "harness.temperature", 1.0, "App. A: one response per task at temperature 1.00")
      for s in ("rpr1_fdr", "rpr2_spr")],
    *[(s, "num_steps", 36, "App. A: each phase configures 36 rollout steps")
      for s in ("rpr1_fdr", "rpr2_spr")],
    *[(s, "ppo.critic_warmup_steps", 4, "App. A: the first four reserved for critic-only")
      for s in ("rpr1_fdr", "rpr2_spr")],
    ("rpr2_spr", "rollout.cache_multiple", 2048, "§3.1: padding aligned to multiples of 2,048"),
    ("rpr2_spr", "rewards.fn", "spr", "§3.1: SPR in the retained Long-Reward RPR-2 branch"),
    ("rpr1_fdr", "rewards.fn", "fdr", "§3.1: this schedule accompanies FDR in RPR-1"),
    *[(s, "harness.max_output_tokens", 8192, "§3.1: at most 8,192 output tokens per turn")
      for s in ("rpr1_fdr", "rpr2_spr", "eval")],
    *[(s, "harness.max_input_tokens", 96_000, "§3.1: 96,000 input tokens per call")
      for s in ("rpr1_fdr", "rpr2_spr", "eval")],
    ("eval", "harness.max_turns", 100_000, "§3.1: up to 100,000 turns are permitted"),
    ("eval", "harness.summarize_threshold", 32_000, "§3.1: summarization at 32,000 tokens"),
    ("eval", "harness.temperature", 0.6, "§3.1: sampling uses temperature 0.60"),
    ("eval", "harness.top_p", 0.95, "§3.1: top-p = 0.95"),
    ("eval", "eval.k", 3, "§3.1: three independent runs, Mean@3"),
    *[(s, "model.preset", "qwen3_27b_class", "§3.1: Terminal-RSI-27B")
      for s in ("rpr1_fdr", "rpr2_spr", "rsr1", "eval")],
    ("rpr1_fdr", "model.max_seq_len", 262_144, "§3.1: the extreme 256k sequence capacity"),
]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    c = get_config()
    c.scale = "paper"
    c.pipeline.targets = ("rpr2_fdr", "rpr2_spr")
    return Pipeline(resolved(c), str(tmp_path_factory.mktemp("paper")))


def _get(cfg, path):
    for part in path.split("."):
        cfg = cfg[part]
    return cfg


@pytest.mark.parametrize("stage, path, value, source", PAPER,
                         ids=[f"{s}:{p}" for s, p, _, _ in PAPER])
def test_paper_scale_matches_the_paper(pipe, stage, path, value, source):
    cfg = pipe.eval_base_config() if stage == "eval" else pipe.stage_config(stage)
    got = _get(cfg, path)
    assert got == pytest.approx(value) if isinstance(value, float) else got == value, source


def test_paper_scale_launches_288_for_256(pipe):
    r = pipe.stage_config("rpr1_fdr").rollout
    launched = math.ceil(r.batch_size * (1.0 + r.oversample) - 1e-9)  # as num_launch
    assert launched == 288  # App. A: oversampling requests 288 trajectories


def test_paper_scale_resolves_every_stage(pipe):
    pipe.resolve_all()  # every stage config validates against its schema
