"""The default TB-GAE method, "fused" (one sequential pass per group of at most 8 rows).

Row counts that need one group, several groups, and groups with padding rows; exact
(np.array_equal) chunk continuation over unpadded chunks of different lengths, with dones,
carries and truncation; and equality with `scan`, which performs the same float operations.
test_tb_gae.py runs "fused" through every other check as well.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from terminal_rsi.credit import Carry, bootstrap_carry, gae, tb_gae
from terminal_rsi.credit.reference import tb_gae_double_sum
from tests.credit.helpers import random_interaction


def _tb(r, v, t, g, d, gamma, lam, carry, method="fused"):
    return tb_gae(r, v, t, g, d, gamma_turn=gamma, lambda_turn=lam, carry=carry, method=method)


_TB = {m: functools.partial(_tb, method=m) for m in ("fused", "scan")}  # jit caches by identity


def _f32(*arrays):
    return [jnp.asarray(a, jnp.float32) if np.asarray(a).dtype.kind == "f" else jnp.asarray(a)
            for a in arrays]


def _random_carry(rng, batch):
    """Successor states with some rows "nothing follows" (and junk in their other fields)."""
    return (rng.normal(size=batch), rng.normal(size=batch), rng.integers(-1, 6, size=batch),
            rng.random(batch) < 0.7)


class FusedReferenceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(1, 5, 8, 9, 13, 17)  # one group, several, with padding rows
    def test_matches_double_sum_and_scan(self, batch):
        rng = np.random.default_rng(batch)
        gamma, lam = rng.uniform(0.3, 1.0, size=2)
        r, v, t, g, d = random_interaction(rng, batch, 24, p_done=0.4)
        carry = _random_carry(rng, batch)
        arrays = _f32(r, v, t, g, d)
        c = Carry(*_f32(*carry))
        gl = (jnp.float32(gamma), jnp.float32(lam))
        adv, ret, carry_out = self.variant(_TB["fused"])(*arrays, *gl, c)
        ref_adv, ref_ret = tb_gae_double_sum(r, v, t, g, d, gamma, lam, carry=carry)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
        self.assertTrue(np.all(np.asarray(adv)[~g] == 0) and np.all(np.asarray(ret)[~g] == 0))
        # Same float operations as the sequential scan, compiled the same way: same bits.
        scan = self.variant(_TB["scan"])(*arrays, *gl, c)
        for a, b in zip(jax.tree.leaves((adv, ret, carry_out)), jax.tree.leaves(scan), strict=True):
            np.testing.assert_array_equal(a, b)

    def test_matches_double_sum_float64(self):
        rng = np.random.default_rng(3)
        r, v, t, g, d = random_interaction(rng, 10, 24, p_done=0.4)
        carry = _random_carry(rng, 10)
        with jax.enable_x64(True):
            arrays = [jnp.asarray(a, jnp.float64) if np.asarray(a).dtype.kind == "f" else
                      jnp.asarray(a) for a in (r, v, t, g, d)]
            c = Carry(*(jnp.asarray(x, jnp.float64) if np.asarray(x).dtype.kind == "f" else
                        jnp.asarray(x) for x in carry))
            adv, _, _ = tb_gae(*arrays, gamma_turn=0.9, lambda_turn=0.7, carry=c)
            self.assertEqual(adv.dtype, jnp.float64)
        ref, _ = tb_gae_double_sum(r, v, t, g, d, 0.9, 0.7, carry=carry)
        np.testing.assert_allclose(adv, ref, rtol=1e-12, atol=1e-12)

    def test_default_method_is_fused(self):
        rng = np.random.default_rng(0)
        arrays = _f32(*random_interaction(rng, 3, 16))
        default = tb_gae(*arrays, gamma_turn=0.9, lambda_turn=0.8)
        fused = tb_gae(*arrays, gamma_turn=0.9, lambda_turn=0.8, method="fused")
        for a, b in zip(jax.tree.leaves(default), jax.tree.leaves(fused), strict=True):
            np.testing.assert_array_equal(a, b)
        r, v, _, g, d = arrays
        np.testing.assert_array_equal(gae(r, v, g, d, gamma=0.9, lam=0.8)[0],
                                      gae(r, v, g, d, gamma=0.9, lam=0.8, method="fused")[0])

    def test_row_without_generated_tokens_passes_carry_through(self):
        rng = np.random.default_rng(1)
        r, v, t, g, d = random_interaction(rng, 10, 12)
        g[[0, 9]] = False  # one such row in each group
        r[[0, 9]] = 0.0
        d[[0, 9]] = False
        carry = Carry(*_f32(rng.normal(size=10), rng.normal(size=10), np.arange(10),
                            np.arange(10) % 2 == 0))
        adv, _, carry_out = tb_gae(*_f32(r, v, t, g, d), gamma_turn=0.9, lambda_turn=0.8,
                                   carry=carry)
        for row in (0, 9):
            self.assertTrue(np.all(np.asarray(adv)[row] == 0))
            for a, b in zip(carry_out, carry, strict=True):
                self.assertEqual(np.asarray(a)[row], np.asarray(b)[row])


    @parameterized.parameters((jnp.float32, 8), (jnp.float32, 20), (jnp.float64, 8))
    def test_loop_takes_xla_cpu_small_loop_path(self, dtype, batch):
        """The speed of "fused" rests on XLA:CPU compiling its loop into one native loop."""
        if jax.default_backend() != "cpu":
            pytest.skip("XLA:CPU only")
        with jax.enable_x64(dtype == jnp.float64):
            x = jnp.zeros((batch, 16), dtype)
            t = jnp.zeros((batch, 16), jnp.int32)
            m = jnp.zeros((batch, 16), bool)
            f = jax.jit(functools.partial(tb_gae, gamma_turn=0.9, lambda_turn=0.8))
            text = f.lower(x, x, t, m, m).compile().as_text()
        self.assertIn("xla_cpu_small_call", text, "the per-position loop is dispatched op by op "
                      "(several times slower): its step grew past XLA's small-loop limit, or "
                      "XLA changed how it marks such loops")


class FusedChunkContinuationTest(chex.TestCase):
    """Chunks of different lengths, run last to first, reproduce the unsplit run bit for bit."""

    def _chunked(self, fn, arrays, bounds, carry=None):
        parts_adv, parts_ret = [], []
        for lo, hi in reversed(bounds):
            adv, ret, carry = fn(*[x[:, lo:hi] for x in arrays], carry)
            parts_adv.insert(0, np.asarray(adv))
            parts_ret.insert(0, np.asarray(ret))
        return np.concatenate(parts_adv, 1), np.concatenate(parts_ret, 1), carry

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 2)
    def test_random_splits_tb_gae(self, seed):
        rng = np.random.default_rng(seed)
        batch, length = 11, 40  # two groups of 6 rows, one padding row
        r, v, t, g, d = random_interaction(rng, batch, length, p_done=0.5)
        arrays = _f32(r, v, t, g, d)
        gamma, lam = (jnp.float32(x) for x in rng.uniform(0.2, 1.0, size=2))
        tail = bootstrap_carry(jnp.asarray(rng.normal(size=batch), jnp.float32),
                               jnp.asarray(rng.integers(0, 9, size=batch)))
        fn = self.variant(lambda *a: _TB["fused"](*a[:5], gamma, lam, a[5]))
        full_adv, full_ret, full_carry = fn(*arrays, tail)
        cuts = np.sort(rng.choice(np.arange(1, length), size=3, replace=False))
        bounds = list(zip(np.r_[0, cuts], np.r_[cuts, length], strict=True))
        adv, ret, carry = self._chunked(fn, arrays, bounds, tail)
        np.testing.assert_array_equal(adv, full_adv)
        np.testing.assert_array_equal(ret, full_ret)
        for a, b in zip(carry, full_carry, strict=True):
            np.testing.assert_array_equal(a, b)
        # ... and the truncated row bootstraps from the critic's value (double-sum reference).
        boot = (np.asarray(tail.value), np.zeros(batch), np.asarray(tail.turn_id),
                np.ones(batch, bool))
        ref, _ = tb_gae_double_sum(r, v, t, g, d, float(gamma), float(lam), carry=boot)
        np.testing.assert_allclose(full_adv, ref, rtol=1e-5, atol=1e-5)

    def test_constants_baked_in_and_gae(self):
        """γ, λ as compile-time constants (a caller's own jit) and the unit clock of `gae`."""
        rng = np.random.default_rng(4)
        r, v, t, g, d = random_interaction(rng, 3, 30, p_done=0.5)
        arrays = _f32(r, v, t, g, d)
        bounds = [(0, 7), (7, 19), (19, 30)]
        tb = jax.jit(lambda r, v, t, g, d, c: tb_gae(r, v, t, g, d, gamma_turn=0.95,
                                                     lambda_turn=0.9, carry=c))
        per_token = jax.jit(lambda r, v, t, g, d, c: gae(r, v, g, d, gamma=0.95, lam=0.9,
                                                         carry=c))
        for fn in (tb, per_token):
            full_adv, full_ret, _ = fn(*arrays, None)
            adv, ret, _ = self._chunked(fn, arrays, bounds)
            np.testing.assert_array_equal(adv, full_adv)
            np.testing.assert_array_equal(ret, full_ret)
        ref, _ = tb_gae_double_sum(r, v, None, g, d, 0.95, 0.9, unit_clock=True)
        np.testing.assert_allclose(full_adv, ref, rtol=1e-5, atol=1e-5)
