"""TB-GAE against an independent float64 double-sum (Eq. 10), with and without jit."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from terminal_rsi.credit import (
    Carry,
    bootstrap_carry,
    gae,
    tb_gae,
    tb_gae_checked,
    validate_tb_gae_inputs,
)
from terminal_rsi.credit.reference import tb_gae_double_sum, textbook_gae
from tests.credit.helpers import random_interaction

METHODS = ("scan", "associative", "blocked", "fused")
SEQUENTIAL = ("scan", "fused")  # same float operations unsplit and chunked: bit-exact
CLOCKS = ((0.9, 0.8), (1.0, 1.0), (0.0, 0.5), (0.7, 0.0))


def _tb(method):
    def f(r, v, t, g, d, gamma, lam, carry):
        return tb_gae(r, v, t, g, d, gamma_turn=gamma, lambda_turn=lam, carry=carry, method=method)
    return f


def _gae(method):
    def f(r, v, g, d, gamma, lam, carry):
        return gae(r, v, g, d, gamma=gamma, lam=lam, carry=carry, method=method)
    return f


# One function object per (estimator, method): jit caches compiled code across tests by
# function identity, and gamma/lam are traced arguments, so each shape compiles once.
_FNS = {(name, m): make(m) for name, make in (("tb", _tb), ("gae", _gae)) for m in METHODS}


def _run(variant, method, gamma, lam, *arrays, carry=None, fn=tb_gae):
    f = _FNS[("tb" if fn is tb_gae else "gae", method)]
    dtype = jnp.result_type(arrays[1])
    return variant(f)(*arrays, jnp.asarray(gamma, dtype), jnp.asarray(lam, dtype), carry)


def _as(dtype, *arrays):
    return [jnp.asarray(a, dtype) if np.asarray(a).dtype.kind == "f" else jnp.asarray(a)
            for a in arrays]


class TbGaeReferenceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(method=METHODS, clock=CLOCKS, seed=(0,))
    def test_matches_double_sum_float32(self, method, clock, seed):
        rng = np.random.default_rng(seed)
        r, v, t, g, d = random_interaction(rng, 3, 32)
        adv, ret, _ = _run(self.variant, method, *clock, *_as(jnp.float32, r, v, t, g, d))
        ref_adv, ref_ret = tb_gae_double_sum(r, v, t, g, d, *clock)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
        self.assertTrue(np.all(np.asarray(adv)[~g] == 0) and np.all(np.asarray(ret)[~g] == 0))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(method=METHODS, clock=CLOCKS)
    def test_matches_double_sum_float64(self, method, clock):
        rng = np.random.default_rng(7)
        r, v, t, g, d = random_interaction(rng, 3, 32)
        with jax.enable_x64(True):
            adv, ret, _ = _run(self.variant, method, *clock, *_as(jnp.float64, r, v, t, g, d))
            self.assertEqual(adv.dtype, jnp.float64)
        ref_adv, ref_ret = tb_gae_double_sum(r, v, t, g, d, *clock)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ret, ref_ret, rtol=1e-12, atol=1e-12)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*METHODS)
    def test_random_clock_values_and_carry(self, method):
        rng = np.random.default_rng(3)
        for _ in range(3):
            gamma, lam = rng.uniform(0, 1, size=2)
            r, v, t, g, d = random_interaction(rng, 3, 32, p_done=0.3)
            carry = (rng.normal(size=3), rng.normal(size=3), np.array([99, 0, 7]),
                     np.array([True, True, False]))
            c = Carry(*_as(jnp.float32, *carry))
            adv, _, _ = _run(self.variant, method, gamma, lam, *_as(jnp.float32, r, v, t, g, d),
                             carry=c)
            ref, _ = tb_gae_double_sum(r, v, t, g, d, gamma, lam, carry=carry)
            np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-5)


class TbGaeInvarianceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(method=METHODS, seed=(0, 1, 2))
    def test_observation_insertion_invariance(self, method, seed):
        rng = np.random.default_rng(seed)
        r, v, t, g, d = random_interaction(rng, 3, 32)
        arrays = _as(jnp.float32, r, v, t, g, d)
        base_adv, base_ret, _ = _run(self.variant, method, 0.9, 0.7, *arrays)
        # Insert observation positions (zero reward, junk values, any turn id) at random places.
        L = r.shape[1]
        slots = np.sort(rng.integers(0, L + 1, size=17))
        idx = np.insert(np.arange(L), slots, -1)
        def widen(x, fill):
            out = np.where(idx[None, :] >= 0, x[:, np.maximum(idx, 0)], fill)
            return out
        r2 = widen(r, 0.0)
        shape = (r.shape[0], len(idx))
        v2 = np.where(idx[None, :] >= 0, v[:, np.maximum(idx, 0)], rng.normal(size=shape))
        t2 = np.where(idx[None, :] >= 0, t[:, np.maximum(idx, 0)], rng.integers(0, 9, shape))
        g2, d2 = widen(g, False), widen(d, False)
        adv2, ret2, _ = _run(self.variant, method, 0.9, 0.7, *_as(jnp.float32, r2, v2, t2, g2, d2))
        keep = idx >= 0
        # Bit-identical for the sequential methods; the parallel ones regroup float sums.
        check = (np.testing.assert_array_equal if method in SEQUENTIAL else
                 functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-6))
        check(np.asarray(adv2)[:, keep], np.asarray(base_adv))
        check(np.asarray(ret2)[:, keep], np.asarray(base_ret))
        self.assertTrue(np.all(np.asarray(adv2)[:, ~keep] == 0))

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*METHODS)
    def test_chunk_continuation_at_every_split(self, method):
        rng = np.random.default_rng(11)
        r, v, t, g, d = random_interaction(rng, 3, 32, p_done=0.5)
        arrays = _as(jnp.float32, r, v, t, g, d)
        full_adv, full_ret, full_carry = _run(self.variant, method, 0.8, 0.6, *arrays)
        L = r.shape[1]
        for b in range(1, L):
            # Chunks are padded to L with non-generated positions (which the recursion passes
            # through), so every split runs at one compiled shape; test_three_chunks runs
            # unpadded chunks of different lengths.
            head = [jnp.pad(x[:, :b], ((0, 0), (L - b, 0))) for x in arrays]
            tail = [jnp.pad(x[:, b:], ((0, 0), (0, b))) for x in arrays]
            adv_t, ret_t, carry_t = _run(self.variant, method, 0.8, 0.6, *tail)
            adv_h, ret_h, carry_h = _run(self.variant, method, 0.8, 0.6, *head, carry=carry_t)
            adv = np.concatenate([adv_h[:, L - b:], adv_t[:, :L - b]], axis=1)
            ret = np.concatenate([ret_h[:, L - b:], ret_t[:, :L - b]], axis=1)
            if method in SEQUENTIAL:
                np.testing.assert_array_equal(adv, full_adv, err_msg=f"split at {b}")
                np.testing.assert_array_equal(ret, full_ret, err_msg=f"split at {b}")
            else:
                np.testing.assert_allclose(adv, full_adv, rtol=1e-6, atol=1e-6)
                np.testing.assert_allclose(ret, full_ret, rtol=1e-6, atol=1e-6)
            for a, c in zip(carry_h, full_carry, strict=True):
                if method in SEQUENTIAL:
                    np.testing.assert_array_equal(a, c)
                else:
                    np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*METHODS)
    def test_three_chunks(self, method):
        rng = np.random.default_rng(5)
        r, v, t, g, d = random_interaction(rng, 3, 32)
        arrays = _as(jnp.float32, r, v, t, g, d)
        full_adv, _, _ = _run(self.variant, method, 0.95, 0.9, *arrays)
        carry, parts = None, []
        for lo, hi in ((25, 32), (9, 25), (0, 9)):
            adv, _, carry = _run(self.variant, method, 0.95, 0.9, *[x[:, lo:hi] for x in arrays],
                                 carry=carry)
            parts.insert(0, adv)
        if method in SEQUENTIAL:  # unpadded chunks: three more compiled shapes, same bits
            np.testing.assert_array_equal(np.concatenate(parts, 1), full_adv)
        else:
            np.testing.assert_allclose(np.concatenate(parts, 1), full_adv, rtol=1e-6, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*METHODS)
    def test_zeroed_trace_negative_control_eq12(self, method):
        """Resetting the carried trace at a split b changes A_j by exactly W_{j,b+1} A_{b+1}."""
        rng = np.random.default_rng(2)
        gamma, lam = 0.9, 0.6
        r, v, t, g, d = random_interaction(rng, 3, 32, p_done=0.0)
        arrays = _as(jnp.float32, r, v, t, g, d)
        full_adv, _, _ = _run(self.variant, method, gamma, lam, *arrays)
        u = np.flatnonzero(g[0])
        split = u[len(u) // 2]  # the first generated position of the tail chunk: b+1
        _, _, carry = _run(self.variant, method, gamma, lam, *[x[:, split:] for x in arrays])
        cut = carry._replace(advantage=jnp.zeros_like(carry.advantage))
        cut_adv, _, _ = _run(self.variant, method, gamma, lam, *[x[:, :split] for x in arrays],
                             carry=cut)
        # W_{j, b+1} over the generated chain before the split.
        head = u[u < split]
        w = np.where(np.append(t[0, head[1:]], t[0, split]) == t[0, head], 1.0, gamma * lam)
        expected = np.zeros(split)
        for i, j in enumerate(head):
            expected[j] = np.prod(w[i:]) * full_adv[0, split]
        np.testing.assert_allclose(np.asarray(full_adv)[0, :split] - np.asarray(cut_adv)[0],
                                   expected, rtol=1e-5, atol=1e-6)
        self.assertGreater(np.abs(expected).max(), 1e-3)


class TbGaeClosedFormTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(method=METHODS, gamma=(0.9, 1.0), lam=(0.95, 1.0), done=(True, False))
    def test_unit_clock_equals_textbook_gae(self, method, gamma, lam, done):
        rng = np.random.default_rng(4)
        L = 20
        r, v = rng.normal(size=(1, L)), rng.normal(size=(1, L))
        g = np.ones((1, L), bool)
        d = np.zeros((1, L), bool)
        d[0, -1] = done
        expected = textbook_gae(r[0], v[0], d[0], gamma, lam)
        adv, ret, _ = _run(self.variant, method, gamma, lam, *_as(jnp.float32, r, v, g, d), fn=gae)
        np.testing.assert_allclose(adv[0], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret[0], expected + v[0], rtol=1e-5, atol=1e-5)
        # Same as TB-GAE with every token its own turn.
        t = np.arange(L)[None].astype(np.int32)
        adv_tb, _, _ = _run(self.variant, method, gamma, lam, *_as(jnp.float32, r, v, t, g, d))
        np.testing.assert_allclose(adv, adv_tb, rtol=1e-6, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*METHODS)
    def test_unit_clock_with_bootstrap_value(self, method):
        rng = np.random.default_rng(9)
        r, v = rng.normal(size=(1, 12)), rng.normal(size=(1, 12))
        g, d = np.ones((1, 12), bool), np.zeros((1, 12), bool)
        expected = textbook_gae(r[0], v[0], d[0], 0.9, 0.8, last_value=1.7)
        carry = bootstrap_carry(jnp.array([1.7], jnp.float32), jnp.array([-5]))
        adv, _, _ = _run(self.variant, method, 0.9, 0.8, *_as(jnp.float32, r, v, g, d), carry=carry,
                         fn=gae)
        np.testing.assert_allclose(adv[0], expected, rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(method=METHODS, gamma=(0.0, 0.6, 1.0), lam=(0.0, 0.5, 1.0))
    def test_eq11_turn_reward_at_last_token(self, method, gamma, lam):
        """One reward at each turn's last generated token: A_j = U_t - v_j, Ĝ_j = U_t."""
        rng = np.random.default_rng(1)
        # turns of lengths 3, 4, 2 with observations between; terminated at the end.
        layout = [(0, 3), (None, 2), (1, 4), (None, 3), (2, 2)]
        t, g = [], []
        for turn, n in layout:
            t += [turn if turn is not None else -1] * n
            g += [turn is not None] * n
        t, g = np.array([t]), np.array([g])
        L = g.shape[1]
        v = rng.normal(size=(1, L))
        r = np.zeros((1, L))
        d = np.zeros((1, L), bool)
        u = np.flatnonzero(g[0])
        last = [u[t[0, u] == k][-1] for k in range(3)]
        first = [u[t[0, u] == k][0] for k in range(3)]
        r[0, last] = rng.normal(size=3)
        d[0, last[-1]] = True
        adv, ret, _ = _run(self.variant, method, gamma, lam, *_as(jnp.float32, r, v, t, g, d))
        # U_t from the top (Eq. 11), computed turn by turn backwards.
        A_next, U = 0.0, {}
        for k in reversed(range(3)):
            cont = 0.0 if k == 2 else gamma * (v[0, first[k + 1]] + lam * A_next)
            U[k] = r[0, last[k]] + cont
            A_next = U[k] - v[0, first[k]]
        for j in u:
            self.assertAlmostEqual(float(adv[0, j]), U[t[0, j]] - v[0, j], places=5)
            self.assertAlmostEqual(float(ret[0, j]), U[t[0, j]], places=5)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*METHODS)
    def test_undiscounted_complete_episode(self, method):
        """γ = λ = 1 on a complete episode: A_j = Σ_{q≥j} r̃_q - v_j."""
        rng = np.random.default_rng(6)
        r, v, t, g, d = random_interaction(rng, 3, 32, p_done=1.0)
        adv, _, _ = _run(self.variant, method, 1.0, 1.0, *_as(jnp.float32, r, v, t, g, d))
        for b in range(3):
            u = np.flatnonzero(g[b])
            expected = np.cumsum(r[b, u][::-1])[::-1] - v[b, u]
            np.testing.assert_allclose(np.asarray(adv)[b, u], expected, rtol=1e-5, atol=1e-5)


class TbGaeRegressionTest(chex.TestCase):
    def _check(self, variant, r, v, t, g, d, gamma=0.9, lam=0.8):
        ref, _ = tb_gae_double_sum(r, v, t, g, d, gamma, lam)
        outs = []
        for method in METHODS:
            adv, _, _ = _run(variant, method, gamma, lam, *_as(jnp.float32, r, v, t, g, d))
            np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-6)
            outs.append(np.asarray(adv))
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
        return outs[0]

    @chex.variants(with_jit=True, without_jit=True)
    def test_reward_on_last_generated_token_before_observation(self):
        g = np.array([[0, 1, 1, 0, 0, 0, 1, 1, 0]], bool)
        t = np.array([[0, 0, 0, 0, 0, 0, 1, 1, 1]])
        r = np.zeros((1, 9))
        r[0, 2] = 1.0  # last generated token of turn 0, right before the observation span
        v = np.zeros((1, 9))
        d = np.zeros((1, 9), bool)
        d[0, 7] = True
        adv = self._check(self.variant, r, v, t, g, d)
        self.assertAlmostEqual(float(adv[0, 2]), 1.0, places=6)
        self.assertAlmostEqual(float(adv[0, 1]), 1.0, places=6)  # same turn: (1, 1) clock
        self.assertEqual(float(adv[0, 6]), 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gamma_turn_zero_isolates_turns(self):
        rng = np.random.default_rng(0)
        r, v, t, g, d = random_interaction(rng, 3, 32)
        adv = self._check(self.variant, r, v, t, g, d, gamma=0.0, lam=0.9)
        # With γ_turn = 0 each turn's advantages depend only on that turn's own rewards/values.
        r2 = r.copy()
        last_turn = t[0][g[0]].max()
        r2[0, (t[0] == last_turn) & g[0]] += 5.0
        adv2 = self._check(self.variant, r2, v, t, g, d, gamma=0.0, lam=0.9)
        earlier = g[0] & (t[0] < last_turn)
        np.testing.assert_array_equal(adv[0, earlier], adv2[0, earlier])

    @chex.variants(with_jit=True, without_jit=True)
    def test_observation_span_inside_turn_and_padding_both_ends(self):
        #            pad  prompt  gen gen obs obs gen | obs | gen gen  pad pad
        g = np.array([[0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0]], bool)
        t = np.array([[0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])
        rng = np.random.default_rng(1)
        v = rng.normal(size=(1, 12))
        r = np.zeros((1, 12))
        r[0, 9] = 1.0
        d = np.zeros((1, 12), bool)
        d[0, 9] = True
        adv = self._check(self.variant, r, v, t, g, d)
        self.assertTrue(np.all(adv[0, ~g[0]] == 0))

    @chex.variants(with_jit=True, without_jit=True)
    def test_row_without_generated_tokens(self):
        g = np.zeros((2, 6), bool)
        g[1, 2:4] = True
        r = np.zeros((2, 6))
        r[1, 3] = 1.0
        v = np.ones((2, 6))
        t = np.zeros((2, 6), np.int32)
        d = np.zeros((2, 6), bool)
        for method in METHODS:
            carry_in = bootstrap_carry(jnp.array([2.0, 2.0]), jnp.array([4, 4]))
            adv, ret, carry = _run(self.variant, method, 0.9, 0.8,
                                   *_as(jnp.float32, r, v, t, g, d), carry=carry_in)
            self.assertTrue(np.all(np.asarray(adv)[0] == 0) and np.all(np.asarray(ret)[0] == 0))
            # A row with nothing generated passes its carry through unchanged.
            self.assertEqual(float(carry.value[0]), 2.0)
            self.assertEqual(int(carry.turn_id[0]), 4)
            self.assertTrue(bool(carry.exists[0]))
            self.assertEqual(int(carry.turn_id[1]), 0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_truncation_bootstraps_instead_of_zero(self):
        g = np.array([[1, 1, 0, 1]], bool)
        t = np.array([[0, 0, 0, 1]])
        r, v, d = np.zeros((1, 4)), np.zeros((1, 4)), np.zeros((1, 4), bool)
        for method in METHODS:
            adv_zero, _, _ = _run(self.variant, method, 0.9, 0.8, *_as(jnp.float32, r, v, t, g, d))
            boot = bootstrap_carry(jnp.array([10.0]), jnp.array([2]))
            adv_boot, _, _ = _run(self.variant, method, 0.9, 0.8, *_as(jnp.float32, r, v, t, g, d),
                                  carry=boot)
            self.assertEqual(float(adv_zero[0, 3]), 0.0)
            self.assertAlmostEqual(float(adv_boot[0, 3]), 9.0, places=5)  # γ_turn · V_boot


class TbGaeApiTest(chex.TestCase):
    def test_vmap_over_rows(self):
        rng = np.random.default_rng(0)
        r, v, t, g, d = _as(jnp.float32, *random_interaction(rng, 3, 32))
        for method in METHODS:
            f = functools.partial(tb_gae, gamma_turn=0.9, lambda_turn=0.7, method=method)
            batched, _, _ = jax.jit(f)(r, v, t, g, d)
            mapped = jax.vmap(lambda *a: f(*(x[None] for x in a))[0][0])(r, v, t, g, d)
            np.testing.assert_allclose(mapped, batched, rtol=1e-6, atol=1e-6)

    def test_gamma_as_traced_argument(self):
        rng = np.random.default_rng(0)
        r, v, t, g, d = _as(jnp.float32, *random_interaction(rng, 3, 32))
        f = jax.jit(lambda gm, lm: tb_gae(r, v, t, g, d, gamma_turn=gm, lambda_turn=lm)[0])
        np.testing.assert_allclose(
            f(0.5, 0.5), tb_gae(r, v, t, g, d, gamma_turn=0.5, lambda_turn=0.5)[0], rtol=1e-6
        )

    def test_validation_names_row_and_position(self):
        g = np.array([[True, False, True], [True, True, False]])
        r = np.zeros((2, 3))
        r[1, 2] = 0.5
        with pytest.raises(ValueError, match=r"row 1, position 2: reward 0.5"):
            validate_tb_gae_inputs(r, g)
        with pytest.raises(ValueError, match=r"row 1, position 2"):
            tb_gae_checked(r, np.zeros((2, 3)), np.zeros((2, 3), np.int32), g,
                           np.zeros((2, 3), bool), gamma_turn=1.0, lambda_turn=1.0)
        d = np.zeros((2, 3), bool)
        d[0, 1] = True
        with pytest.raises(ValueError, match=r"row 0, position 1: done flag"):
            validate_tb_gae_inputs(np.zeros((2, 3)), g, d)
        with pytest.raises(ValueError, match="not finite"):
            validate_tb_gae_inputs(np.array([[np.nan, 0, 0]]), g[:1])

    def test_bad_method_and_shapes(self):
        x = jnp.zeros((2, 3))
        m = jnp.ones((2, 3), bool)
        t = jnp.zeros((2, 3), jnp.int32)
        with pytest.raises(ValueError, match="method"):
            tb_gae(x, x, t, m, m, gamma_turn=1.0, lambda_turn=1.0, method="loop")
        with pytest.raises(AssertionError):
            tb_gae(x, jnp.zeros((2, 4)), t, m, m, gamma_turn=1.0, lambda_turn=1.0)
