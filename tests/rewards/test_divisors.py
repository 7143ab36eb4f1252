"""FamilyDivisors, calibration (against NumPy) and Appendix-B recalibration rules."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terminal_rsi.rewards import (
    DivisorError,
    EpisodeOutcome,
    FamilyDivisors,
    RecalibrationRules,
    VerificationReport,
    calibrate_family_divisors,
    quantile_linear,
    recalibrate,
    rule_counts,
)


def test_fallback_and_lookup():
    t = FamilyDivisors({"a": 10, "b": 2.5})
    assert t["a"] == 10.0 and t.get("b") == 2.5
    assert t["unseen"] == 82.0 and "unseen" not in t and "a" in t
    assert len(t) == 2 and t.families == ("a", "b")
    np.testing.assert_array_equal(t.lookup(["a", "zz", "b"]), [10.0, 82.0, 2.5])
    assert FamilyDivisors({}, fallback=5.0)["x"] == 5.0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "3", True, None])
def test_divisors_must_be_positive_finite_numbers(bad):
    with pytest.raises(DivisorError, match="divisor"):
        FamilyDivisors({"a": bad})
    with pytest.raises(DivisorError):
        FamilyDivisors({}, fallback=bad)


def test_family_names_must_be_strings():
    with pytest.raises(DivisorError, match="family names"):
        FamilyDivisors({"": 1.0})


def test_table_is_frozen():
    source = {"a": 3.0}
    t = FamilyDivisors(source)
    source["a"] = 99.0  # the table copied its input
    assert t["a"] == 3.0
    with pytest.raises(TypeError):
        t.divisors["a"] = 4.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.fallback = 1.0
    with pytest.raises(TypeError):
        t.provenance.sample_counts["a"] = 1
    assert not any(hasattr(t, m) for m in ("set", "update", "__setitem__", "pop"))


def test_save_load_roundtrip_with_provenance(tmp_path):
    t = calibrate_family_divisors({"a": [1, 2, 3, 4], "b": [10]}, 0.9, source="unit test",
                                  date="2026-01-01T00:00:00Z", notes="n")
    path = tmp_path / "sub" / "divisors.json"
    t.save(path)
    assert os.listdir(path.parent) == ["divisors.json"]  # no temp file left behind
    back = FamilyDivisors.load(path)
    assert back == t
    d = json.loads(path.read_text())
    assert d["provenance"]["sample_counts"] == {"a": 4, "b": 1}
    assert d["provenance"]["quantile"] == 0.9 and d["provenance"]["source"] == "unit test"
    assert d["fallback"] == 82.0


def test_load_errors(tmp_path):
    with pytest.raises(DivisorError, match="not found"):
        FamilyDivisors.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(DivisorError, match="cannot read"):
        FamilyDivisors.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"divisors": {"a": 1}}')
    with pytest.raises(DivisorError, match="format"):
        FamilyDivisors.load(tmp_path / "y.json")
    (tmp_path / "z.json").write_text(json.dumps(
        {"format": "terminal_rsi.FamilyDivisors/1", "divisors": {"a": -2}}))
    with pytest.raises(DivisorError, match="> 0"):
        FamilyDivisors.load(tmp_path / "z.json")


def test_quantile_hand_computed():
    # n = 5, q = 0.9: h = 3.6 -> x3 + 0.6 (x4 - x3) = 4 + 0.6 * 6 = 7.6
    assert quantile_linear([10, 1, 2, 3, 4], 0.9) == pytest.approx(7.6)
    assert quantile_linear([7], 0.9) == 7.0
    assert quantile_linear([1, 3], 0.5) == 2.0
    assert quantile_linear([1, 2, 3], 0.0) == 1.0 and quantile_linear([1, 2, 3], 1.0) == 3.0
    t = calibrate_family_divisors({"f": [10, 1, 2, 3, 4]})
    assert t["f"] == pytest.approx(7.6)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(min_size=1, max_size=5),
                       st.lists(st.integers(1, 10_000), min_size=1, max_size=40),
                       min_size=1, max_size=5),
       st.floats(0.0, 1.0))
def test_calibration_matches_numpy(counts, q):
    t = calibrate_family_divisors(counts, q)
    for family, xs in counts.items():
        ref = float(np.quantile(np.asarray(xs, dtype=np.float64), q, method="linear"))
        assert t[family] == pytest.approx(ref, rel=1e-12, abs=1e-12)
        assert t.provenance.sample_counts[family] == len(xs)


@pytest.mark.parametrize("counts,match", [
    ({"a": []}, "no check counts"),
    ({"a": [0, 3]}, "integer >= 1"),
    ({"a": [2.5]}, "integer >= 1"),
    ({"a": [float("nan")]}, "integer >= 1"),
    ({"a": [True]}, "integer >= 1"),
])
def test_calibration_rejects_bad_counts(counts, match):
    with pytest.raises(DivisorError, match=match):
        calibrate_family_divisors(counts)


def test_calibration_rejects_bad_q():
    with pytest.raises(DivisorError, match="q ="):
        calibrate_family_divisors({"a": [1]}, q=1.5)


# ---------------------------------------------------------------- recalibration


def ep(family, p, n, success, turns=5):
    return EpisodeOutcome(family=family, turns=turns,
                          report=VerificationReport.from_counts(p, n, terminal_success=success))


def test_recalibration_rules_in_priority_order():
    old = FamilyDivisors({"hi_fail": 10.0, "long_low": 100.0, "both": 40.0, "plain": 8.0,
                          "idle": 3.0}, provenance=dataclasses.replace(
                              FamilyDivisors().provenance, source="old"))
    eps = [
        # a failure with FDR = 12/10 >= 1 -> doubled
        ep("hi_fail", 12, 12, False), ep("hi_fail", 2, 12, True),
        # long (mean turns 60) and low (mean FDR 0.1) -> quartered
        ep("long_low", 10, 50, False, turns=60), ep("long_low", 10, 50, False, turns=60),
        # long, low on average, AND a high-reward failure: failure suppression wins
        ep("both", 40, 40, False, turns=80), *[ep("both", 0, 40, False, turns=80)] * 9,
        # nothing fires
        ep("plain", 4, 8, True), ep("plain", 3, 8, False),
        # absent from the old table -> q0.9 of its check counts
        ep("new", 1, 10, False), ep("new", 1, 20, True), ep("new", 0, 30, False),
    ]
    rules = RecalibrationRules(long_mean_turns=50, low_mean_reward=0.35)
    new = recalibrate(old, eps, rules, date="2026-01-01T00:00:00Z")
    dec = new.provenance.decisions
    assert dec["hi_fail"].rule == "failure_suppression" and new["hi_fail"] == 20.0
    assert dec["hi_fail"].high_reward_failures == 1 and "1 of 1 failures" in dec["hi_fail"].reason
    assert dec["long_low"].rule == "long_low_reward" and new["long_low"] == 25.0
    assert dec["long_low"].mean_turns == 60.0 and dec["long_low"].mean_reward == 0.1
    assert dec["both"].rule == "failure_suppression" and new["both"] == 80.0
    assert dec["both"].mean_reward == pytest.approx(0.1)  # would also qualify for rule 2
    assert dec["plain"].rule == "keep" and new["plain"] == 8.0
    assert dec["idle"].rule == "keep" and new["idle"] == 3.0 and "no episodes" in \
        dec["idle"].reason
    assert dec["new"].rule == "new_family"
    assert new["new"] == pytest.approx(np.quantile([10, 20, 30], 0.9))
    assert rule_counts(new) == {"failure_suppression": 2, "long_low_reward": 1,
                                "new_family": 1, "keep": 2}
    assert new.provenance.source == "recalibrate(old)"
    assert new.provenance.sample_counts["hi_fail"] == 2
    assert new.fallback == old.fallback
    # the old table is untouched and the new one round-trips through JSON with decisions
    assert old["hi_fail"] == 10.0
    assert FamilyDivisors.from_dict(json.loads(json.dumps(new.to_dict()))) == new


def test_recalibration_thresholds_are_config():
    old = FamilyDivisors({"f": 10.0})
    eps = [ep("f", 12, 12, False)]
    assert recalibrate(old, eps, RecalibrationRules(high_reward_failure_threshold=1.5)) \
        .provenance.decisions["f"].rule == "keep"
    assert recalibrate(old, eps, RecalibrationRules(min_high_reward_failures=2)) \
        .provenance.decisions["f"].rule == "keep"
    assert recalibrate(old, eps, RecalibrationRules(failure_factor=3.0))["f"] == 30.0
    assert recalibrate(old, eps, RecalibrationRules(min_family_episodes=2)) \
        .provenance.decisions["f"].rule == "keep"


def test_new_family_with_high_reward_failures_scales_the_fallback():
    new = recalibrate(FamilyDivisors({}), [ep("g", 90, 90, False)], RecalibrationRules())
    assert new.provenance.decisions["g"].rule == "failure_suppression" and new["g"] == 164.0


def test_new_family_without_valid_reports_stays_on_fallback():
    bad = EpisodeOutcome("g", VerificationReport.invalid("x", terminal_success=False), 3)
    new = recalibrate(FamilyDivisors({}), [bad], RecalibrationRules())
    assert "g" not in new and new["g"] == 82.0
    assert new.provenance.decisions["g"].rule == "keep"


@pytest.mark.parametrize("kwargs", [dict(reward="dense"), dict(failure_factor=0),
                                    dict(long_factor=-1), dict(min_family_episodes=0),
                                    dict(new_family_quantile=2.0)])
def test_rules_are_validated(kwargs):
    with pytest.raises(DivisorError):
        RecalibrationRules(**kwargs)
