"""Where each stage setting comes from (issue 50): the layers of `pipeline/resolve.py`, which
layer set each value, no value replaced without a word, scale keys that must take effect, the
printout and the ledger's record; the config files inside the package. No stage runs here."""

import json
import os
import pathlib

import pytest

from terminal_rsi.config.configuration import validate_config
from terminal_rsi.configs.rpr1_fdr import get_config as rpr1_config
from terminal_rsi.configs.rpr2_fdr import get_config as rpr2_config
from terminal_rsi.configs.rpr2_spr import get_config
from terminal_rsi.experiments.run import config_file, with_packaged_config
from terminal_rsi.pipeline import ledger as L
from terminal_rsi.pipeline import resolve as R
from terminal_rsi.pipeline import scales
from terminal_rsi.pipeline.config import SCHEMA, resolved
from terminal_rsi.pipeline.graph import STAGES
from terminal_rsi.pipeline.runner import Pipeline, PipelineError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pipeline(tmp_path, scale="test", **fields):
    c = get_config()
    c.scale = scale
    for path, value in fields.items():
        R.set_path(c, path.replace("__", "."), value)
    validate_config(c, SCHEMA)
    return Pipeline(resolved(c), str(tmp_path), log=lambda line: None)


def test_each_value_names_the_layer_that_set_it(tmp_path):
    p = _pipeline(tmp_path, stages__rsr1__sft__steps=3, harness__max_turns=2)
    p.resolve_all()
    rsr1, rpr1, spr = (p.resolved_stage(n) for n in ("rsr1", "rpr1_fdr", "rpr2_spr"))
    assert rsr1.set_by["sft.steps"] == "--config.stages.rsr1"
    assert rsr1.set_by["harness.max_turns"] == "--config.harness"  # the user's, over the scale's
    assert rsr1.set_by["model.d_model"] == "scale 'test' model"
    assert rsr1.set_by["init.actor_weights"] == "graph: input handoff"
    assert rpr1.set_by["num_steps"] == "scale 'test' experiments.rpr_phase"
    assert rpr1.set_by["rewards.divisors_path"] == "the run's frozen divisors"
    assert spr.set_by["rewards.fn"] == "graph: rpr2_spr's definition"
    # changes(): only values that differ from the stage's config file
    changes = rsr1.changes()
    assert changes["sft.steps"] == (3, "--config.stages.rsr1")
    assert "seed" not in changes and "tasks.suite" not in changes  # the file's own values
    assert rsr1.layers.index("scale 'test' model") < rsr1.layers.index("--config.harness") \
        < rsr1.layers.index("--config.stages.rsr1") < rsr1.layers.index("graph: input handoff")


def test_the_tiny_models_tokenizer_reaches_every_stage_and_the_evaluation(tmp_path):
    """--config.model_dims.tokenizer=bpe (issue 51) sets model.tokenizer of every stage and of
    the evaluation config; unset, every stage keeps its file's default, byte."""
    p = _pipeline(tmp_path / "a", model_dims__tokenizer="bpe")
    assert {p.stage_config(n).model.tokenizer for n in p.order} == {"bpe"}
    assert p.resolved_stage("rsr1").set_by["model.tokenizer"] == "--config.model_dims"
    assert p.eval_base_config().model.tokenizer == "bpe"
    p = _pipeline(tmp_path / "b")
    assert {p.stage_config(n).model.tokenizer for n in p.order} == {"byte"}
    assert p.eval_base_config().model.tokenizer == "byte"


def test_the_users_shared_settings_win_over_the_scales_per_experiment_ones(tmp_path):
    """The default scale sets tasks.n_per_family per experiment; the user's
    --config.tasks.n_per_family used to be dropped without a word under it."""
    p = _pipeline(tmp_path, "default", tasks__n_per_family=2)
    for n in ("base", "rsr1", "rpr1_fdr"):
        assert p.stage_config(n).tasks.n_per_family == 2
        assert p.resolved_stage(n).set_by["tasks.n_per_family"] == "--config.tasks"
    assert _pipeline(tmp_path / "d", "default").stage_config("base").tasks.n_per_family == 24


def test_a_value_replaced_by_a_layer_not_declared_to_replace_it_is_an_error():
    cfg = rpr1_config()
    set_by = {}
    pipeline = R.Layer("--config.model", "pipeline", {"model.preset": "smollm2_135m"})
    R.apply_layer(cfg, pipeline, set_by, where="stage x")
    scale = R.Layer("scale 'toy' model", "scale", {"model.preset": "tiny"})
    with pytest.raises(PipelineError, match=r"model.preset = 'smollm2_135m' is set by "
                       r"--config.model and scale 'toy' model sets 'tiny'"):
        R.apply_layer(cfg, scale, set_by, where="stage x")
    # declared: a scale's specific settings refine its shared ones, the user's win over the
    # scale's, the graph derives its keys
    R.apply_layer(cfg, R.Layer("scale 'toy' harness", "scale", {"harness.max_turns": 2}),
                  set_by, where="stage x")
    for layer in (R.Layer("scale 'toy' experiments.rpr_phase", "scale", {"harness.max_turns": 3}),
                  R.Layer("--config.harness", "user", {"harness.max_turns": 4}),
                  R.Layer("--config.stages.x", "user", {"harness.max_turns": 5}),
                  R.Layer("graph: g", "graph", {"harness.max_turns": 6})):
        R.apply_layer(cfg, layer, set_by, where="stage x")
        assert set_by["harness.max_turns"] is layer
    assert cfg.harness.max_turns == 6
    # the same value again changes nothing and is not a conflict
    R.apply_layer(cfg, R.Layer("scale 'toy' model", "scale", {"model.preset": "smollm2_135m"}),
                  set_by, where="stage x")
    assert set_by["model.preset"] is pipeline


def test_a_scale_that_overrides_the_model_the_user_chose_is_refused(tmp_path, monkeypatch):
    toy = {**scales.SCALES["test"], "model": {"preset": "tiny"}}
    monkeypatch.setitem(scales.SCALES, "test", toy)
    c = get_config()
    c.scale, c.model = "test", "smollm2_135m"
    c.pipeline.targets = ("base",)
    with pytest.raises(PipelineError, match=r"--config.model and scale 'test' model"):
        Pipeline(resolved(c), str(tmp_path)).resolve_all()


@pytest.mark.parametrize("name", sorted(scales.SCALES))
def test_every_key_of_every_scale_takes_effect(name):
    c = get_config()
    c.scale = name
    R.check_scale(c, scales.SCALES[name])


@pytest.mark.parametrize("where, key, settings", [
    ("harness", "max_turnz", 3),
    ("tasks", "familys", ("a",)),
    ("model", "d_modle", 8),
    ("eval", "kk", 3),
    ("experiments", "rpr_phaze", {"num_steps": 3}),
    ("stages", "rpr3", {"num_steps": 3}),
    ("stages", "rpr2_spr", {"num_stepz": 3}),
])
def test_a_scale_key_that_takes_effect_nowhere_is_refused(tmp_path, monkeypatch, where, key,
                                                          settings):
    toy = dict(scales.SCALES["test"])
    toy[where] = {**toy.get(where, {}), key: settings}
    monkeypatch.setitem(scales.SCALES, "test", toy)
    c = get_config()
    c.scale = "test"
    c.pipeline.targets = ("base",)  # checked for the whole graph, not the stages run
    with pytest.raises(PipelineError, match=rf"scale 'test' .*take effect nowhere: "
                       rf"{where}\.{key}"):
        Pipeline(resolved(c), str(tmp_path)).resolve_all()


def test_rpr2s_actor_rate_has_one_owner(tmp_path):
    """RPR-2's rate is RPR-1's / pipeline.rpr2_lr_divisor, in the pipeline and in
    configs/rpr2_fdr.py alike; no scale sets it for an RPR-2 stage."""
    for s in scales.SCALES.values():
        assert "actor_opt.learning_rate" not in s["experiments"].get("rpr_phase", {})
        assert not any("actor_opt.learning_rate" in s["stages"].get(n, {})
                       for n in ("rpr2_fdr", "rpr2_spr"))
    assert rpr2_config().actor_opt.learning_rate == R.rpr2_learning_rate(
        rpr1_config().actor_opt.learning_rate)
    p = _pipeline(tmp_path, "paper")
    assert p.stage_config("rpr1_fdr").actor_opt.learning_rate == 5e-7
    assert p.stage_config("rpr2_spr").actor_opt.learning_rate == pytest.approx(1e-7)
    assert p.resolved_stage("rpr2_spr").set_by["actor_opt.learning_rate"] == (
        "graph: rpr1_fdr's rate / --config.pipeline.rpr2_lr_divisor")


def test_the_run_prints_and_the_ledger_keeps_each_stages_settings(tmp_path):
    lines = []
    p = _pipeline(tmp_path, stages__rsr1__sft__steps=3)
    p.log = lines.append
    p.resolve_all()
    p.record_settings(p.order)
    text = "\n".join(lines)
    assert "[pipeline] rsr1: configs/rsr1.py, changed by" in text
    assert "  --config.stages.rsr1: sft.steps=3" in text
    assert "  scale 'test' experiments.rpr_phase: " in text and "num_steps=5" in text
    assert "init.actor_weights='base/export'" in text  # paths inside the run dir: relative
    assert max(len(ln) for ln in lines for ln in ln.splitlines()) <= 100
    with open(tmp_path / "ledger.json") as f:
        led = {s["name"]: s for s in json.load(f)["stages"]}
    assert led["rsr1"]["settings"]["sft.steps"] == {"value": 3,
                                                   "set_by": "--config.stages.rsr1"}
    assert led["rpr1_fdr"]["settings"]["init.critic_weights"] == {
        "value": "warmup_critic/export", "set_by": "graph: input handoff"}
    assert "seed" not in led["rsr1"]["settings"]  # the file's own value


def test_the_ledger_refuses_a_malformed_settings_record(tmp_path):
    led = L.Ledger(str(tmp_path), [("base", "base_sft")])
    led.entry("base")["settings"] = {"sft.steps": {"value": 3}}
    with pytest.raises(L.LedgerError, match=r"settings\['sft.steps'\]"):
        led.save()


def test_show_value_is_short_and_never_says_none():
    assert R.show_value(None) == "none"
    assert R.show_value(["a", "b"]) == "('a', 'b')"
    long = R.show_value("x" * 200)
    assert len(long) <= 48 and long.endswith("(202 chars)")


def test_config_files_live_in_the_package(tmp_path):
    pkg = ROOT / "terminal_rsi" / "configs"
    assert (ROOT / "configs").resolve() == pkg  # the checkout's configs/ links there
    assert not (ROOT / "configs").is_symlink() or os.readlink(ROOT / "configs") == \
        os.path.join("terminal_rsi", "configs")  # relative: the link survives a move
    for spec in STAGES.values():
        cfg = R.load_config_file(spec.config_file)
        assert cfg.experiment == spec.experiment
    assert R.config_module("configs/rpr2_fdr.py") == "terminal_rsi.configs.rpr2_fdr"
    with pytest.raises(PipelineError, match="does not exist in terminal_rsi.configs"):
        R.load_config_file("configs/no_such_stage.py")
    with pytest.raises(PipelineError, match="expected configs/<name>.py"):
        R.load_config_file("elsewhere/rsr1.py")


def test_the_entry_point_finds_the_packaged_config_from_any_directory(tmp_path, monkeypatch):
    pkg = ROOT / "terminal_rsi" / "configs"
    monkeypatch.chdir(tmp_path)
    assert config_file("configs/rpr2_spr.py") == str(pkg / "rpr2_spr.py")
    assert config_file("configs/rpr2_spr.py:arg") == str(pkg / "rpr2_spr.py") + ":arg"
    assert config_file("configs/nope.py") == "configs/nope.py"  # the loader names it
    assert with_packaged_config(["run.py", "--config", "configs/rsr1.py", "--workdir=w"]) == [
        "run.py", "--config", str(pkg / "rsr1.py"), "--workdir=w"]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "rpr2_spr.py").write_text("")
    assert config_file("configs/rpr2_spr.py") == "configs/rpr2_spr.py"  # a local file wins
