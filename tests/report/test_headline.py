"""The report's headline (issue 28): per-stage success per suite, the validation decision with
its reason, critic EV and wall time first; notes folded below; training numbers selected.
Expected values are read from the fixture's ledger.json or written out by hand."""

import json
import shutil

import pytest

from terminal_rsi.report import ReportOptions, build_report
from terminal_rsi.report import data as D

from .fixture_run import BASE_DIAGNOSTICS, REJECTED, RPR_DIAGNOSTICS

pytestmark = pytest.mark.xdist_group("report")


def _page(index) -> dict:
    text = (index.parent / "data.js").read_text()
    return json.loads(text[len("window.TRSI_REPORT="):-2])


def _copy(real_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(real_run["run"], run, ignore=shutil.ignore_patterns("report"))
    return run, json.loads((run / "ledger.json").read_text())


def test_headline_rows(real_run, built_report):
    head = _page(built_report)["headline"]
    ledger = json.loads((real_run["run"] / "ledger.json").read_text())
    assert head["suites"] == ["heldout_instances", "heldout_families"] and head["k"] == 1
    assert [r["stage"] for r in head["rows"]] == [s["name"] for s in ledger["stages"]]
    base, rpr1, failed, pending = head["rows"]
    rpr1_eval = ledger["stages"][1]["eval"]
    assert rpr1["mean_at_k"] == {x: rpr1_eval[x]["mean_at_k"] for x in head["suites"]}
    assert rpr1["pass_at_k"] == {x: rpr1_eval[x]["pass_at_k"]["1"] for x in head["suites"]}
    assert base["mean_at_k"] == {"heldout_instances": 0.25, "heldout_families": None}
    assert (base["ev"], rpr1["ev"]) == (0.0, 0.42)
    assert base["wall"] == {"train": 600.0, "eval": 30.0, "validation": 12.0, "total": 642.0}
    assert rpr1["wall"]["total"] == 1200.0 + 45.0 + 20.0
    assert base["validation"]["decision"] == "base"
    assert {k: rpr1["validation"][k] for k in ("decision", "score", "input", "input_score",
                                               "chosen", "reason")} == {
        "decision": "input", "score": 0.25, "input": "base_sft", "input_score": 0.5,
        "chosen": "base_sft", "reason": REJECTED}
    assert failed["status"] == "failed" and failed["error"].startswith("PhaseError")
    for row in (failed, pending):
        assert row["validation"] is None and row["ev"] is None
        assert row["wall"]["total"] is None and set(row["mean_at_k"].values()) == {None}


def test_headline_opens_the_page(built_report):
    html = built_report.read_text()
    order = [html.index(f'<section id="{x}"') for x in
             ("headline", "notes", "plots", "diagnostics", "families", "stages", "browser")]
    assert order == sorted(order)
    assert html.index('id="headline-plot"') < html.index('id="notes"')
    assert '<details id="stage-details">' in html  # the raw stage record is folded


def test_training_numbers_are_selected(built_report):
    page = _page(built_report)
    assert [r["key"] for r in page["train_numbers"]] == [
        "loss", "reward_binary", "explained_variance", "final/actor/kl_ref"]
    assert page["train_numbers"][0]["values"] == {"base_sft": 0.4}
    assert page["stages"][1]["train"]["raw_counter"] == 7  # all numbers stay, folded


def test_diagnostics_table(built_report):
    """One row per stage with diagnostics, the ledger's numbers under DIAGNOSTIC_COLUMNS (the
    eval EV read from the stage's eval); per-family success before and after each stage."""
    diag = _page(built_report)["diagnostics"]
    keys = [c["key"] for c in diag["columns"]]
    assert keys == [k for k, _ in D.DIAGNOSTIC_COLUMNS] and "policy_movement" in keys
    base, rpr1 = diag["rows"]  # the failed and the pending stage have none
    assert (base["stage"], rpr1["stage"]) == ("base_sft", "rpr1_fdr")
    assert rpr1["values"] == {**{k: RPR_DIAGNOSTICS.get(k) for k in keys},
                              "eval/explained_variance": 0.42}
    assert base["values"]["mean/actor/grad_norm"] == BASE_DIAGNOSTICS["mean/actor/grad_norm"]
    assert base["values"]["eval/explained_variance"] == 0.0
    assert {k for k, v in base["values"].items() if v is not None} == {
        "mean/actor/grad_norm", "eval/explained_variance"}
    assert diag["families"] == [
        {"stage": "base_sft", "suite": "heldout_instances", "family": "hint_lookup",
         "before": None, "after": 0.25, "change": None},
        {"stage": "rpr1_fdr", "suite": "heldout_instances", "family": "fix_script",
         "before": 1.0, "after": None, "change": None},
        {"stage": "rpr1_fdr", "suite": "heldout_instances", "family": "hint_lookup",
         "before": 0.25, "after": 0.5, "change": 0.25}]
    html = built_report.read_text()
    assert html.index('<section id="plots"') < html.index('<section id="diagnostics"') < \
        html.index('<section id="families"')
    assert 'id="diagnostics-table"' in html and 'id="diagnostics-family-table"' in html


def test_notes_are_grouped(real_run, tmp_path):
    page = _page(build_report(real_run["run"], tmp_path / "rep",
                              ReportOptions(max_episodes_per_shard=1)))
    # shards with more than one episode: discovery (2), step (6), eval (2), validation (2)
    truncated = [g for g in page["notes"] if g["kind"] == "truncated"]
    assert len(truncated) == 1 and len(truncated[0]["items"]) == 4
    assert truncated[0]["summary"] == ("4 trajectory shards truncated to their first "
                                       "episodes (max_episodes_per_shard)")
    missing = [g for g in page["notes"] if g["kind"] == "missing"]
    assert missing[0]["summary"] == missing[0]["items"][0] and "absent.png" in \
        missing[0]["summary"]
    assert [g["kind"] for g in page["notes"]] == ["missing", "truncated"]  # problems first
    assert len(page["warnings"]) == 5  # the flat list keeps every note


def test_group_notes():
    groups = D.group_notes([("truncated", "a"), ("odd", "b"), ("truncated", "c"),
                            ("missing", "d")])
    assert [(g["kind"], g["summary"], g["items"]) for g in groups] == [
        ("missing", "d", ["d"]), ("other", "b", ["b"]),
        ("truncated", D.NOTE_KINDS["truncated"].format(n=2), ["a", "c"])]
    assert D.group_notes([]) == []


def test_ledger_without_validation_or_eval_wall(real_run, tmp_path):
    """A ledger written before model selection: no validation, no eval_wall_s."""
    run, ledger = _copy(real_run, tmp_path)
    for s in ledger["stages"]:
        s.pop("validation", None)
        s.pop("eval_wall_s", None)
    (run / "ledger.json").write_text(json.dumps(ledger))
    page = _page(build_report(run))
    rows = page["headline"]["rows"]
    assert [r["validation"] for r in rows] == [None] * 4
    assert [r["wall"]["total"] for r in rows] == [600.0, 1200.0, None, None]
    assert all(s["validation"] is None and s["eval_wall_s"] is None for s in page["stages"])
    assert not any(f["source"] == "validation" for f in page["families"])


def test_a_shard_two_stages_name_is_shown_once(real_run, tmp_path):
    """A critic warm-up's eval names its input's episodes: listed once, under the first."""
    run, ledger = _copy(real_run, tmp_path)
    ledger["stages"][3]["eval"] = {"heldout_instances": {
        "k": 1, "trajectories": "rpr1_fdr/eval/heldout_instances.jsonl"}}
    (run / "ledger.json").write_text(json.dumps(ledger))
    (run / "final_eval").mkdir()
    page = _page(build_report(run))
    assert len(page["episodes"]) == 12 and {e["stage"] for e in page["episodes"]} == {
        "base_sft", "rpr1_fdr"}
    (shared,) = [g for g in page["notes"] if g["kind"] == "shared"]
    assert shared["items"] == ["stage final_eval: rpr1_fdr/eval/heldout_instances.jsonl is "
                               "shown under stage rpr1_fdr"]
