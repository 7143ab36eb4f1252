"""A tiny end-to-end pipeline run (scale "test": 2 families, tiny model and budgets) up to
rpr1_fdr: prerequisites run first, every stage is evaluated (k = 3, both suites), the ledger
follows C5, the critic passes through RSR unchanged, plots exist; a second run recomputes
nothing; a failing stage is recorded and stops the run; a stage that offers candidates has
the best of them chosen."""

import json
import os
import shutil

import numpy as np
import pytest

from terminal_rsi.agent import read_shard
from terminal_rsi.pipeline import validate_ledger
from terminal_rsi.pipeline.graph import STAGES
from terminal_rsi.pipeline.handoff import restore_export, same_params
from terminal_rsi.pipeline.runner import Pipeline, StageFailed
from terminal_rsi.pipeline.validation import best_candidate
from tests.pipeline.helpers import small_config, trained_export

# module/session-scoped fixtures are expensive: keep these tests on one xdist worker
pytestmark = pytest.mark.xdist_group("pipeline_run")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pipe"))
    first = Pipeline(small_config(), d, log=lambda s: None)
    first.run()
    with open(os.path.join(d, "ledger.json")) as f:
        ledger = json.load(f)
    second = Pipeline(small_config(), d, log=lambda s: None)
    second.run()
    return d, first, second, ledger


def test_prerequisites_ran_in_order_and_were_evaluated(run):
    d, first, _, ledger = run
    assert first.executed == ["base", "rsr1", "warmup_critic", "rpr1_fdr"]
    validate_ledger(ledger)
    by = {s["name"]: s for s in ledger["stages"]}
    assert [s["name"] for s in ledger["stages"]] == first.executed
    for name, s in by.items():
        assert s["status"] == "done" and s["error"] is None and len(s["config_hash"]) == 64
        assert set(s["eval"]) == {"heldout_instances", "heldout_families"}
        for ev in s["eval"].values():
            assert ev["k"] == 3 and ev["num_tasks"] >= 1
            assert os.path.exists(os.path.join(d, ev["trajectories"]))
            if name != "warmup_critic":
                assert 0.0 <= ev["mean_at_k"] <= 1.0 and set(ev["pass_at_k"]) == {"1", "3"}
                assert set(ev["strata"]) == {"Q1", "Q2", "Q3", "Q4"}
                assert ev["per_family"]
    assert by["rpr1_fdr"]["inputs"] == {"actor": "rsr1/export",
                                        "critic": "warmup_critic/export"}
    assert by["rpr1_fdr"]["train"]["steps"] == 5.0
    assert by["warmup_critic"]["eval"]["heldout_instances"]["actor_from"] == "rsr1"
    with open(os.path.join(d, "rpr1_fdr", "metrics.jsonl")) as f:
        rows = [json.loads(x) for x in f]
    assert [r["critic_only"] for r in rows] == [True] * 4 + [False]
    assert os.path.exists(os.path.join(d, "strata.json"))
    for key, path in ledger["plots"].items():
        assert os.path.getsize(os.path.join(d, path)) > 1000, key
    assert {"progression", "training_curves"} <= set(ledger["plots"])


def test_every_training_stage_has_its_diagnostics(run):
    """The ledger's `diagnostics` (issue 51): turns per episode, PPO clip fraction and
    approximate KL over RPR's one joint step, gradient norms, critic EV, policy movement on
    the run's probe (the same probe.jsonl for every stage) and per-family success before
    and after."""
    d, _, _, ledger = run
    by = {s["name"]: s.get("diagnostics") for s in ledger["stages"]}
    with open(os.path.join(d, "rpr1_fdr", "metrics.jsonl")) as f:
        rows = [json.loads(x) for x in f]
    last = rows[-1]
    rpr = by["rpr1_fdr"]
    assert rpr["joint_steps"] == 1 and rpr["last/actor/approx_kl"] == last["actor/approx_kl"]
    assert rpr["mean/actor/clip_frac"] == pytest.approx(
        last["actor/clip_frac_low"] + last["actor/clip_frac_high"])
    # at this scale every reward is 0 (no advantage, no gradient): the plumbing is tested
    assert rpr["mean/actor/grad_norm"] == last["actor/grad_norm"] >= 0
    assert rpr["mean/turns"] >= 1  # the batch EV is undefined (None) when every return is 0
    assert ("mean/value_ev_pre_update" in rpr) == any(
        r["value_ev_pre_update"] is not None for r in rows)
    warm = by["warmup_critic"]
    assert warm["joint_steps"] == 0 and "mean/actor/clip_frac" not in warm
    assert warm["mean/turns"] >= 1 and warm["mean/critic/grad_norm"] >= 0
    assert by["rsr1"]["mean/discovery/turns"] >= 1 and by["rsr1"]["mean/turns"] >= 1
    probe = read_shard(os.path.join(d, "probe.jsonl"))
    assert probe and all(t.num_generated > 0 for t in probe)
    sft_steps = {s["name"]: s["train"].get("sft_steps") for s in ledger["stages"]}
    assert by["base"]["mean/actor/grad_norm"] > 0
    assert ("mean/actor/grad_norm" in by["rsr1"]) == (sft_steps["rsr1"] > 0)
    for name in ("rsr1", "rpr1_fdr"):  # each that trained moved its actor from its input's
        assert (by[name]["policy_movement"] > 0) == (sft_steps[name] != 0), name
        assert by[name]["probe_sequences"] == len(probe) and by[name]["probe_tokens"] > 0
    assert "policy_movement" not in by["base"] and "policy_movement" not in warm
    for name in ("base", "rsr1", "rpr1_fdr"):
        src = STAGES[name].inputs.get("actor")
        evals = {s["name"]: s["eval"] for s in ledger["stages"]}
        for suite, fams in by[name]["per_family"].items():
            assert set(fams) == set(evals[name][suite]["per_family"])
            for fam, rec in fams.items():
                assert rec["after"] == evals[name][suite]["per_family"][fam]["success"]
                assert rec["before"] == (evals[src][suite]["per_family"][fam]["success"]
                                         if src else None)
        assert set(by[name]["per_family"]) == {"heldout_instances", "heldout_families"}
    assert warm["per_family"] == {}  # a critic warm-up's actor is its input's


def test_handoffs_are_weights_only_and_rsr_keeps_the_critic(run):
    d = run[0]
    assert same_params(restore_export(os.path.join(d, "base", "export"), "critic"),
                       restore_export(os.path.join(d, "rsr1", "export"), "critic"))
    assert same_params(restore_export(os.path.join(d, "base", "export"), "critic"),
                       restore_export(trained_export(d, "rsr1"), "critic"))
    a = restore_export(os.path.join(d, "rsr1", "export"), "actor")
    b = restore_export(trained_export(d, "rpr1_fdr"), "actor")
    assert not same_params(a, b)  # RPR-1 trained the actor (one joint step)
    assert sorted(os.listdir(os.path.join(d, "rpr1_fdr", "export"))) == ["actor", "critic"]


def test_every_actor_stage_has_its_validation_decision(run):
    d, _, _, ledger = run
    by = {s["name"]: s for s in ledger["stages"]}
    assert "validation" not in by["warmup_critic"] or not by["warmup_critic"]["validation"]
    assert by["base"]["validation"]["decision"] == "base"
    for name in ("rsr1", "rpr1_fdr"):
        v, src = by[name]["validation"], STAGES[name].inputs["actor"]
        prev = by[src]["validation"]
        assert v["input"] == src and v["input_score"] == prev["chosen_score"]
        assert v["k"] == 3 and v["num_tasks"] >= 1 and v["reason"]
        assert os.path.exists(os.path.join(d, v["trajectories"]))
        assert v["decision"] == ("kept" if v["score"] > prev["chosen_score"] else "input")
        for role, dep in STAGES[name].inputs.items():
            same = same_params(restore_export(os.path.join(d, name, "export"), role),
                               restore_export(os.path.join(d, dep, "export"), role))
            if v["decision"] == "input":  # the inputs, unchanged; the trained ones kept
                assert same and os.path.isdir(os.path.join(d, v["rejected"], role))
                assert v["chosen"] == prev["chosen"]
            elif role == "actor":
                assert not same and v["chosen"] == name


def test_second_run_recomputes_nothing(run):
    d, _, second, ledger = run
    assert second.executed == [] and second.evaluated == []
    with open(os.path.join(d, "ledger.json")) as f:
        again = json.load(f)
    assert [s["config_hash"] for s in again["stages"]] == [
        s["config_hash"] for s in ledger["stages"]]
    assert [s["finished"] for s in again["stages"]] == [s["finished"] for s in ledger["stages"]]


def test_failed_stage_is_recorded_and_stops_the_run(run):
    d = run[0]
    c = small_config()
    c.stages.rpr1_fdr.tasks = {"train_split": "no_such_split"}
    p = Pipeline(c, d, log=lambda s: None)
    with pytest.raises(StageFailed, match="rpr1_fdr"):
        p.run()
    assert p.executed == []  # base, rsr1 and warmup_critic were reused
    with open(os.path.join(d, "ledger.json")) as f:
        led = json.load(f)
    validate_ledger(led)
    s = {x["name"]: x for x in led["stages"]}["rpr1_fdr"]
    assert s["status"] == "failed" and "no_such_split" in s["error"] and s["eval"] == {}
    assert os.path.exists(os.path.join(d, "rpr1_fdr", "error.txt"))
    assert np.isfinite(s["wall_s"])


@pytest.fixture(scope="module")
def candidates_run(run, tmp_path_factory):
    """The run above with RPR-1 one joint step longer: it offers its step-5 actor as well."""
    d = str(tmp_path_factory.mktemp("pipe_candidates") / "run")
    shutil.copytree(run[0], d)
    c = small_config()
    c.stages.rpr1_fdr.num_steps = 6
    p = Pipeline(c, d, log=lambda s: None)
    p.run()
    with open(os.path.join(d, "ledger.json")) as f:
        return d, p, json.load(f)


def test_a_stage_offers_its_candidates_and_the_best_is_chosen(candidates_run):
    d, p, ledger = candidates_run
    assert p.executed == ["rpr1_fdr"]  # base, rsr1 and warmup_critic were reused
    v = {s["name"]: s for s in ledger["stages"]}["rpr1_fdr"]["validation"]
    assert [(c["candidate"], c["step"]) for c in v["candidates"]] == [("step 5", 5),
                                                                      ("final", None)]
    scores = [c["score"] for c in v["candidates"]]
    best = v["candidates"][best_candidate(scores)]
    assert v["score"] == best["score"]
    assert os.path.exists(os.path.join(d, "rpr1_fdr", "validation", "step_5"))
    cand = os.path.join(d, "rpr1_fdr", "candidates", "step_5")
    assert sorted(os.listdir(cand)) == ["actor", "critic"]
    export = os.path.join(d, "rpr1_fdr", "export")
    if v["decision"] == "input":
        assert v["chosen_candidate"] is None
    else:
        assert v["chosen_candidate"] == best["candidate"]
        if best["step"] == 5:  # the candidate replaced the final export, kept at rejected/
            for role in ("actor", "critic"):
                assert same_params(restore_export(export, role), restore_export(cand, role))
            assert os.path.isdir(os.path.join(d, v["rejected"], "actor"))


def test_a_winning_candidate_replaces_the_export(candidates_run, monkeypatch):
    d, p, _ = candidates_run
    export = os.path.join(d, "rpr1_fdr", "export")
    cand = os.path.join(d, "rpr1_fdr", "candidates", "step_5")
    final = restore_export(trained_export(d, "rpr1_fdr"), "actor")  # what RPR-1 ended with
    scores = {5: 1.0, None: -1.0}  # the step-5 actor beats any input; the final one loses
    monkeypatch.setattr(Pipeline, "score_on_validation", lambda self, name, step, actor_dir: {
        "candidate": "final" if step is None else f"step {step}", "dir": actor_dir,
        "score": scores[step], "step": step, "num_tasks": 1, "per_family": {},
        "trajectories": "t"})
    rec = p.validate_stage("rpr1_fdr")
    assert rec["decision"] == "kept" and rec["chosen_candidate"] == "step 5"
    assert "step 5 actor" in rec["reason"] and rec["score"] == 1.0
    for role in ("actor", "critic"):
        assert same_params(restore_export(export, role), restore_export(cand, role))
    # the final export is kept at rejected/, also when the run's own decision moved it there
    assert same_params(restore_export(os.path.join(d, rec["rejected"]), "actor"), final)
