"""Offline rescoring: hand-computed metrics, JSON Lines input, the experiment end to end."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import pytest
from rewards_testutil import LEGACY_REPORT

from terminal_rsi.config import registry
from terminal_rsi.config.configuration import validate_config
from terminal_rsi.rewards import (
    EpisodeFormatError,
    EpisodeOutcome,
    FamilyDivisors,
    VerificationReport,
    load_episodes,
)
from terminal_rsi.rewards.outcomes import synthetic_episodes, write_episodes
from terminal_rsi.rewards.rescore import rescore, statement

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_config():
    spec = importlib.util.spec_from_file_location("rescore_config", ROOT / "configs/rescore.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


def ep(p, n, s, declared=None, family="a", turns=20):
    report = (VerificationReport.from_counts(p, n, terminal_success=s) if n
              else VerificationReport.invalid("crashed", terminal_success=s))
    return EpisodeOutcome(family=family, report=report, turns=turns, declared_done_turn=declared)


def test_hand_computed_metrics():
    episodes = [ep(12, 12, False, declared=3), ep(5, 10, True), ep(0, 5, False, declared=15),
                ep(0, 0, True)]
    old, new = FamilyDivisors({"a": 10.0}), FamilyDivisors({"a": 20.0})
    res = rescore(episodes, old, new)
    m = res["metrics"]["fdr/old"]  # rewards 1.2, 0.5, 0.0, 1.0
    assert m["total_mass"] == pytest.approx(2.7)
    assert m["failed_reward_share"] == pytest.approx(1.2 / 2.7)
    assert m["failures_ge_1"] == 1
    assert m["mean_success"] == pytest.approx(0.75) and m["mean_failure"] == pytest.approx(0.6)
    assert m["mean_early_declaration_failure"] == pytest.approx(1.2)
    s = res["metrics"]["spr/recalibrated"]  # 12/32, 1 + 5/25, 0, 1
    assert s["total_mass"] == pytest.approx(12 / 32 + 1.2 + 1.0)
    assert s["failed_reward_share"] == pytest.approx((12 / 32) / (12 / 32 + 2.2))
    assert s["failures_ge_1"] == 0
    assert s["mean_success"] == pytest.approx(1.1)
    assert res["metrics"]["binary"]["failed_reward_share"] == 0.0
    assert (res["episodes"], res["successes"], res["invalid_reports"]) == (4, 2, 1)
    assert res["early_declaration_failures"] == 1 and res["labels_unchanged"]
    row = res["per_family"][0]
    assert row["family"] == "a" and row["mean_fdr/old"] == pytest.approx(2.7 / 4)
    assert row["old_divisor"] == 10.0 and row["new_divisor"] == 20.0
    assert "Failures' share of reward mass moves from 44.44% to" in statement(res)


def test_rescore_keeps_spr_ordering_on_synthetic_population():
    episodes = synthetic_episodes(seed=3, n_per_family=10)
    table = FamilyDivisors({"file-ops": 1.0})
    res = rescore(episodes, table, table)
    labels = [e.success for e in episodes]
    for key in ("spr/old", "spr/recalibrated"):
        assert [r >= 1.0 for r in res["rewards"][key]] == labels


def test_jsonl_with_reports_counts_and_invalid(tmp_path, real_report):
    (tmp_path / "reports").mkdir()
    shutil.copy(LEGACY_REPORT, tmp_path / "reports" / "legacy.json")
    shutil.copy(real_report[2], tmp_path / "reports" / "current.json")
    lines = [
        {"family": "a", "S": False, "report": "reports/legacy.json", "turns": 4,
         "declared_done_turn": 2, "episode_id": "e1"},
        {"family": "a", "S": 0, "report": "reports/current.json", "turns": 9},
        {"family": "b", "S": True, "P": 3, "N": 3, "turns": 30, "declared_done_turn": None},
        {"family": "b", "S": False, "invalid_reason": "timeout", "turns": 50},
        {"family": "b", "S": False, "report": "reports/missing.json", "turns": 50},
    ]
    path = tmp_path / "episodes.jsonl"
    path.write_text("# comment\n\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    eps = load_episodes(path)
    assert [(e.report.P, e.report.N, e.report.valid) for e in eps] == [
        (2, 9, True), (4, 11, True), (3, 3, True), (0, 0, False), (0, 0, False)]
    assert eps[0].early_declaration_failure() and eps[0].episode_id == "e1"
    assert "not found" in eps[4].report.reason
    out = tmp_path / "roundtrip.jsonl"
    write_episodes(out, eps)
    back = load_episodes(out)
    assert [(e.report.P, e.report.N, e.report.valid, e.success, e.turns) for e in back] == \
        [(e.report.P, e.report.N, e.report.valid, e.success, e.turns) for e in eps]


@pytest.mark.parametrize("line,match", [
    ('{"S": true, "P": 1, "N": 1, "turns": 1}', "family"),
    ('{"family": "a", "S": "yes", "P": 1, "N": 1, "turns": 1}', "S = 'yes'"),
    ('{"family": "a", "S": true, "turns": 1}', "exactly one of"),
    ('{"family": "a", "S": true, "P": 1, "turns": 1}', "without 'N'"),
    ('{"family": "a", "S": true, "P": 1, "N": 1, "report": "x", "turns": 1}', "exactly one"),
    ('{"family": "a", "S": true, "P": 1, "N": 1, "turns": -3}', "turns = -3"),
    ('{"family": "a", "S": true, "P": 1, "N": 1, "turns": 1, "sucess": 1}', "unknown keys"),
    ('{"family": "a", "S": true, "P": 1, "N": 1, "turns": 1', "invalid JSON"),
    ('[1, 2]', "expected a JSON object"),
])
def test_bad_jsonl_lines(tmp_path, line, match):
    path = tmp_path / "e.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(EpisodeFormatError, match=match) as info:
        load_episodes(path)
    assert "e.jsonl:1" in str(info.value)


def test_empty_or_missing_jsonl(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n# nothing\n")
    with pytest.raises(EpisodeFormatError, match="no episodes"):
        load_episodes(tmp_path / "e.jsonl")
    with pytest.raises(EpisodeFormatError, match="not found"):
        load_episodes(tmp_path / "missing.jsonl")


def test_experiment_on_shipped_demo(tmp_path):
    config = load_config()
    experiment = registry.get_experiment("rescore")
    validate_config(config, experiment.SCHEMA)
    result = experiment.run(config, str(tmp_path))
    for name in ("rescore.json", "rescore.png", "recalibrated_divisors.json"):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "rescore.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "rescore.json").read_text())
    assert saved["statement"] == result["statement"] and saved["labels_unchanged"]
    m = saved["metrics"]
    assert m["spr/old"]["failures_ge_1"] == m["spr/recalibrated"]["failures_ge_1"] == 0
    assert m["fdr/old"]["failures_ge_1"] > 0  # the demo has high-reward FDR failures
    assert m["spr/recalibrated"]["failed_reward_share"] < m["fdr/old"]["failed_reward_share"]
    # the shipped demo exercises every recalibration rule
    assert all(v >= 1 for v in saved["divisors"]["rule_counts"].values())
    table = FamilyDivisors.load(tmp_path / "recalibrated_divisors.json")
    assert set(table.provenance.decisions) == {r["family"] for r in saved["per_family"]}


def test_run_py_entry_point(tmp_path):
    episodes = synthetic_episodes(seed=5, n_per_family=6)
    write_episodes(tmp_path / "eps.jsonl", episodes)
    cmd = [sys.executable, str(ROOT / "experiments/run.py"), f"--config={ROOT}/configs/rescore.py",
           f"--workdir={tmp_path / 'out'}", f"--config.rescore.trajectories={tmp_path}/eps.jsonl",
           "--config.rescore.divisors=", "--config.rescore.figure=False"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = json.loads((tmp_path / "out" / "rescore.json").read_text())
    assert saved["inputs"]["divisors"] is None and saved["episodes"] == len(episodes)
    assert saved["divisors"]["old"]["provenance"]["source"].startswith("calibrated from")
    assert not (tmp_path / "out" / "rescore.png").exists()
    bad = subprocess.run(cmd[:3] + ["--config.rescore.hygiene=maybe"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "config.rescore.hygiene" in bad.stderr
