"""Losses (Eq. 14, Eq. 3) against NumPy loops, with and without jit."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from terminal_rsi.settings import SettingError, specs
from terminal_rsi.training.losses import (
    Aggregation,
    LossConfigError,
    PPOConfig,
    PPOLoss,
    aggregate,
    clipped_value_loss,
    combine_stats,
    explained_variance,
    finalize_policy_stats,
    finalize_value_stats,
    ppo_policy_loss,
    sft_loss,
)

AGGS = tuple(Aggregation)


def np_aggregate(x, m, agg, seg=None):
    """Loop reference: samples are rows, or (row, segment) pairs."""
    b, length = x.shape
    samples = {}
    for i in range(b):
        for j in range(length):
            key = (i, 0 if seg is None else int(seg[i, j]))
            samples.setdefault(key, []).append((float(x[i, j]), float(m[i, j])))
    nonempty = [v for v in samples.values() if sum(w for _, w in v) > 0]
    if agg is Aggregation.TOKEN_MEAN:
        return sum(a * w for v in nonempty for a, w in v) / sum(w for v in nonempty for _, w in v)
    per = [sum(a * w for a, w in v) / (sum(w for _, w in v)
                                        if agg is Aggregation.SAMPLE_MEAN else 1.0)
           for v in nonempty]
    return sum(per) / len(per)


def np_policy(lp, old, adv, m, lo, hi, agg):
    out = np.zeros_like(lp)
    for idx in np.ndindex(lp.shape):
        r = np.exp(lp[idx] - old[idx])
        out[idx] = -min(r * adv[idx], min(max(r, lo), hi) * adv[idx])
    return np_aggregate(out, m, agg)


def np_value(v, vold, g, m, eps, agg):
    out = np.zeros_like(v)
    for idx in np.ndindex(v.shape):
        vc = vold[idx] + min(max(v[idx] - vold[idx], -eps), eps)
        out[idx] = max((v[idx] - g[idx]) ** 2, (vc - g[idx]) ** 2)
    return np_aggregate(out, m, agg)


def _data(seed=0, b=4, length=7):
    rng = np.random.default_rng(seed)
    lp = rng.normal(-2, 1, (b, length)).astype(np.float32)
    old = (lp + rng.normal(0, 0.8, (b, length))).astype(np.float32)
    adv = rng.normal(0, 1, (b, length)).astype(np.float32)
    m = rng.random((b, length)) < 0.6
    m[0, :] = False
    m[0, 2] = True  # unequal lengths, including a one-token sample
    m[1, :] = True
    return lp, old, adv, m


class LossTest(parameterized.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*AGGS)
    def test_policy_loss_matches_numpy(self, agg):
        lp, old, adv, m = _data()
        cfg = PPOConfig(aggregation=agg)
        f = self.variant(lambda *a: ppo_policy_loss(*a, cfg).loss)
        got = f(lp, old, adv, m)
        np.testing.assert_allclose(got, np_policy(lp, old, adv, m, 0.7, 6.0, agg), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_exact_clip_thresholds(self):
        """ρ ∈ {0.69, 0.71, 5.99, 6.01} × A ∈ {+1, -1}: ε = (0.30, 5.00) -> [0.70, 6.00]."""
        ratios = np.array([0.69, 0.71, 5.99, 6.01], np.float64)
        lp = np.log(ratios).astype(np.float32)[None].repeat(2, 0)
        old = np.zeros_like(lp)
        adv = np.array([[1.0] * 4, [-1.0] * 4], np.float32)
        m = np.ones_like(lp, bool)
        cfg = PPOConfig(aggregation=Aggregation.TOKEN_MEAN)

        def per_token_grad(lp):
            return jax.grad(lambda x: ppo_policy_loss(x, old, adv, m, cfg).total)(lp)

        g = self.variant(per_token_grad)(lp)
        # ∂(-min(ρA, clip(ρ)A))/∂logπ = -ρA where the unclipped branch is active, else 0.
        #   A>0: clipped only above 6.00 -> ρ=6.01 has zero gradient.
        #   A<0: clipped only below 0.70 -> ρ=0.69 has zero gradient.
        want = np.array([[-0.69, -0.71, -5.99, 0.0], [0.0, 0.71, 5.99, 6.01]], np.float32)
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)
        stats = finalize_policy_stats(
            self.variant(lambda x: ppo_policy_loss(x, old, adv, m, cfg).stats)(lp))
        np.testing.assert_allclose(stats["clip_frac_low"], 1 / 8)
        np.testing.assert_allclose(stats["clip_frac_high"], 1 / 8)
        np.testing.assert_allclose(stats["ratio_min"], 0.69, rtol=1e-6)
        np.testing.assert_allclose(stats["ratio_max"], 6.01, rtol=1e-6)
        np.testing.assert_allclose(stats["ratio_mean"], ratios.mean(), rtol=1e-6)
        # Loss values: min(ρA, clip(ρ)A) per token.
        loss = self.variant(lambda x: ppo_policy_loss(x, old, adv, m, cfg).stats["pg_sum"])(lp)
        clipped = np.clip(ratios, 0.7, 6.0)
        want_loss = -(np.minimum(ratios, clipped).sum() + np.minimum(-ratios, -clipped).sum())
        np.testing.assert_allclose(loss, want_loss, atol=2e-5)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*AGGS)
    def test_value_loss_matches_numpy(self, agg):
        rng = np.random.default_rng(1)
        _, _, _, m = _data(1)
        v = rng.normal(0, 5, m.shape).astype(np.float32)
        vold = rng.normal(0, 5, m.shape).astype(np.float32)
        g = rng.normal(0, 5, m.shape).astype(np.float32)
        cfg = PPOConfig(aggregation=agg)
        got = self.variant(lambda *a: clipped_value_loss(*a, cfg).loss)(v, vold, g, m)
        np.testing.assert_allclose(got, np_value(v, vold, g, m, 4.0, agg), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_value_clip_boundary_and_stats(self):
        # v_old = 0, Ĝ = 10: V = 3.9 (inside ε_V), V = 4.1 and V = -4.1 (clipped).
        v = np.array([[3.9, 4.1, -4.1]], np.float32)
        vold = np.zeros_like(v)
        g = np.full_like(v, 10.0)
        m = np.ones_like(v, bool)
        cfg = PPOConfig(aggregation=Aggregation.TOKEN_MEAN)
        parts = self.variant(lambda *a: clipped_value_loss(*a, cfg))(v, vold, g, m)
        # 4.1: max((4.1-10)², (4-10)²) = 36; -4.1: max(14.1², 14²) = 198.81.
        np.testing.assert_allclose(parts.total, (6.1 ** 2) + 36.0 + 14.1 ** 2, rtol=1e-5)
        stats = finalize_value_stats(parts.stats)
        np.testing.assert_allclose(stats["value_clip_frac"], 2 / 3)
        np.testing.assert_allclose(stats["explained_variance"], 0.0)  # Var(Ĝ) = 0

    @chex.variants(with_jit=True, without_jit=True)
    def test_explained_variance_matches_numpy(self):
        rng = np.random.default_rng(2)
        g = rng.normal(1, 2, (3, 9)).astype(np.float32)
        v = (g + rng.normal(0, 1, g.shape)).astype(np.float32)
        m = rng.random(g.shape) < 0.7
        want = 1 - np.var((g - v)[m].astype(np.float64)) / np.var(g[m].astype(np.float64))
        ev = self.variant(explained_variance)
        np.testing.assert_allclose(ev(v, g, m), want, rtol=1e-4)
        # a perfect critic has EV 1; constant returns or an empty mask have none (NaN)
        np.testing.assert_allclose(ev(g, g, m), 1.0, atol=1e-6)
        assert np.isnan(ev(v, np.ones_like(g), m))
        assert np.isnan(ev(v, g, np.zeros_like(m)))
        cfg = PPOConfig()
        stats = finalize_value_stats(clipped_value_loss(v, v, g, m, cfg).stats)
        np.testing.assert_allclose(stats["explained_variance"], want, rtol=1e-4)

    def test_aggregations_differ_on_unequal_lengths(self):
        x = np.array([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
        m = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], bool)
        vals = {a: float(np.divide(*aggregate(x, m, a))) for a in AGGS}
        self.assertAlmostEqual(vals[Aggregation.TOKEN_MEAN], 9 / 5)
        self.assertAlmostEqual(vals[Aggregation.SAMPLE_MEAN], 3.0)
        self.assertAlmostEqual(vals[Aggregation.SEQUENCE_SUM], 4.5)

    @parameterized.parameters(*AGGS)
    def test_packed_segments_are_samples(self, agg):
        rng = np.random.default_rng(3)
        x = rng.normal(size=(2, 8)).astype(np.float32)
        seg = np.array([[1, 1, 1, 2, 2, 0, 0, 0], [1, 1, 1, 1, 1, 1, 2, 3]], np.int32)
        m = (seg > 0) & (rng.random(seg.shape) < 0.8)
        m[1, 7] = False  # segment 3 has no valid token: not a sample
        m[0, 0] = m[1, 6] = True
        s, d = jax.jit(lambda a, b, c: aggregate(a, b, agg, c))(x, m, seg)
        np.testing.assert_allclose(s / d, np_aggregate(x, m, agg, seg), rtol=1e-5)
        if agg is not Aggregation.TOKEN_MEAN:
            self.assertEqual(float(d), 4.0)

    @parameterized.parameters(*AGGS)
    def test_microbatch_sums_equal_full_batch(self, agg):
        """Σ_i total_i / Σ_i denom_i (and its gradient) equals the full-batch loss."""
        lp, old, adv, m = _data(4, b=6, length=5)
        cfg = PPOConfig(aggregation=agg)

        def parts(x, sl):
            return ppo_policy_loss(x[sl], old[sl], adv[sl], m[sl], cfg)

        full = parts(lp, slice(None))
        halves = [parts(lp, slice(0, 3)), parts(lp, slice(3, 6))]
        np.testing.assert_allclose(sum(h.total for h in halves), full.total, rtol=1e-6)
        np.testing.assert_allclose(sum(h.denom for h in halves), full.denom, rtol=0)
        g_full = jax.grad(lambda x: parts(x, slice(None)).loss)(lp)
        g_acc = jax.grad(lambda x: (parts(x, slice(0, 3)).total + parts(x, slice(3, 6)).total)
                         / (halves[0].denom + halves[1].denom))(lp)
        np.testing.assert_allclose(g_acc, g_full, rtol=1e-6, atol=1e-8)
        st = combine_stats(halves[0].stats, halves[1].stats)
        for k, v in finalize_policy_stats(full.stats).items():
            np.testing.assert_allclose(finalize_policy_stats(st)[k], v, rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sft_loss(self):
        lp, _, _, m = _data(5)
        got = self.variant(lambda a, b: sft_loss(a, b).loss)(lp, m)
        np.testing.assert_allclose(got, np_aggregate(-lp, m, Aggregation.SEQUENCE_SUM),
                                   rtol=1e-5)
        got = self.variant(lambda a, b: sft_loss(a, b, Aggregation.TOKEN_MEAN).loss)(lp, m)
        np.testing.assert_allclose(got, -lp[m].mean(), rtol=1e-5)

    def test_kl_and_entropy_terms(self):
        lp, old, adv, m = _data(6)
        ref = (lp + 0.3).astype(np.float32)
        ent = np.abs(lp)
        base = ppo_policy_loss(lp, old, adv, m, PPOConfig(aggregation=Aggregation.TOKEN_MEAN))
        cfg = PPOConfig(aggregation=Aggregation.TOKEN_MEAN, kl_coef=0.5, entropy_coef=0.1)
        got = ppo_policy_loss(lp, old, adv, m, cfg, ref_logprobs=ref, entropy=ent)
        k3 = np.exp(0.3) - 1 - 0.3
        np.testing.assert_allclose(got.loss, base.loss + 0.5 * k3 - 0.1 * ent[m].mean(),
                                   rtol=1e-5)
        with pytest.raises(LossConfigError, match="ref_logprobs"):
            ppo_policy_loss(lp, old, adv, m, PPOConfig(kl_coef=0.1))

    def test_config_validation_and_from_config(self):
        self.assertEqual(PPOConfig().clip_low, 0.3)
        self.assertEqual(PPOConfig().kl_coef, 0.0)
        self.assertEqual(PPOConfig().entropy_coef, 0.0)
        cfg = PPOConfig.from_config({"aggregation": "token_mean", "clip_high": 2.0})
        self.assertIs(cfg.aggregation, Aggregation.TOKEN_MEAN)  # the value converts
        self.assertIs(PPOConfig(aggregation="token_mean").aggregation, Aggregation.TOKEN_MEAN)
        with self.assertRaisesRegex(SettingError, "no setting 'x'"):  # never dropped
            PPOConfig.from_config({"clip_high": 2.0, "x": 1})
        with self.assertRaisesRegex(SettingError, "clip_low"):
            PPOConfig(clip_low=1.5)
        with self.assertRaisesRegex(SettingError, "aggregation"):
            PPOConfig(aggregation="mean")

    def test_the_loss_settings_are_declared_once(self):
        """The runtime PPOConfig is the PPO loss section (`PPOLoss`, which an RPR phase's
        `ppo` section extends) plus what the phase derives: no loss setting is redeclared,
        and each one of a phase's ppo section reaches the losses."""
        from terminal_rsi.rpr.config import PPO

        self.assertFalse(set(vars(PPOConfig)["__annotations__"]) & set(specs(PPOLoss)))
        self.assertFalse(set(vars(PPO)["__annotations__"]) & set(specs(PPOLoss)))
        section = PPO(clip_low=0.2, clip_high=3.0, value_clip=2.0, kl_coef=0.1,
                      entropy_coef=0.01, aggregation="token_mean", epochs=3)
        cfg = PPOConfig.from_config(section, temperature=0.6)
        self.assertEqual({k: cfg[k] for k in specs(PPOLoss)},
                         {k: section[k] for k in specs(PPOLoss)})
        self.assertEqual((cfg.temperature, cfg.is_cap), (0.6, None))

    def test_empty_mask_gives_zero_loss(self):
        z = jnp.zeros((2, 3))
        parts = ppo_policy_loss(z, z, z, jnp.zeros((2, 3), bool), PPOConfig())
        self.assertEqual(float(parts.loss), 0.0)
        self.assertEqual(float(parts.denom), 0.0)


def np_corrected_policy(lp, old, behav, adv, m, cap, band, agg):
    """Loop reference of the behaviour-corrected surrogate (decoupled PPO, TIS and masking)."""
    out = np.zeros_like(lp)
    for idx in np.ndindex(lp.shape):
        rho = np.exp(lp[idx] - old[idx])
        r = np.exp(float(old[idx]) - float(behav[idx]))
        c = 1.0 if cap is None else min(r, cap)
        if band is not None and not band[0] <= r <= band[1]:
            c = 0.0
        out[idx] = -c * min(rho * adv[idx], min(max(rho, 0.7), 6.0) * adv[idx])
    return np_aggregate(out, m, agg)


class BehaviorCorrectionTest(parameterized.TestCase):

    def _data(self):
        lp, old, adv, m = _data(11)
        rng = np.random.default_rng(12)
        behav = (old + rng.normal(0, 0.7, old.shape)).astype(np.float32)
        return lp, old, behav, adv, m

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(agg=AGGS, cap=(None, 2.0), band=(None, (0.5, 2.0)))
    def test_matches_numpy(self, agg, cap, band):
        lp, old, behav, adv, m = self._data()
        cfg = PPOConfig(aggregation=agg, is_cap=cap, is_band=band)
        got = self.variant(lambda *a: ppo_policy_loss(
            *a[:4], cfg, behavior_logprobs=a[4]).loss)(lp, old, adv, m, behav)
        want = np_corrected_policy(lp, old, behav, adv, m, cap, band, agg)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_stats_and_gradient(self):
        """r = π_old/π_behav ∈ {0.4, 1, 1.5, 3}: cap 2 truncates one token, band [0.5, 2]
        masks two; a masked token has zero gradient, a truncated one is scaled by C."""
        r = np.array([[0.4, 1.0, 1.5, 3.0]])
        old = np.zeros((1, 4), np.float32)
        behav = (-np.log(r)).astype(np.float32)
        lp = np.full((1, 4), 0.1, np.float32)
        adv = np.ones((1, 4), np.float32)
        m = np.ones((1, 4), bool)
        cfg = PPOConfig(aggregation=Aggregation.TOKEN_MEAN, is_cap=2.0, is_band=(0.5, 2.0))

        def run(x):
            parts = ppo_policy_loss(x, old, adv, m, cfg, behavior_logprobs=behav)
            return parts.stats, jax.grad(lambda y: ppo_policy_loss(
                y, old, adv, m, cfg, behavior_logprobs=behav).total)(x)

        stats, g = self.variant(run)(lp)
        out = finalize_policy_stats(stats)
        np.testing.assert_allclose(out["behavior_masked_frac"], 0.5)
        np.testing.assert_allclose(out["is_truncated_frac"], 0.25)
        np.testing.assert_allclose(out["behavior_ratio_min"], 0.4, rtol=1e-5)
        np.testing.assert_allclose(out["behavior_ratio_max"], 3.0, rtol=1e-5)
        np.testing.assert_allclose(out["is_weight_mean"], (0 + 1 + 1.5 + 0) / 4, rtol=1e-5)
        rho = np.exp(0.1)
        np.testing.assert_allclose(g, [[0.0, -rho, -1.5 * rho, 0.0]], rtol=1e-5)

    def test_without_correction_is_unchanged(self):
        """No option set: the behaviour log-probs are ignored, the loss is the plain Eq. 14."""
        lp, old, behav, adv, m = self._data()
        plain = ppo_policy_loss(lp, old, adv, m, PPOConfig())
        given = ppo_policy_loss(lp, old, adv, m, PPOConfig(), behavior_logprobs=behav)
        self.assertEqual(float(plain.loss), float(given.loss))
        self.assertNotIn("is_weight_sum", given.stats)

    def test_identical_policies_change_nothing(self):
        """π_behav = π_old (synchronous, exact numerics): the correction is the identity."""
        lp, old, _, adv, m = self._data()
        plain = ppo_policy_loss(lp, old, adv, m, PPOConfig())
        cfg = PPOConfig(is_cap=2.0, is_band=(0.5, 2.0))
        got = ppo_policy_loss(lp, old, adv, m, cfg, behavior_logprobs=old)
        np.testing.assert_allclose(got.loss, plain.loss, rtol=1e-6)

    def test_errors(self):
        lp, old, _, adv, m = self._data()
        with self.assertRaisesRegex(LossConfigError, "behavior_logprobs"):
            ppo_policy_loss(lp, old, adv, m, PPOConfig(is_cap=2.0))
        with self.assertRaisesRegex(SettingError, "is_cap"):
            PPOConfig(is_cap=0.5)
        with self.assertRaisesRegex(SettingError, "is_band"):
            PPOConfig(is_band=(1.5, 2.0))
