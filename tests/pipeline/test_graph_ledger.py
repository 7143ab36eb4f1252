"""Stage graph (prerequisites, handoff rules in resolved configs, hashes) and the ledger (C5,
atomic writes). No stage runs here."""

import json
import os

import pytest

from terminal_rsi.agent.formats import get_format
from terminal_rsi.agent.harness import HarnessConfig
from terminal_rsi.config.configuration import ConfigError, flatten, validate_config
from terminal_rsi.config.registry import get_experiment
from terminal_rsi.configs.rpr2_spr import get_config
from terminal_rsi.pipeline import graph as G
from terminal_rsi.pipeline import ledger as L
from terminal_rsi.pipeline.config import SCHEMA, resolved
from terminal_rsi.pipeline.runner import Pipeline, PipelineError
from terminal_rsi.pipeline.stage_eval import train_stats


def _config(**pipeline):
    c = get_config()
    c.scale = "test"
    for k, v in pipeline.items():
        c.pipeline[k] = v
    validate_config(c, SCHEMA)
    return resolved(c)


def test_prerequisites_in_graph_order():
    assert G.prerequisites(["rpr2_spr"]) == ["base", "rsr1", "warmup_critic", "rpr1_fdr",
                                             "rsr2", "rpr2_spr"]
    assert G.prerequisites(["rpr1_fdr"]) == ["base", "rsr1", "warmup_critic", "rpr1_fdr"]
    assert G.prerequisites(["rpr2_fdr", "rpr2_spr"])[-2:] == ["rpr2_fdr", "rpr2_spr"]
    assert G.prerequisites(["base"]) == ["base"]
    with pytest.raises(G.GraphError, match="unknown stage"):
        G.prerequisites(["rpr3"])
    cyc = dict(G.STAGES)
    cyc["base"] = G.StageSpec("base", "base_sft", "x", {"actor": "rpr1_fdr"}, "base")
    with pytest.raises(G.GraphError, match="cycle"):
        G.prerequisites(["rpr1_fdr"], cyc)


def test_resolved_stage_configs_follow_the_handoff_rules(tmp_path):
    p = Pipeline(_config(), str(tmp_path))
    p.resolve_all()
    run = str(tmp_path)
    r1, r2, w = (p.stage_config(n) for n in ("rpr1_fdr", "rpr2_spr", "warmup_critic"))
    assert r1.init.actor_weights == os.path.join(run, "rsr1", "export")
    assert r1.init.critic_weights == os.path.join(run, "warmup_critic", "export")
    assert r2.init.actor_weights == r2.init.critic_weights == os.path.join(run, "rsr2", "export")
    rsr2 = p.stage_config("rsr2")
    assert rsr2.init.critic_weights == os.path.join(run, "rpr1_fdr", "export")
    assert w.mode == "warmup_critic" and w.init.actor_weights.endswith("rsr1/export")
    assert r1.rewards.fn == "fdr" and r2.rewards.fn == "spr"
    assert r1.ppo.critic_warmup_steps == r2.ppo.critic_warmup_steps == 4
    assert r2.actor_opt.learning_rate == pytest.approx(r1.actor_opt.learning_rate / 5)
    # one model shape everywhere (weights-only handoff)
    shapes = {tuple(p.stage_config(n).model[k] for k in ("d_model", "n_layers", "d_ff"))
              for n in p.order}
    assert shapes == {(16, 1, 32)}


def test_max_parse_errors_reaches_every_episode_stage_and_eval(tmp_path):
    c = get_config()  # the default scale: episodes end at the first parse error
    validate_config(c, SCHEMA)
    p = Pipeline(resolved(c), str(tmp_path / "a"))
    stages = ("base", "rsr1", "warmup_critic", "rpr1_fdr", "rpr2_spr")
    assert {p.stage_config(n).harness.max_parse_errors for n in stages} == {1}
    assert p.eval_base_config().harness.max_parse_errors == 1
    assert p.stage_config("rpr1_fdr").harness.max_observation_chars == 300
    c.harness.max_parse_errors = 0  # 0: no limit, the paper's harness
    validate_config(c, SCHEMA)
    p = Pipeline(resolved(c), str(tmp_path / "b"))
    assert all(p.stage_config(n).harness.max_parse_errors is None for n in stages)
    assert p.eval_base_config().harness.max_parse_errors is None


@pytest.mark.parametrize("terminal", ["exec", "session"])
def test_action_format_reaches_every_stage_with_its_short_prompt(tmp_path, terminal):
    c = get_config()  # the default scale: the short one-line prompt
    c.harness.action_format, c.harness.terminal = "bash", terminal
    validate_config(c, SCHEMA)
    p = Pipeline(resolved(c), str(tmp_path / terminal))
    want = get_format("bash").short_prompt(terminal)
    for n in ("base", "rsr1", "warmup_critic", "rpr1_fdr", "rsr2", "rpr2_spr"):
        h = get_experiment(p.graph[n].experiment).check(p.stage_config(n)).harness
        assert (h.action_format, h.terminal) == ("bash", terminal), n
        assert HarnessConfig.from_config(h).system_text == want, n  # what the agent reads
    h = get_experiment("evaluate").check(p.eval_base_config()).harness
    assert h.action_format == "bash" and HarnessConfig.from_config(h).system_text == want


def test_config_hash_invalidates_downstream_only(tmp_path):
    a = Pipeline(_config(), str(tmp_path / "a"))
    c = _config()
    c.stages.rpr1_fdr.num_steps = 6
    b = Pipeline(c, str(tmp_path / "b"))
    same = [n for n in a.order if a.config_hash(n) == b.config_hash(n)]
    assert same == ["base", "rsr1", "warmup_critic"]
    # RPR-2 follows RPR-1's actor rate: changing it changes rpr2 even without other edits
    c2 = _config()
    c2.stages.rpr1_fdr.actor_opt.learning_rate = 1e-3
    p2 = Pipeline(c2, str(tmp_path / "c"))
    assert p2.stage_config("rpr2_spr").actor_opt.learning_rate == pytest.approx(2e-4)


def test_validation_candidates_reach_rsr_and_rpr_and_spare_the_base(tmp_path):
    a = Pipeline(_config(), str(tmp_path / "a"))
    assert {n: a.stage_config(n).candidates.count for n in ("rsr1", "rpr1_fdr", "rsr2",
                                                            "rpr2_spr")} == dict.fromkeys(
        ("rsr1", "rpr1_fdr", "rsr2", "rpr2_spr"), 3)
    assert "candidates" not in a.stage_config("base")
    assert a.stage_config("warmup_critic").candidates.count == 1  # trains no actor
    c = _config()
    c.validation.candidates = 1
    b = Pipeline(c, str(tmp_path / "b"))
    assert b.stage_config("rsr1").candidates.count == 1
    assert [n for n in a.order if a.config_hash(n) == b.config_hash(n)] == ["base"]
    c.validation.enabled = False  # no model selection: no candidates either
    off = Pipeline(c, str(tmp_path / "c"))
    assert off.stage_config("rpr1_fdr").candidates.count == 1


def test_train_stats_counts_the_steps_taken(tmp_path):
    d = str(tmp_path)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 0, "skipped": "empty Q_clean"}) + "\n")
    assert train_stats(d)["steps"] == 0.0  # RSR that took no SFT step
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps({"step": k, "loss": 1.0 / k}) + "\n" for k in (1, 2, 3)))
    st = train_stats(d)
    assert st["steps"] == 3.0 and st["final/loss"] == pytest.approx(1 / 3)


def test_bad_stage_override_is_named_before_work(tmp_path):
    c = get_config()
    c.scale = "test"
    c.stages.rpr1_fdr.num_steps = 0  # out of range for rpr_phase
    p = Pipeline(resolved(c), str(tmp_path))
    with pytest.raises(PipelineError, match="num_steps"):
        p.resolve_all()
    assert not os.path.exists(tmp_path / "base")
    with pytest.raises(ConfigError, match="scale"):
        c2 = get_config()
        c2.scale = "huge"
        validate_config(c2, SCHEMA)
    # a training family asked for as a held-out family: named before any stage runs
    c3 = get_config()
    c3.scale = "test"
    c3.eval.heldout_families = ("archive", "config_edit")
    with pytest.raises(PipelineError, match=r"eval.heldout_families = \('archive', "
                       r"'config_edit'\): \['config_edit'\] are not held-out families"):
        Pipeline(resolved(c3), str(tmp_path)).resolve_all()
    assert not os.path.exists(tmp_path / "base")
    c3.eval.heldout_families = ("archive",)
    Pipeline(resolved(c3), str(tmp_path)).resolve_all()


@pytest.mark.parametrize("stage,path,value,names", [
    ("rpr2_spr", "actor_opt.learning_rate", 3e-6, "pipeline.rpr2_lr_divisor"),
    ("rpr1_fdr", "ppo.critic_warmup_steps", 7, "pipeline.critic_warmup_steps"),
])
def test_a_graph_derived_override_is_refused_with_what_derives_it(tmp_path, stage, path,
                                                                  value, names):
    """A per-stage value the graph rules would overwrite is never dropped without a word."""
    c = get_config()
    c.scale = "test"
    node = c.stages[stage]
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(PipelineError, match=rf"config.stages.{stage}.{path}=.* cannot take "
                       rf"effect: the stage graph derives it .*{names}"):
        Pipeline(resolved(c), str(tmp_path)).resolve_all()
    assert not os.path.exists(tmp_path / "base")


def test_the_derived_value_given_explicitly_and_what_derives_it_take_effect(tmp_path):
    c = get_config()
    c.scale = "test"
    c.pipeline.critic_warmup_steps = 7
    c.pipeline.rpr2_lr_divisor = 2.0
    p = Pipeline(resolved(c), str(tmp_path))
    p.resolve_all()
    r1, r2 = p.stage_config("rpr1_fdr"), p.stage_config("rpr2_spr")
    assert r1.ppo.critic_warmup_steps == r2.ppo.critic_warmup_steps == 7
    assert r2.actor_opt.learning_rate == pytest.approx(r1.actor_opt.learning_rate / 2)
    c.stages.rpr1_fdr.ppo.critic_warmup_steps = 7  # the value the graph derives: allowed
    Pipeline(resolved(c), str(tmp_path / "again")).resolve_all()


@pytest.mark.parametrize("where", ["experiments", "stages"])
def test_a_misspelled_scale_key_fails(tmp_path, monkeypatch, where):
    from terminal_rsi.pipeline import scales

    test = dict(scales.SCALES["test"])
    key = "rpr_phase" if where == "experiments" else "rpr1_fdr"
    part = dict(test.get(where, {}))
    part[key] = {**part.get(key, {}), "ppo.critic_warmup_stepz": 3}
    test[where] = part
    monkeypatch.setitem(scales.SCALES, "test", test)
    c = get_config()
    c.scale = "test"
    with pytest.raises(PipelineError, match=r"scale 'test'.*critic_warmup_stepz"):
        Pipeline(resolved(c), str(tmp_path)).resolve_all()


def _ledger_dict(tmp_path):
    led = L.Ledger(str(tmp_path), [("base", "base_sft"), ("rsr1", "rsr")])
    led.update("base", status="done", config_hash="ab" * 32, wall_s=1.5,
               inputs={}, outputs={"export": "base/export"}, train={"steps": 3.0},
               eval={"heldout_instances": {"k": 3, "num_tasks": 2, "mean_at_k": 0.5,
                                           "pass_at_k": {"1": 0.5, "3": 1.0},
                                           "per_family": {}, "strata": {}}})
    return led


def test_ledger_follows_c5_and_is_written_atomically(tmp_path, monkeypatch):
    led = _ledger_dict(tmp_path)
    with open(led.path) as f:
        d = json.load(f)
    L.validate_ledger(d)
    assert d["format"] == "terminal_rsi.ledger/1" and d["run"] == str(tmp_path)
    assert [s["name"] for s in d["stages"]] == ["base", "rsr1"]
    assert d["stages"][1]["status"] == "pending"
    # a crash during the write leaves the previous ledger intact, no temp file behind
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        led.update("rsr1", status="running")
    monkeypatch.undo()
    with open(led.path) as f:
        assert json.load(f) == d
    assert [x for x in os.listdir(tmp_path) if x.endswith(".tmp")] == []
    # a reloaded ledger keeps earlier entries
    again = L.Ledger(str(tmp_path), [("base", "base_sft"), ("rsr1", "rsr")])
    assert again.entry("base")["config_hash"] == "ab" * 32


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d["stages"][0].update(status="weird"), "status"),
    (lambda d: d["stages"][0].update(inputs={"actor": "/abs/path"}), "relative"),
    (lambda d: d["stages"][0].update(status="failed", error=None), "error"),
    (lambda d: d["stages"][0]["train"].update(x="no"), "number"),
    (lambda d: d["stages"].append(dict(d["stages"][0])), "duplicate"),
])
def test_validate_ledger_rejects(tmp_path, mutate, match):
    d = _ledger_dict(tmp_path).to_dict()
    mutate(d)
    with pytest.raises(L.LedgerError, match=match):
        L.validate_ledger(d)


@pytest.mark.parametrize("name", ["rpr2_spr", "terminal_rsi", "warmup_critic", "rpr1_fdr",
                                  "rpr2_fdr", "evaluate", "eval_smollm2", "base_weights",
                                  "rpr2_spr_smollm2"])
def test_config_files_validate(name):
    from terminal_rsi.config import registry
    from terminal_rsi.pipeline.resolve import load_config_file

    c = load_config_file(f"configs/{name}.py")
    validate_config(c, registry.get_experiment(c.experiment).SCHEMA)
    if name == "rpr2_fdr":
        r1 = load_config_file("configs/rpr1_fdr.py")
        assert c.actor_opt.learning_rate == pytest.approx(r1.actor_opt.learning_rate / 5)
    if name == "terminal_rsi":
        assert tuple(c.pipeline.targets) == ("rpr2_fdr", "rpr2_spr")


def test_every_stage_field_is_a_command_line_override(tmp_path):
    """config.stages.<stage> declares every field of the stage's config file (None = unset),
    so absl's --config.stages.<stage>.<field>=v works for any field; graph-set fields
    (init, mode, experiment) are not offered."""
    from absl import flags
    from ml_collections import config_flags

    from terminal_rsi.pipeline.resolve import load_config_file

    c = get_config()
    for name in ("rsr1", "rpr1_fdr", "warmup_critic"):
        spec = G.STAGES[name]
        fields = set(flatten(load_config_file(spec.config_file)))
        offered = set(flatten(c.stages[name]))
        assert offered == {f for f in fields if f.split(".")[0] not in ("init", "mode",
                                                                         "experiment")}
        assert all(v is None for v in flatten(c.stages[name]).values())
    # base: the fields of both base configs (base_sft's demos, base_weights' model.gguf)
    assert {"demos.runbook_fraction", "model.gguf"} <= set(flatten(c.stages.base))

    def parse(*overrides):  # as experiments/run.py parses its command line
        argv = ["prog", "--config=configs/rpr2_spr.py", *overrides]
        fv = flags.FlagValues()
        config_flags.DEFINE_config_file("config", flag_values=fv, sys_argv=argv)
        fv(argv)
        return fv.config

    cfg = parse("--config.scale=test", "--config.stages.rsr1.sft.steps=3",
                "--config.stages.base.demos.runbook_fraction=0.25",
                "--config.stages.rpr2_spr.ppo.epochs=2")
    p = Pipeline(resolved(cfg), str(tmp_path))
    assert p.stage_config("rsr1").sft.steps == 3
    assert p.stage_config("base").demos.runbook_fraction == 0.25
    assert p.stage_config("rpr2_spr").ppo.epochs == 2
    assert p.stage_config("rpr2_fdr").ppo.epochs == 1  # other stages keep their value
    with pytest.raises((flags.Error, KeyError), match="init"):  # graph-set: not an override
        parse("--config.stages.rpr1_fdr.init.actor_weights=/x")
