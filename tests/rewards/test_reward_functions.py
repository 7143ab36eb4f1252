"""FDR (Eq. 6) and SPR (Eq. 7): hand values, float extremes, properties, jit variants."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

from terminal_rsi.rewards import (
    REWARD_NAMES,
    REWARDS,
    FamilyDivisors,
    RecalibrationRules,
    RewardInputError,
    VerificationReport,
    binary,
    fdr,
    fdr_array,
    fdr_value,
    get_reward_array_fn,
    get_reward_fn,
    report_arrays,
    spr,
    spr_array,
    spr_progress,
    spr_value,
)
from terminal_rsi.rewards.functions import binary_array
from terminal_rsi.settings import SettingError

TABLE = FamilyDivisors({"git": 10.0, "build": 4.0})


def rep(p, n, s):
    return VerificationReport.from_counts(p, n, terminal_success=s)


def test_hand_values():
    assert fdr(rep(7, 9, False), "git", TABLE) == 0.7
    assert fdr(rep(25, 30, False), "git", TABLE) == 2.5  # no upper clip
    assert fdr(rep(0, 3, True), "git", TABLE) == 0.0  # no completion bonus
    assert fdr(rep(41, 50, False), "unseen", TABLE) == 0.5  # fallback 82
    assert spr(rep(6, 9, False), "build", TABLE) == 0.6  # 6 / (6 + 4)
    assert spr(rep(6, 6, True), "build", TABLE) == 1.6
    assert spr(rep(0, 3, False), "git", TABLE) == 0.0
    assert spr(rep(0, 3, True), "git", TABLE) == 1.0
    assert binary(rep(3, 3, False)) == 0.0 and binary(rep(0, 3, True)) == 1.0


def test_invalid_report_falls_back_to_strict_success():
    for s in (True, False):
        bad = VerificationReport.invalid("no report", terminal_success=s)
        assert fdr(bad, "git", TABLE) == spr(bad, "git", TABLE) == float(s)


def test_registry():
    assert get_reward_fn("fdr") is fdr and get_reward_fn("spr") is spr
    assert get_reward_fn("binary") is binary
    assert get_reward_array_fn("spr") is spr_array
    with pytest.raises(SettingError, match="binary, fdr, spr"):
        get_reward_fn("dense")
    with pytest.raises(SettingError):
        get_reward_array_fn("dense")


def test_every_reward_choice_comes_from_the_table():
    """`REWARDS` is the one list of reward names: the settings that pick a reward offer
    exactly its names, and each entry pairs the scalar and vectorized forms."""
    from terminal_rsi.evaluation.config import EvalRuns
    from terminal_rsi.experiments.rescore import Rules
    from terminal_rsi.experiments.rollouts import RolloutsHarness
    from terminal_rsi.rpr.config import Rewards
    from terminal_rsi.settings import specs

    assert REWARD_NAMES == tuple(REWARDS) == ("fdr", "spr", "binary")
    assert [(r.scalar, r.array) for r in REWARDS.values()] == [
        (fdr, fdr_array), (spr, spr_array), (binary, binary_array)]
    for section, field in ((Rewards, "fn"), (EvalRuns, "reward_fn"), (Rules, "reward"),
                           (RolloutsHarness, "reward_fn")):
        assert tuple(specs(section)[field].choices) == REWARD_NAMES, section
    for name in REWARD_NAMES:
        assert RecalibrationRules(reward=name).reward == name
    with pytest.raises(ValueError, match="'fdr', 'spr', 'binary'"):
        RecalibrationRules(reward="dense")


@pytest.mark.parametrize("p", [1e300, 1e308, 1.7976931348623157e308, 10**300])
def test_spr_enormous_p_keeps_failures_below_one(p):
    fail, win = rep(p, p, False), rep(p, p, True)
    assert fail.valid and win.valid
    for d in (1e-9, 1.0, 82.0, 795.0):
        table = FamilyDivisors({"f": d})
        rf, rs = spr(fail, "f", table), spr(win, "f", table)
        assert 0.0 <= rf < 1.0 <= rs < 2.0
        assert rf == math.nextafter(1.0, 0.0) and rs == math.nextafter(2.0, 0.0)
    assert fdr(fail, "f", FamilyDivisors({"f": 82.0})) == pytest.approx(float(p) / 82.0)


def test_infinite_or_nan_p_is_invalid_input():
    for bad in (float("inf"), float("nan")):
        r = rep(bad, 5, True)
        assert not r.valid and "not finite" in r.reason
        assert spr(r, "git", TABLE) == fdr(r, "git", TABLE) == 1.0  # falls back to S
        with pytest.raises(RewardInputError, match="finite"):
            spr_value(bad, 10.0, True, 0)
        with pytest.raises(RewardInputError):
            fdr_value(bad, 10.0, True, 0)
    with pytest.raises(RewardInputError, match="divisor"):
        spr_value(1.0, 0.0, True, 0)
    with pytest.raises(RewardInputError, match=">= 0"):
        fdr_value(-1.0, 3.0, True, 0)


# ---------------------------------------------------------------- properties (hypothesis)

counts = st.integers(0, 10**12)
divisors = st.floats(1e-3, 1e6)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(counts, counts, divisors, divisors)
def test_spr_ordering_and_bounds(p_fail, p_win, d_fail, d_win):
    """Any success outranks any failure, across counts and families; 0 <= R < 2."""
    rf = spr_value(p_fail, d_fail, True, 0)
    rs = spr_value(p_win, d_win, True, 1)
    assert 0.0 <= rf < 1.0 <= rs < 2.0
    # matched counts and family: success gets exactly one extra unit (up to the clamp)
    assert spr_value(p_fail, d_fail, True, 1) - rf == pytest.approx(1.0, abs=1e-15)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.floats(0, 1e12), st.floats(0, 1e12), divisors)
def test_spr_progress_monotone(p1, p2, d):
    lo, hi = min(p1, p2), max(p1, p2)
    assert spr_progress(lo, d) <= spr_progress(hi, d)
    assert 0.0 <= spr_progress(lo, d) <= 1.0
    assert spr_progress(lo, d) == pytest.approx(lo / (lo + d), rel=1e-14, abs=1e-300)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.floats(0, 1e6), st.floats(1e-3, 1e3), st.floats(1.0, 1e3))
def test_spr_progress_concave(p, h, d):
    """g(p) - g(p - h) >= g(p + h) - g(p): decreasing increments (g'' < 0)."""
    assume_p = max(p, h)
    left = spr_progress(assume_p, d) - spr_progress(assume_p - h, d)
    right = spr_progress(assume_p + h, d) - spr_progress(assume_p, d)
    assert left >= right - 1e-15


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(0, 10**9), st.integers(0, 10**9), divisors)
def test_fdr_linearity(a, b, d):
    """Constant marginal credit 1/D: FDR(a + b) = FDR(a) + FDR(b)."""
    assert fdr_value(a + b, d, True, 0) == pytest.approx(
        fdr_value(a, d, True, 0) + fdr_value(b, d, True, 0), rel=1e-12)
    assert fdr_value(a, d, True, 1) == fdr_value(a, d, True, 0)  # S has no effect if valid


# ---------------------------------------------------------------- vectorized, jit variants


def reference(name, p, d, valid, s):
    """NumPy loop over the scalar definitions (independent of the jnp code)."""
    out = np.empty(len(p), dtype=np.float64)
    for i in range(len(p)):
        ok = bool(valid[i]) and math.isfinite(float(p[i])) and p[i] >= 0
        if not ok:
            out[i] = s[i]
        elif name == "fdr":
            out[i] = float(p[i]) / float(d[i])
        else:
            g = float(p[i]) / (float(p[i]) + float(d[i]))
            out[i] = s[i] + g
    return out


class ArrayRewardTest(chex.TestCase, parameterized.TestCase):
    def _batch(self, seed=0, size=64):
        rng = np.random.default_rng(seed)
        p = rng.integers(0, 500, size).astype(np.float32)
        d = rng.uniform(1, 300, size).astype(np.float32)
        valid = rng.random(size) < 0.85
        s = (rng.random(size) < 0.4).astype(np.float32)
        p[:3] = [np.inf, np.nan, -1.0]  # invalid inputs: fall back to S
        return p, d, valid, s

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("fdr", "spr")
    def test_matches_numpy_reference(self, name):
        fn = self.variant(get_reward_array_fn(name))
        p, d, valid, s = self._batch()
        out = fn(jnp.asarray(p), jnp.asarray(d), jnp.asarray(valid), jnp.asarray(s))
        chex.assert_shape(out, p.shape)
        chex.assert_type(out, jnp.float32)
        np.testing.assert_allclose(np.asarray(out), reference(name, p, d, valid, s),
                                   rtol=2e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(out)[:3], s[:3])

    @chex.variants(with_jit=True, without_jit=True)
    def test_spr_float32_extremes_keep_ordering(self):
        fn = self.variant(spr_array)
        p = jnp.asarray([3e38, 1e30, 1e8, 0.0, 3e38, 1e30, 1e8, 0.0], dtype=jnp.float32)
        d = jnp.full((8,), 82.0, dtype=jnp.float32)
        valid = jnp.ones((8,), dtype=bool)
        s = jnp.asarray([0, 0, 0, 0, 1, 1, 1, 1], dtype=jnp.float32)
        out = np.asarray(fn(p, d, valid, s))
        assert (out[:4] < 1.0).all() and (out[4:] >= 1.0).all() and (out < 2.0).all()
        assert out[0] == np.nextafter(np.float32(1), np.float32(0))

    @chex.variants(with_jit=True, without_jit=True)
    def test_binary_array(self):
        p, d, valid, s = self._batch(seed=1, size=8)
        out = self.variant(get_reward_array_fn("binary"))(p, d, valid, s)
        np.testing.assert_array_equal(np.asarray(out), s)

    def test_shape_and_dtype_checked(self):
        p, d, valid, s = self._batch(size=4)
        with self.assertRaises(AssertionError):
            spr_array(p[:3], d, valid, s)
        with self.assertRaises(AssertionError):
            spr_array(p, d, valid.astype(np.float32), s)


def test_spr_array_float64_enormous_p():
    with jax.enable_x64(True):
        p = jnp.asarray([1e300, 1e308, 1e300, 1e308], dtype=jnp.float64)
        d = jnp.full((4,), 82.0, dtype=jnp.float64)
        out = np.asarray(jax.jit(spr_array)(p, d, jnp.ones(4, bool),
                                            jnp.asarray([0.0, 0.0, 1.0, 1.0])))
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [np.nextafter(1.0, 0.0)] * 2 +
                                  [np.nextafter(2.0, 0.0)] * 2)


def test_report_arrays_agree_with_scalar_rewards():
    reports = [rep(3, 9, False), rep(9, 9, True), VerificationReport.invalid(
        "x", terminal_success=True), rep(0, 4, False)]
    families = ["git", "build", "git", "other"]
    arrays = report_arrays(reports, families, TABLE, dtype=np.float64)
    with jax.enable_x64(True):
        for name, fn in (("fdr", fdr), ("spr", spr)):
            vec = np.asarray(get_reward_array_fn(name)(*map(jnp.asarray, arrays)))
            scalar = [fn(r, f, TABLE) for r, f in zip(reports, families, strict=True)]
            np.testing.assert_allclose(vec, scalar, rtol=1e-15)
    with pytest.raises(RewardInputError):
        report_arrays(reports, families[:2], TABLE)
