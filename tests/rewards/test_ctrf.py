"""parse_ctrf and VerificationReport: malformed reports, hygiene, verdict, serialization."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terminal_rsi.rewards import (
    DEFAULT_HYGIENE,
    HygieneRule,
    ReportError,
    VerificationReport,
    parse_ctrf,
    parse_reward_value,
    success_from_exit_code,
    success_from_reward,
    success_from_reward_file,
)


def _test(name, status, **kw):
    return {"name": name, "status": status, "duration": 3, **kw}


def valid_obj() -> dict:
    tests = [
        _test("t::test_a", "passed"),
        _test("t::test_b", "failed"),
        _test("t::test_c", "skipped"),
        _test("t::test_d", "passed"),
        _test("t::test_e", "pending"),
        _test("t::test_f", "other"),
        _test("t::test_g", "passed", tags=["hygiene"]),
    ]
    return {
        "reportFormat": "CTRF",
        "specVersion": "1.0.0",
        "results": {
            "tool": {"name": "pytest"},
            "summary": {"tests": 7, "passed": 3, "failed": 1, "skipped": 1, "pending": 1,
                        "other": 1, "start": 1, "stop": 2},
            "tests": tests,
        },
    }


def test_valid_reference_object():
    r = parse_ctrf(valid_obj(), terminal_success=False, strict=True)
    assert (r.P, r.N, r.failed, r.skipped, r.pending, r.other) == (2, 6, 1, 1, 1, 1)
    assert r.hygiene_excluded == ("t::test_g",) and r.problems == ()


def _set(path, value):
    def f(root):
        *head, last = path
        o = root
        for k in head:
            o = o[k]
        o[last] = value
        return root
    return f


def _del(path):
    def f(root):
        *head, last = path
        o = root
        for k in head:
            o = o[k]
        del o[last]
        return root
    return f


def _summary_and(path, value, **summary):
    def f(o):
        _set(path, value)(o)
        o["results"]["summary"].update(summary)
        return o
    return f


# (id, mutation of valid_obj() or raw file bytes, expected substring of the reason)
MALFORMED = [
    ("top_level_list", lambda o: [o], "top level is a JSON list"),
    ("top_level_string", lambda o: "CTRF", "top level is a JSON str"),
    ("no_results", _del(["results"]), "missing 'results'"),
    ("results_list", _set(["results"], []), "'results' is a JSON list"),
    ("bad_report_format", _set(["reportFormat"], "JUnit"), "reportFormat = 'JUnit'"),
    ("spec_version_number", _set(["specVersion"], 1.0), "specVersion = 1.0"),
    ("spec_version_major_2", _set(["specVersion"], "2.0.0"), "specVersion 2.0.0 is not"),
    ("spec_without_format", _del(["reportFormat"]), "reportFormat = None"),
    ("no_tool", _del(["results", "tool"]), "results.tool is missing"),
    ("tool_without_name", _set(["results", "tool"], {"version": "1"}), "results.tool.name"),
    ("no_tests", _del(["results", "tests"]), "results.tests is missing"),
    ("tests_object", _set(["results", "tests"], {"a": 1}), "results.tests is a JSON dict"),
    ("zero_tests", _summary_and(["results", "tests"], [], tests=0, passed=0, failed=0,
                                skipped=0, pending=0, other=0), "zero tests"),
    ("test_not_object", _set(["results", "tests", 0], "t::test_a passed"),
     "results.tests[0] is a JSON str"),
    ("test_without_name", _del(["results", "tests", 1, "name"]), "results.tests[1].name"),
    ("test_empty_name", _set(["results", "tests", 1, "name"], "  "), "results.tests[1].name"),
    ("test_without_status", _del(["results", "tests", 2, "status"]),
     "results.tests[2].status = None"),
    ("unknown_status", _set(["results", "tests", 0, "status"], "error"),
     "status = 'error'"),
    ("status_capitalized", _set(["results", "tests", 0, "status"], "Passed"),
     "status = 'Passed'"),
    ("float_duration_in_current_spec", _set(["results", "tests", 0, "duration"], 0.97),
     "integer number of milliseconds"),
    ("negative_duration", _set(["results", "tests", 0, "duration"], -5), "duration = -5"),
    ("missing_duration", _del(["results", "tests", 0, "duration"]), "duration = None"),
    ("tags_not_list", _set(["results", "tests", 0, "tags"], "hygiene"), "tags = 'hygiene'"),
    ("negative_retries", _set(["results", "tests", 0, "retries"], -1), "retries = -1"),
    ("duplicate_names", _set(["results", "tests", 1, "name"], "t::test_a"),
     "duplicate test names"),
    ("no_summary", _del(["results", "summary"]), "results.summary is missing"),
    ("summary_count_missing", _del(["results", "summary", "other"]), "summary.other = None"),
    ("summary_count_bool", _set(["results", "summary", "passed"], True), "summary.passed"),
    ("summary_count_negative", _set(["results", "summary", "failed"], -1), "summary.failed"),
    ("summary_tests_mismatch", _set(["results", "summary", "tests"], 8),
     "summary.tests = 8 but results.tests has 7"),
    ("summary_passed_mismatch", _summary_and(["results", "summary", "passed"], 4, failed=0),
     "summary.passed = 4 but 3 tests"),
    ("status_changed_without_summary", _set(["results", "tests", 1, "status"], "passed"),
     "inconsistent counts"),
    ("only_hygiene_checks", _summary_and(
        ["results", "tests"], [_test("t::test_no_stray_processes", "passed")],
        tests=1, passed=1, failed=0, skipped=0, pending=0, other=0), "no non-hygiene checks"),
]

RAW = [
    ("empty_file", b"", "is empty"),
    ("truncated_json", b'{"results": {"tests": [', "invalid JSON"),
    ("not_json", b"PASSED 3 FAILED 1\n", "invalid JSON"),
    ("nan_constant", b'{"results": {"tests": [], "x": NaN}}', "non-standard JSON constant"),
    ("duplicate_keys", b'{"results": {}, "results": {}}', "duplicate key 'results'"),
    ("bad_utf8", b'{"results": "\xff\xfe"}', "not valid UTF-8"),
]


@pytest.mark.parametrize("name,mutate,reason", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_object_is_invalid_with_reason(name, mutate, reason, tmp_path):
    obj = mutate(copy.deepcopy(valid_obj()))
    path = tmp_path / "report.json"
    path.write_text(json.dumps(obj))
    for source in (obj, path) if isinstance(obj, dict | list) else (path,):
        r = parse_ctrf(source, terminal_success=True)
        assert not r.valid, name
        assert reason in r.reason, (name, r.reason)
        assert (r.P, r.N) == (0, 0) and r.strict_success
    with pytest.raises(ReportError, match="report.json"):
        parse_ctrf(path, terminal_success=True, strict=True)


@pytest.mark.parametrize("name,data,reason", RAW, ids=[m[0] for m in RAW])
def test_malformed_file_is_invalid_with_reason(name, data, reason, tmp_path):
    path = tmp_path / "report.json"
    path.write_bytes(data)
    r = parse_ctrf(path, terminal_success=False)
    assert not r.valid and reason in r.reason, r.reason
    with pytest.raises(ReportError):
        parse_ctrf(str(path), terminal_success=False, strict=True)


def test_missing_file_directory_and_size_limit(tmp_path):
    r = parse_ctrf(tmp_path / "nope.json", terminal_success=False)
    assert not r.valid and "not found" in r.reason and r.shape == "none"
    assert "is a directory" in parse_ctrf(tmp_path, terminal_success=False).reason
    path = tmp_path / "r.json"
    path.write_text(json.dumps(valid_obj()))
    assert "over the 10-byte limit" in parse_ctrf(path, terminal_success=False,
                                                  max_bytes=10).reason
    assert "pass a file path" in parse_ctrf(42, terminal_success=False).reason
    with pytest.raises(ReportError, match="not found"):
        parse_ctrf(tmp_path / "nope.json", terminal_success=False, strict=True)


def test_deeply_nested_json_is_invalid_not_a_crash(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    r = parse_ctrf(path, terminal_success=False)
    assert not r.valid and "invalid JSON" in r.reason


def test_several_problems_are_all_listed():
    obj = valid_obj()
    obj["results"]["tests"][0]["status"] = "error"
    obj["results"]["tests"][1]["duration"] = 1.5
    r = parse_ctrf(obj, terminal_success=False)
    assert len(r.problems) == 2 and "status = 'error'" in r.problems[0]


def test_counts_come_from_statuses_not_summary():
    """Summary and statuses agree here, but the values are derived per test: editing
    statuses and summary together changes P."""
    obj = valid_obj()
    obj["results"]["tests"][1]["status"] = "passed"
    obj["results"]["summary"].update(passed=4, failed=0)
    r = parse_ctrf(obj, terminal_success=False, strict=True)
    assert (r.P, r.N, r.failed) == (3, 6, 0)


# ---------------------------------------------------------------- terminal verdict S


def test_strict_success_is_the_terminal_verdict_never_the_counts():
    obj = valid_obj()
    for t in obj["results"]["tests"]:
        t["status"] = "passed"
    obj["results"]["summary"].update(passed=7, failed=0, skipped=0, pending=0, other=0)
    all_passed = parse_ctrf(obj, terminal_success=False, strict=True)
    assert all_passed.P == all_passed.N and not all_passed.strict_success
    some_failed = parse_ctrf(valid_obj(), terminal_success=True, strict=True)
    assert some_failed.strict_success and some_failed.P < some_failed.N
    assert any("verdict is success but 1 non-hygiene" in w for w in some_failed.warnings)
    unknown = parse_ctrf(obj, terminal_success=None)
    assert not unknown.strict_success and not unknown.verdict_known
    assert any("no terminal verdict" in w for w in unknown.warnings)
    assert parse_ctrf(obj, terminal_success=np.bool_(True)).strict_success
    with pytest.raises(TypeError, match="success_from_reward"):
        parse_ctrf(obj, terminal_success=1)


def test_success_helpers(tmp_path):
    assert success_from_reward(1.0) and success_from_reward(2) and not success_from_reward(0.99)
    assert success_from_reward(float("nan")) is None and success_from_reward(None) is None
    assert success_from_exit_code(0) and not success_from_exit_code(1)
    assert success_from_exit_code(None) is None
    (tmp_path / "reward.txt").write_text("1\n")
    (tmp_path / "reward.json").write_text('{"reward": 0.5}')
    (tmp_path / "bad.txt").write_text("yes")
    assert success_from_reward_file(tmp_path / "reward.txt") is True
    assert success_from_reward_file(tmp_path / "reward.json") is False
    assert success_from_reward_file(tmp_path / "bad.txt") is None
    assert success_from_reward_file(tmp_path / "missing.txt") is None


@pytest.mark.parametrize("text, value", [
    ("1", 1.0), ("0.25\n", 0.25), ('{"reward": 1}', 1.0), ('{"accuracy": 0.5}', 0.5),
    ('{"reward": 0, "accuracy": 1}', 0.0), ('{"a": 1, "b": 1}', None), ('{"reward": "1"}', None),
    ("true", None), ("yes", None), ("[1]", None), ("", None)])
def test_reward_value_as_harbor_writes_it(text, value):
    """reward.txt is a number; reward.json an object of named rewards: its "reward" entry, or
    its only entry (Harbor's verifier reads both shapes)."""
    assert parse_reward_value(text) == value
    assert parse_reward_value(text.encode()) == value


# ---------------------------------------------------------------- hygiene


@pytest.mark.parametrize("name", [
    "tests/test_outputs.py::test_tests_dir_untouched",
    "test_tests_directory_unchanged",
    "test_test_files_are_unmodified",
    "test_verifier_files_intact",
    "test_no_stray_processes",
    "test_no_leftover_process",
    "test_no_zombie_processes[after]",
    "test_no_temp_files",
    "test_no_open_ports",
    "test_protected_paths_unchanged",
    "Tests directory untouched",
    "test_hygiene_checks",
])
def test_default_hygiene_names(name):
    assert DEFAULT_HYGIENE.is_hygiene(name)
    assert not HygieneRule.none().is_hygiene(name)


@pytest.mark.parametrize("name", [
    "test_output_matches", "test_processes_are_sorted", "test_files_written",
    "test_tests_pass", "hygiene_dir/test_x.py::test_output",  # only the leaf name counts
    "test_no_stray_characters",
])
def test_default_hygiene_does_not_match_semantic_checks(name):
    assert not DEFAULT_HYGIENE.is_hygiene(name)


def test_hygiene_tags_and_custom_rule():
    assert DEFAULT_HYGIENE.is_hygiene("test_x", ["smoke", "Hygiene"])
    assert DEFAULT_HYGIENE.is_hygiene("test_x", ["hygiene::tests_dir"])
    assert not DEFAULT_HYGIENE.is_hygiene("test_x", ["smoke"])
    rule = HygieneRule(tags=frozenset({"infra"}), name_patterns=(r"^test_lint",))
    assert rule.is_hygiene("test_lint_ok") and rule.is_hygiene("a", ["INFRA"])
    assert not rule.is_hygiene("test_no_stray_processes")
    assert HygieneRule.from_dict(rule.to_dict()) == rule
    with pytest.raises(ValueError, match="bad regex"):
        HygieneRule(name_patterns=("(",))
    r = parse_ctrf(valid_obj(), terminal_success=False, hygiene=rule)
    assert r.N == 7  # the "hygiene" tag no longer excludes test_g


# ---------------------------------------------------------------- from_counts, serialization


def test_from_counts_valid_and_invalid():
    r = VerificationReport.from_counts(3, 5, terminal_success=False, skipped=1)
    assert (r.P, r.N, r.failed, r.skipped, r.shape) == (3, 5, 1, 1, "counts")
    cases = [
        (dict(passed=6, total=5), "exceeds total"),
        (dict(passed=0, total=0), "zero checks"),
        (dict(passed=-1, total=5), "negative"),
        (dict(passed=1.5, total=5), "not an integer"),
        (dict(passed=float("inf"), total=5), "not finite"),
        (dict(passed=float("nan"), total=5), "not finite"),
        (dict(passed=True, total=5), "bool"),
        (dict(passed="3", total=5), "expected an integer"),
        (dict(passed=10**400, total=10**400), "too large"),
        (dict(passed=2, total=5, failed=1), "inconsistent counts"),
        (dict(passed=2, total=5, skipped=4), "exceeds total"),
    ]
    for kwargs, reason in cases:
        bad = VerificationReport.from_counts(**kwargs, terminal_success=True)
        assert not bad.valid and reason in bad.reason, (kwargs, bad.reason)
        assert bad.strict_success
        with pytest.raises(ReportError, match=reason):
            VerificationReport.from_counts(**kwargs, terminal_success=True, strict=True)


def test_report_invariants_are_enforced():
    with pytest.raises(ReportError):
        VerificationReport(valid=True, strict_success=False, passed=3, total=2, failed=0)
    with pytest.raises(ReportError):
        VerificationReport(valid=False, strict_success=False)  # no reason
    with pytest.raises(ReportError):
        VerificationReport(valid=False, strict_success=False, passed=1, problems=("x",))
    r = VerificationReport.from_counts(1, 1, terminal_success=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.passed = 2


def test_from_dict_rejects_garbage():
    with pytest.raises(ReportError):
        VerificationReport.from_dict({"valid": True, "strict_success": True, "bogus": 1})
    with pytest.raises(ReportError):
        VerificationReport.from_dict({"format": "other/2"})
    with pytest.raises(ReportError):
        VerificationReport.from_dict([1, 2])


_counts = st.integers(0, 10**6)


@st.composite
def reports(draw):
    kind = draw(st.sampled_from(["counts", "invalid", "parsed"]))
    s = draw(st.sampled_from([True, False, None]))
    if kind == "invalid":
        return VerificationReport.invalid(draw(st.text(min_size=1, max_size=30)),
                                          terminal_success=s)
    if kind == "counts":
        n = draw(st.integers(1, 10**9))
        p = draw(st.integers(0, n))
        skipped = draw(st.integers(0, n - p))
        return VerificationReport.from_counts(p, n, terminal_success=s, skipped=skipped)
    statuses = draw(st.lists(st.sampled_from(["passed", "failed", "skipped", "pending",
                                              "other"]), min_size=1, max_size=20))
    names = [f"t::test_{i}" if draw(st.booleans()) else f"t::test_no_stray_files_{i}"
             for i in range(len(statuses))]
    obj = {"results": {"tool": {"name": "x"},
                       "summary": {"tests": len(statuses),
                                   **{k: statuses.count(k) for k in
                                      ("passed", "failed", "skipped", "pending", "other")}},
                       "tests": [{"name": n, "status": st_, "duration": 0.5}
                                 for n, st_ in zip(names, statuses, strict=True)]}}
    return parse_ctrf(obj, terminal_success=s)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(reports())
def test_report_json_roundtrip(report):
    d = json.loads(json.dumps(report.to_dict()))
    back = VerificationReport.from_dict(d)
    assert back == report
    if report.valid:
        assert report.P + report.failed + report.skipped + report.pending + report.other \
            == report.N >= 1
    else:
        assert report.P == report.N == 0 and report.reason


def test_import_is_light():
    """Parsing reports must not pull in jax or matplotlib (verifier-side tools use it)."""
    import subprocess
    import sys

    code = ("import sys, terminal_rsi.rewards as r; "
            "r.parse_ctrf({'results': {}}, terminal_success=None); "
            "print(sorted(m for m in ('jax', 'chex', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert out.stdout.strip() == "[]"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**20) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["results", "tests", "summary", "tool", "name", "status",
                                       "duration", "tags", "retries", "reportFormat",
                                       "specVersion", "passed", "x"]), children, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_json, st.sampled_from([True, False, None]))
def test_parser_never_raises_on_arbitrary_json(obj, s):
    """Non-strict parsing of any JSON value returns a report; strict raises only ReportError."""
    r = parse_ctrf(obj, terminal_success=s)
    assert r.valid == (not r.problems) and r.strict_success == bool(s)
    try:
        parse_ctrf(obj, terminal_success=s, strict=True)
    except ReportError:
        assert not r.valid
