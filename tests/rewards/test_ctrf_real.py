"""CTRF reports written by real tools: pytest + pytest-json-ctrf (current release), and a
legacy report written by pytest-json-ctrf 0.3.7 (data/legacy_pytest_json_ctrf_0.3.7.json)."""

from __future__ import annotations

import json

import pytest
from rewards_testutil import LEGACY_REPORT, expected_statuses, run_pytest_ctrf

from terminal_rsi.rewards import (
    HygieneRule,
    VerificationReport,
    fdr,
    parse_ctrf,
    spr,
    success_from_exit_code,
)
from terminal_rsi.rewards.divisors import FamilyDivisors


def test_plugin_statuses_are_what_the_suite_expects(real_report):
    _, obj, _ = real_report
    expected = expected_statuses()
    got = {t["name"].split("::", 1)[1]: t["status"] for t in obj["results"]["tests"]}
    assert got == {name: status for name, (status, _) in expected.items()}
    assert obj["reportFormat"] == "CTRF" and obj["specVersion"].startswith("1.")


def test_real_report_counts(real_report):
    code, _, path = real_report
    expected = expected_statuses()
    report = parse_ctrf(path, terminal_success=success_from_exit_code(code), strict=True)
    semantic = [s for s, hyg in expected.values() if not hyg]
    assert report.valid and report.shape == "ctrf"
    assert code != 0 and report.strict_success is False
    assert report.P == semantic.count("passed") == 4
    assert report.N == len(semantic) == 11
    assert (report.failed, report.skipped, report.pending, report.other) == (5, 2, 0, 0)
    hyg = {n.split("::", 1)[1]: s for n, s in report.hygiene_checks}
    assert hyg == {n: s for n, (s, h) in expected.items() if h}
    assert report.hygiene_failed == ("test_verifier.py::test_no_stray_processes",)
    # the same file as a parsed object gives the same counts
    again = parse_ctrf(json.loads(path.read_text()), terminal_success=False)
    assert (again.P, again.N, again.source) == (4, 11, None)


def test_real_report_without_hygiene_rule_counts_everything(real_report):
    _, _, path = real_report
    report = parse_ctrf(path, terminal_success=False, hygiene=HygieneRule.none())
    assert (report.P, report.N, report.hygiene_checks) == (6, 14, ())


def test_real_all_passing_run_gives_strict_success(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    source = (
        "import pytest\n"
        "@pytest.mark.parametrize('x', range(4))\n"
        "def test_ok(x):\n    assert x >= 0\n"
        "def test_tests_dir_untouched():\n    pass\n"
    )
    code, _, path = run_pytest_ctrf(tmp_path, source)
    report = parse_ctrf(path, terminal_success=success_from_exit_code(code), strict=True)
    assert code == 0 and report.strict_success and (report.P, report.N) == (4, 4)
    table = FamilyDivisors({"fam": 8.0})
    assert fdr(report, "fam", table) == 0.5
    assert spr(report, "fam", table) == pytest.approx(1.0 + 4 / 12)


def test_real_collection_error_report_is_invalid(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    code, obj, path = run_pytest_ctrf(tmp_path, "import does_not_exist_xyz\n"
                                                "def test_a():\n    pass\n")
    assert code != 0 and obj["results"]["tests"] == []
    report = parse_ctrf(path, terminal_success=success_from_exit_code(code))
    assert not report.valid and "zero tests" in report.reason
    assert fdr(report, "f", FamilyDivisors()) == 0.0  # falls back to S = 0


def test_legacy_report_from_pytest_json_ctrf_0_3_7():
    obj = json.loads(LEGACY_REPORT.read_text())
    assert set(obj) == {"results"}  # the legacy shape: no reportFormat/specVersion
    report = parse_ctrf(LEGACY_REPORT, terminal_success=False, strict=True)
    assert report.valid and report.shape == "legacy"
    # test_param[1..3] collapsed into one entry "test_param" (retries = 2), status failed
    assert (report.P, report.N) == (2, 9)
    assert (report.failed, report.skipped) == (5, 2)
    assert any("2 parametrized cases were collapsed" in w for w in report.warnings)
    assert len(report.hygiene_checks) == 3
    assert VerificationReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_legacy_variants_parse(tmp_path):
    """Hand-made legacy variants: 0.1.x seconds durations, omitted retries, float start/stop."""
    obj = json.loads(LEGACY_REPORT.read_text())
    for t in obj["results"]["tests"]:
        t["duration"] = t["duration"] / 1000.0  # 0.1.x summed pytest's float seconds
        t.pop("retries", None)
    report = parse_ctrf(obj, terminal_success=True, strict=True)
    assert (report.P, report.N, report.shape) == (2, 9, "legacy")
    assert report.strict_success  # S is the terminal verdict, whatever the counts say
    assert any("non-hygiene checks failed" in w for w in report.warnings)
